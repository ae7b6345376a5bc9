"""A custom task (your own data) on the command line: the flags that describe its columns, shared by `train` and
`search`, and the `custom_task` fields they make (autopelt.data.custom_task, TrialSettings.custom_task)."""

from __future__ import annotations

from autopelt.errors import UserError


def add_custom_task_arguments(parser) -> None:
    own = parser.add_argument_group("your own data (with --task NAME and --data-dir DIR holding DIR/NAME/train.jsonl …)")
    own.add_argument("--text-columns", help="one or two text columns, comma-separated (e.g. premise,hypothesis)")
    own.add_argument("--label-column", default="label")
    own.add_argument("--num-labels", type=int, help="number of classes (classification)")
    own.add_argument("--label-names", help="class names in id order, comma-separated, for text labels (neg,pos)")
    own.add_argument("--regression", action="store_true", help="a real-valued label (metric: Pearson)")
    own.add_argument("--input-column", help="text generation: the input text column (E2E: mr), with --target-column")
    own.add_argument("--target-column", help="text generation: the target text column (E2E: ref); a decoder or T5 "
                                             "learns input -> target, scored by BLEU and ROUGE-L")


def custom_task_fields(args) -> dict | None:
    """The `custom_task` fields the flags describe, or None for a GLUE task."""
    if getattr(args, "input_column", None) or getattr(args, "target_column", None):
        if not (args.input_column and args.target_column) or args.text_columns:
            raise UserError("a generation task takes --input-column and --target-column together, without "
                            "--text-columns")
        return {"input_column": args.input_column, "target_column": args.target_column}
    if not args.text_columns:
        if args.num_labels or args.regression or args.label_names:
            raise UserError("--num-labels/--label-names/--regression describe your own data: add --text-columns too")
        return None
    fields = {"text_columns": [c.strip() for c in args.text_columns.split(",")], "label_column": args.label_column}
    if args.regression:
        return {**fields, "regression": True}
    names = [n.strip() for n in args.label_names.split(",")] if args.label_names else None
    return {**fields, "num_labels": args.num_labels, "label_names": names}

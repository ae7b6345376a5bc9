"""A custom task (your own data) on the command line: the flags that describe its files and columns, shared by
`train` and `search`, and the `custom_task` fields they make (autopelt.data.custom_task, TrialSettings.custom_task)."""

from __future__ import annotations

from pathlib import Path

from autopelt.errors import UserError


def add_custom_task_arguments(parser) -> None:
    own = parser.add_argument_group(
        "your own data: --train-file and --validation-file (columns and labels read from the train file), or "
        "--task NAME with --data-dir DIR holding DIR/NAME/train.jsonl …")
    own.add_argument("--train-file", help="training rows: .csv, .jsonl or .parquet (a dev part is carved from it)")
    own.add_argument("--validation-file", help="held-out rows with labels, the test set (never used to select)")
    own.add_argument("--text-columns", help="one or two text columns, comma-separated (e.g. premise,hypothesis); "
                                            "with --train-file: inferred when unambiguous")
    own.add_argument("--label-column", default="label")
    own.add_argument("--num-labels", type=int, help="number of classes (classification)")
    own.add_argument("--label-names", help="class names in id order, comma-separated, for text labels (neg,pos); "
                                           "with --train-file: its distinct labels, sorted")
    own.add_argument("--regression", action="store_true", help="a real-valued label (metric: Pearson)")
    own.add_argument("--input-column", help="text generation: the input text column (E2E: mr), with --target-column")
    own.add_argument("--target-column", help="text generation: the target text column (E2E: ref); a decoder or T5 "
                                             "learns input -> target, scored by BLEU and ROUGE-L")


def task_name(args) -> str:
    """The task's name: --task, else (with --train-file) the train file's name, or its folder's for train.*."""
    if args.task:
        return args.task
    if not args.train_file:
        raise UserError("give --task (a GLUE task, or your own with --data-dir) or --train-file/--validation-file")
    path = Path(args.train_file)
    return path.resolve().parent.name if path.stem == "train" else path.stem


def custom_task_fields(args) -> dict | None:
    """The `custom_task` fields the flags describe, or None for a GLUE task. Reads the train file, if given."""
    if getattr(args, "input_column", None) or getattr(args, "target_column", None):
        if not (args.input_column and args.target_column) or args.text_columns:
            raise UserError("a generation task takes --input-column and --target-column together, without "
                            "--text-columns")
        return {"input_column": args.input_column, "target_column": args.target_column}
    given = {
        "text_columns": [c.strip() for c in args.text_columns.split(",")] if args.text_columns else None,
        "label_column": args.label_column, "num_labels": args.num_labels, "regression": args.regression,
        "label_names": [n.strip() for n in args.label_names.split(",")] if args.label_names else None,
    }
    if args.train_file or args.validation_file:
        return _from_files(args, given)
    if not args.text_columns:
        if args.num_labels or args.regression or args.label_names:
            raise UserError("--num-labels/--label-names/--regression describe your own data: add --text-columns too")
        return None
    fields = {"text_columns": given["text_columns"], "label_column": args.label_column}
    if args.regression:
        return {**fields, "regression": True}
    return {**fields, "num_labels": args.num_labels, "label_names": given["label_names"]}


def _from_files(args, given: dict) -> dict:
    from autopelt.data.own_files import task_from_files

    if not (args.train_file and args.validation_file):
        raise UserError("--train-file and --validation-file go together (the validation file is the test set)")
    return task_from_files(task_name(args), args.train_file, args.validation_file, given)

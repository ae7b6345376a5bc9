"""`autopelt predict`: labels or scores from an exported delta."""

from __future__ import annotations


def add_arguments(parser) -> None:
    parser.add_argument("--delta", required=True, help="an export folder (or a trial's delta folder)")
    parser.add_argument("--model", help="base model folder or hub id (default: the one the delta was trained on)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", help="the text to classify")
    source.add_argument("--input", help="a JSONL file with the task's text columns, one row a line")
    parser.add_argument("--text-pair", help="the second text, for pair tasks (RTE, MRPC, …)")


def run(args) -> int:
    import json

    from autopelt.errors import UserError
    from autopelt.models import load_tokenizer
    from autopelt.export.predict import load_delta_model, predict, read_rows, text_columns

    model, header = load_delta_model(args.delta, args.model)
    columns = text_columns(header)
    if args.text is not None:
        if len(columns) == 2 and args.text_pair is None:
            raise UserError(f"task {header.get('task')} takes two texts: add --text-pair")
        rows = [dict(zip(columns, (args.text, args.text_pair)))]
    else:
        rows = read_rows(args.input)
    for row, prediction in zip(rows, predict(model, load_tokenizer(header["base_model"]), header, rows)):
        print(json.dumps(prediction) if args.text is None else json.dumps({**row, **prediction}))
    return 0

"""`autopelt predict`: labels or scores from an exported delta."""

from __future__ import annotations


def add_arguments(parser) -> None:
    parser.add_argument("--delta", required=True, help="an export folder (or a trial's delta folder)")
    parser.add_argument("--model", help="base model folder or hub id (default: the one the delta was trained on)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", help="the text to classify")
    source.add_argument("--input", help="a JSONL file with the task's text columns, one row a line")
    parser.add_argument("--text-pair", help="the second text, for pair tasks (RTE, MRPC, …)")
    parser.add_argument("--max-new-tokens", type=int, default=64,
                        help="a generation delta: tokens generated per input, greedily (default 64)")


def run(args) -> int:
    import json

    from autopelt.errors import UserError
    from autopelt.models import load_tokenizer
    from autopelt.export.predict import load_delta_model, predict, read_rows, text_columns

    from autopelt.export.predict_generation import is_generation_delta
    from autopelt.ensemble.folder import is_ensemble

    if is_ensemble(args.delta):  # an `export --ensemble` folder: its members on one backbone load
        import sys

        from autopelt.ensemble.model import EnsembleModel

        model = EnsembleModel(args.delta, args.model)
        header = model.header
        print(f"ensemble of {model.forward_passes} members: {model.forward_passes} forward passes an input, one "
              "backbone load", file=sys.stderr)
    elif is_generation_delta(args.delta):
        return _generate(args)
    else:
        if args.max_new_tokens != 64:
            raise UserError("--max-new-tokens is for a generation delta; this delta classifies")
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


def _generate(args) -> int:
    import json

    from autopelt.errors import UserError
    from autopelt.export.predict import read_rows
    from autopelt.export.predict_generation import generate_for_rows, load_generation_model
    from autopelt.models import load_tokenizer

    if args.max_new_tokens < 1:
        raise UserError(f"--max-new-tokens must be a positive integer, not {args.max_new_tokens}")
    model, header = load_generation_model(args.delta, args.model)
    column = header["generation"]["input_column"]
    rows = [{column: args.text}] if args.text is not None else read_rows(args.input)
    outputs = generate_for_rows(model, load_tokenizer(header["base_model"]), header, rows, args.max_new_tokens)
    for row, output in zip(rows, outputs):
        print(json.dumps({**row, **output}))
    return 0

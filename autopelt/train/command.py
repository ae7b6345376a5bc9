"""`autopelt train`: train and evaluate one delta on a task, with a progress bar and a one-screen summary."""

from __future__ import annotations

import argparse
import dataclasses
import os

from autopelt.data.custom_task_args import add_custom_task_arguments, custom_task_fields, task_name
from autopelt.delta.registry import inner_field, mixable
from autopelt.errors import UserError
from autopelt.train.checks import check_inputs
from autopelt.train.progress import epoch_line, metrics_text as _metrics, with_progress  # noqa: F401 (re-exported)


def _method_fields() -> dict[str, dataclasses.Field]:
    """Every method's fields a flag can set (a wrapper's inner delta is --inner with its own fields' flags)."""
    from autopelt.delta.spec import METHODS

    fields: dict[str, dataclasses.Field] = {}
    for name, cls in METHODS.items():
        for f in dataclasses.fields(cls):
            if f.name != inner_field(name):
                fields.setdefault(f.name, f)
    return fields


def add_arguments(parser) -> None:
    from autopelt.delta.spec import METHODS, POOLINGS

    parser.add_argument("--task", help="GLUE task: cola sst2 mrpc qqp stsb mnli mnli-mm qnli rte wnli; or your own "
                                       "(see below; with --train-file the default is the file's name)")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--delta", metavar="SPEC.json", help="a delta spec file (see `autopelt methods`)")
    what.add_argument("--method", help="one method, with its fields as flags (e.g. --method lora --rank 8)")
    what.add_argument("--preset", help="a preset, e.g. unipelt_apl, lora, adapter, prefix, compacter, bitfit")
    wrappers = [name for name in METHODS if inner_field(name)]
    parser.add_argument("--inner", choices=mixable(), default=mixable()[0],
                        help=f"with --method {' or '.join(wrappers)}: the mixed delta")
    parser.add_argument("--pooling", choices=POOLINGS,
                        help="what the head reads: cls, the first token through the model's pooler, or mean, the "
                             "mean of the last layer's token states (default with --preset or --method: as the "
                             "model was trained to be read, mean for a sentence-transformers checkpoint such as the "
                             "default model, else cls; with --delta: the file's, cls when it names none)")
    fields = parser.add_argument_group("method fields (with --method; see `autopelt methods`)")
    for name in _method_fields():
        fields.add_argument(f"--{name.replace('_', '-')}", dest=f"field_{name}", metavar="VALUE")
    add_custom_task_arguments(parser)
    parser.add_argument("--model", help="base model folder or hub id (default: all-MiniLM-L6-v2)")
    parser.add_argument("--data-dir", default=os.environ.get("AUTOPELT_DATA_DIR"),
                        help="local data: DIR/<task>/<split>.jsonl|csv|parquet (env AUTOPELT_DATA_DIR)")
    parser.add_argument("--k", type=int, help="UniPELT low-resource protocol: K training examples (100/500/1000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-seed", type=int, help="which rows form train and dev (default: --seed); fix it to "
                                                      "compare training seeds on the same rows, as a search does")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--max-steps", type=int, help="train this many optimiser steps instead of --epochs epochs")
    parser.add_argument("--lr", type=float, help="learning rate (default: chosen for this delta, task and budget by a "
                                                 "short sweep of rates on the run's own schedule)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--patience", type=int, help="stop after N evaluations without improvement")
    parser.add_argument("--eval-every", type=int, help="evaluate every N steps (default: every epoch)")
    parser.add_argument("--max-train-examples", type=int, help="train on a random subset (quick runs)")
    parser.add_argument("--threads", type=int, help="CPU threads")
    parser.add_argument("--device", help="cpu, cuda, cuda:1 … (default: CUDA when available)")
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16", "fp16"), default="auto",
                        help="auto (default): bf16 mixed precision where the device computes it natively and "
                             "faster (CUDA with bf16; a CPU with AVX512-BF16 or AMX whose bf16 matmul is measured "
                             "at least 1.25x as fast as fp32's), else fp32")
    parser.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=None,
                        help="recompute the model's activations in the backward pass: less memory, more time "
                             "(default: on for a generation task whose delta can take it, else off)")
    parser.add_argument("--quantize", choices=("4bit",),
                        help="4bit: the frozen base in NF4 on CUDA, LoRA trained over it in bf16 (QLoRA; a decoder "
                             "and plain LoRA; needs bitsandbytes)")
    parser.add_argument("--backbone-dropout", choices=("off", "attention-off", "model"), default="off",
                        help="the frozen model's dropout: off (default: none in the pretrained model; as good or "
                             "better across 12 tasks, and faster), attention-off (none on the attention "
                             "probabilities), model (its config's); docs/speed.md")
    parser.add_argument("--attention", choices=("auto", "sdpa", "eager"), default="auto",
                        help="attention implementation: auto (default: SDPA on CUDA; on a CPU the faster of the two "
                             "for this shape, timed once; $AUTOPELT_ATTENTION overrides), sdpa or eager")
    parser.add_argument("--out", help="folder for result.json and the trained delta")
    parser.add_argument("--max-new-tokens", type=int, help="generation tasks: tokens generated per test input "
                                                           "(default 64)")


def run(args) -> int:
    from autopelt import delta, models
    from autopelt.delta.presets import PRESETS
    from autopelt.train import TrialSettings

    if args.preset:
        if args.preset not in PRESETS:
            raise UserError(f"unknown preset {args.preset!r}; presets: {', '.join(PRESETS)}")
        spec = models.read_as_trained(PRESETS[args.preset], args.model)
    elif args.method:
        spec = models.read_as_trained({"methods": [method_from_flags(args)]}, args.model)
    else:  # a spec file is taken as written: one without "pooling" reads the first token, as every stored spec
        spec = delta.parse_spec(args.delta).to_dict()
    if args.pooling:
        spec = {**spec, "pooling": args.pooling}
    spec = delta.parse_spec(spec).to_dict()  # a bad spec is a one-line error before any loading
    settings = TrialSettings(
        task=task_name(args), spec=spec, custom_task=custom_task_fields(args), model=args.model, data_dir=args.data_dir,
        protocol="full" if args.k is None else args.k, seed=args.seed, data_seed=args.data_seed,
        epochs=args.epochs, max_steps=args.max_steps,
        learning_rate=args.lr, batch_size=args.batch_size, max_length=args.max_length, patience=args.patience,
        eval_every=args.eval_every, max_train_examples=args.max_train_examples, threads=args.threads,
        device=args.device, precision=args.precision, backbone_dropout=args.backbone_dropout,
        gradient_checkpointing=args.gradient_checkpointing, quantize=args.quantize,
        attention=args.attention, out_dir=args.out, max_new_tokens=args.max_new_tokens,
    )
    data = check_inputs(settings)
    if data is not None:
        print(data.line())
        if data.warning():
            print(data.warning())
    from autopelt.train import run_trial  # torch: only once the inputs are sound

    result = with_progress(settings, run_trial)
    print(summary(result))
    return 0 if result["status"] == "ok" else 1


def method_from_flags(args) -> dict:
    given = {name: getattr(args, f"field_{name}") for name in _method_fields()
             if getattr(args, f"field_{name}") is not None}
    from autopelt.delta.spec import METHODS, normalise_method

    name = normalise_method(args.method)
    if name is None:
        from autopelt.delta.spec import parse_method

        parse_method({"method": args.method})  # raises the one-line "unknown method" error
    fields = _method_fields()
    values = {key: _convert(key, text, fields[key]) for key, text in given.items()}
    wrapped = inner_field(name)
    if wrapped:  # the flags its own config lacks are its inner delta's
        own = {f.name for f in dataclasses.fields(METHODS[name])}
        inner = {k: v for k, v in values.items() if k not in own}
        outer = {k: v for k, v in values.items() if k in own}
        return {"method": name, **outer, wrapped: {"method": args.inner, **inner}}
    return {"method": args.method, **values}


def _convert(name: str, text: str, field: dataclasses.Field):
    default = field.default
    if name in ("targets", "layers"):
        items = [t.strip() for t in text.split(",") if t.strip()]
        return [int(t) for t in items] if name == "layers" and all(t.isdigit() for t in items) else items
    if isinstance(default, bool):
        if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
            raise UserError(f"--{name.replace('_', '-')} takes true or false, not {text!r}")
        return text.lower() in ("true", "1", "yes")
    for kind in (int, float):
        if isinstance(default, kind):
            try:
                return kind(text)
            except ValueError:
                raise UserError(f"--{name.replace('_', '-')} takes a number, not {text!r}") from None
    return text


def _lr_how(choice: dict | None) -> str:
    if not choice or choice["how"] == "given":
        return ""
    rates = ", ".join(choice["candidates"])
    second = " and ".join(choice.get("second") or ())
    on = f", {second} on to the 2nd evaluation (none had learned)" if second else ""
    return f" (swept {rates} to step {choice['steps']}{on}: {choice['seconds']:.1f}s more)"


def summary(result: dict) -> str:
    """The one-screen summary of a trial result."""
    if result["status"] != "ok":
        return f"trial failed: {result['reason']}"
    params, protocol = result["params"], result["protocol"]
    lines = [
        f"{result['task']} · {result['summary']} · seed {result['seed']}",
        f"  data      train {protocol['train_size']:,} · dev {protocol['dev_size']:,} · test {protocol['test_size']:,}"
        f" ({protocol['name']}{' K=' + str(protocol['k']) if protocol.get('k') else ''})",
        f"  training  lr {result['learning_rate']:.3g}{_lr_how(result.get('lr_choice'))} · "
        f"precision {result['precision']}",
        f"  params    {params['trainable']:,} trainable ({params['trainable_pct']:.3f}%) · "
        f"{params['stored']:,} stored ({params['stored_pct']:.3f}%)",
        f"  dev       {_metrics(result['dev'])}  (best epoch {result['best_epoch']} of {result['epochs_run']:g})",
        f"  test      {_metrics(result['test'])}",
        *(f"  test      {_metrics(values)}  ({split})" for split, values in result.get("extra_tests", {}).items()),
        f"  time      train {result['train_seconds']:.1f}s · eval {result['eval_seconds']:.1f}s · "
        f"other {result['overhead_seconds']:.1f}s · {result['examples_per_second']:.1f} examples/s · "
        f"peak memory {result['peak_memory_mb']:.0f} MB",
    ]
    if result.get("gates"):
        for kind, layers in result["gates"].items():
            lines.append(f"  gate {kind:<8} " + " ".join(f"{float(v):.2f}" for v in layers.values()))
    if result.get("delta_dir"):
        lines.append(f"  saved     {result['delta_dir']}")
    return "\n".join(lines)

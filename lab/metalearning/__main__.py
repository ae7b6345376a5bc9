"""The meta-learning pipeline's command line: the pool, the collection, the meta-dataset file, and the portfolios
built from it. Run from the repository root (an editable install makes `metalearning` importable):

    python -m metalearning pool --data-root ../shared/data --out pool/
    python -m metalearning collect --pool pool/ --results trials.jsonl [--seeds 0,1] [--workers 14] [--predictions DIR]
    python -m metalearning finish --results trials.jsonl --pool pool/ --out metalearning/data/all-MiniLM-L6-v2.json
    python -m metalearning prior --out autopelt/portfolio/data/portfolio-all-MiniLM-L6-v2.json [--leave-out TASKS]
    python -m metalearning build --meta FILE --out portfolio.json [--leave-out TASKS]   (one global portfolio)
    python -m metalearning design
    python -m metalearning generation-collect --data-dir ../shared/data/gen --results gen.jsonl [--model M]
    python -m metalearning generation-build --results gen.jsonl --out portfolio-generation-M.json

A lent GPU machine collects the whole design in minutes (metalearning/gpu_collect.sh).
"""

from __future__ import annotations

import argparse
import sys
import time

from autopelt.errors import UserError


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    pool = sub.add_parser("pool", help="write every meta-dataset task's fixed pool of rows")
    pool.add_argument("--data-root", required=True, help="folder holding glue-full/, own/ and tasks/")
    pool.add_argument("--out", required=True)

    collect = sub.add_parser("collect", help="train the design on every task (resumable)")
    collect.add_argument("--pool", required=True, help="a folder written by `python -m metalearning pool`")
    collect.add_argument("--results", required=True, help="JSON Lines file the trials are appended to")
    collect.add_argument("--model", help="model folder or hub id (default: all-MiniLM-L6-v2)")
    collect.add_argument("--tasks", help="comma-separated (default: every task of the pool)")
    collect.add_argument("--configs", help="comma-separated design names (default: the whole design); "
                                           "NAME~dropout-off for a variant with the backbone's dropout off")
    collect.add_argument("--seeds", default="0")
    collect.add_argument("--workers", type=int, default=1, help="trials at once (processes)")
    collect.add_argument("--threads", type=int, help="CPU threads per trial")
    collect.add_argument("--device", help="cpu, cuda (default: CUDA when available)")
    collect.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16", "fp16"))
    collect.add_argument("--cache-dir", help="tokenisation cache")
    collect.add_argument("--minutes", type=float, help="start no trial after this many minutes")
    collect.add_argument("--deadline", type=float, help="start no trial after this time (seconds since the epoch)")
    collect.add_argument("--predictions", help="folder for every trial's dev and test predictions (one file a trial)")
    collect.add_argument("--first-tasks", help="comma-separated tasks to run first within each seed")
    collect.add_argument("--calibrated-members", type=int, default=0, metavar="N",
                         help="after each seed's design, MiniLM's first N members on each task (its prior built "
                              "without the task) at the rates --rates calibrated gives them there "
                              "(metalearning/calibrated.py; needs the design's LoRA ladder)")
    collect.add_argument("--first-configs", type=int, help="with several seeds: the later seeds run only the "
                         "design's first N configurations")

    finish = sub.add_parser("finish", help="write the meta-dataset file from the collected trials")
    finish.add_argument("--results", required=True)
    finish.add_argument("--out", required=True)
    finish.add_argument("--model", help="the model the trials trained (default: all-MiniLM-L6-v2)")
    finish.add_argument("--hardware", help="JSON of the hardware the trials ran on (default: this machine's)")
    finish.add_argument("--collected-commit", help="the commit whose code collected the trials, when not HEAD")
    finish.add_argument("--predictions", help="where the trials' predictions are kept (recorded in the header)")
    finish.add_argument("--pool", help="the pool the trials ran on: records each task's one-class dev metric, "
                        "which tells a collapsed rate from a hard task when a portfolio learns a baseline's rate")

    build = sub.add_parser("build", help="greedily choose one global portfolio from a meta-dataset")
    build.add_argument("--meta", default="shipped", help="a meta-dataset file (default `shipped`: metalearning/data)")
    build.add_argument("--out", required=True, help="the portfolio file to write")
    build.add_argument("--size", type=int, default=16, help="configurations in the portfolio (default 16)")
    build.add_argument("--leave-out", help="comma-separated tasks of the meta-dataset not to learn from")

    prior = sub.add_parser("prior", help="the shipped portfolio: global members, baseline rates, the task-aware prior")
    prior.add_argument("--meta", default="shipped", help="a meta-dataset file (default `shipped`: metalearning/data)")
    prior.add_argument("--out", required=True, help="the portfolio file to write")
    prior.add_argument("--size", type=int, default=16)
    prior.add_argument("--leave-out", help="comma-separated tasks to build it without (a live benchmark's task)")

    sub.add_parser("design", help="list the design's configurations")

    gen = sub.add_parser("generation-collect", help="train the generation design on a generation task (resumable)")
    gen.add_argument("--data-dir", required=True, help="folder holding TASK/train.jsonl and TASK/validation.jsonl")
    gen.add_argument("--task", default="e2e")
    gen.add_argument("--input-column", default="mr")
    gen.add_argument("--target-column", default="ref")
    gen.add_argument("--k", type=int, default=1000, help="training rows (default 1000)")
    gen.add_argument("--results", required=True, help="JSON Lines file the trials are appended to")
    gen.add_argument("--model", default="smollm2-135m")
    gen.add_argument("--configs", help="comma-separated (default: the whole generation design)")
    gen.add_argument("--seeds", default="0,1")
    gen.add_argument("--workers", type=int, default=1)
    gen.add_argument("--threads", type=int)
    gen.add_argument("--device")
    gen.add_argument("--precision", default="auto", choices=("auto", "fp32", "bf16", "fp16"))
    gen.add_argument("--minutes", type=float, help="start no trial after this many minutes")

    gen_build = sub.add_parser("generation-build", help="the generation portfolio: the design ranked by dev loss")
    gen_build.add_argument("--results", required=True)
    gen_build.add_argument("--out", required=True)
    gen_build.add_argument("--model", default="smollm2-135m", help="the model the trials trained")
    gen_build.add_argument("--size", type=int, default=8)


def run(args) -> int:
    return {"pool": _pool, "collect": _collect, "finish": _finish, "build": _build, "prior": _prior,
            "design": _design, "generation-collect": _generation_collect,
            "generation-build": _generation_build}[args.action](args)


def _generation_collect(args) -> int:
    from autopelt.data.generation import GenerationTask, load_generation_splits
    from autopelt.models import resolve_model
    from metalearning import generation

    task = GenerationTask(args.task, args.input_column, args.target_column)
    load_generation_splits(task, args.data_dir)  # a missing folder or column: one line before any worker starts
    configs = args.configs.split(",") if args.configs else [c.name for c in generation.DESIGN]
    deadline = time.time() + 60 * args.minutes if args.minutes is not None else None
    generation.collect({"task": args.task, "data_dir": args.data_dir, "input_column": args.input_column,
                        "target_column": args.target_column, "k": args.k}, args.results, resolve_model(args.model),
                       configs, [int(s) for s in args.seeds.split(",")], workers=args.workers, device=args.device,
                       precision=args.precision, threads=args.threads, deadline=deadline)
    return 0


def _generation_build(args) -> int:
    from autopelt.models import model_name, resolve_model
    from autopelt.portfolio.command import print_portfolio
    from metalearning import generation

    if args.size < 1:
        raise UserError("--size must be at least 1")
    print_portfolio(args.out, generation.build(args.results, args.out, model_name(resolve_model(args.model)),
                                               args.size))
    return 0


def _pool(args) -> int:
    from metalearning.tasks import build_pool

    manifest = build_pool(args.data_root, args.out)
    for name, task in manifest.items():
        kind = "regression" if task.get("regression") else f"{len(task['label_names'])} labels"
        print(f"{name}: {task['train_rows']} train / {task['test_rows']} test rows, {kind}")
    return 0


def _collect(args) -> int:
    from autopelt.models import resolve_model
    from metalearning.collect import collect, for_model, plan
    from metalearning.design import DESIGN, config_named
    from metalearning.tasks import read_pool

    pool = read_pool(args.pool)
    tasks = args.tasks.split(",") if args.tasks else list(pool)
    unknown = [t for t in tasks if t not in pool]
    if unknown:
        raise UserError(f"task {unknown[0]!r} is not in the pool {args.pool}; it holds {', '.join(pool)}")
    configs = args.configs.split(",") if args.configs else [c.name for c in DESIGN]
    for name in configs:
        config_named(name)
    model = resolve_model(args.model)
    adapted, said = for_model(configs, model)  # a decoder's or T5's head reads one token; BitFit not on Llama
    if said:
        print(f"on {model}: {said}")
    configs = [name for name in configs if name in adapted]
    seeds = [int(s) for s in args.seeds.split(",")]
    deadline = time.time() + 60 * args.minutes if args.minutes is not None else args.deadline
    first = args.first_tasks.split(",") if args.first_tasks else []
    later = configs[:args.first_configs] if args.first_configs else configs
    jobs = plan(tasks, configs, seeds[:1], first) + plan(tasks, later, seeds[1:], first)
    run = dict(workers=args.workers, device=args.device, precision=args.precision, threads=args.threads,
               cache_dir=args.cache_dir, deadline=deadline, predictions_dir=args.predictions)
    if not args.calibrated_members:
        collect(jobs, args.results, args.pool, model, configs=adapted, **run)
        return 0
    try:  # its simulation reads the ladder through autopelt.study, which imports optuna: fail before seed 0
        from metalearning import calibrated, simulate  # noqa: F401
    except ImportError as error:
        raise UserError(f"--calibrated-members needs {error.name or 'a package'} (metalearning's simulation "
                        "imports it): install it, or on a device machine carry its wheels") from None
    for seed in seeds:  # a seed's calibrated members need that seed's LoRA ladder, collected with its design
        collect([job for job in jobs if job.seed == seed], args.results, args.pool, model, configs=adapted, **run)
        more, configs, skipped = calibrated.jobs(args.results, args.pool, model, tasks, seed, args.calibrated_members)
        if skipped:
            print(f"seed {seed}: no calibrated members on {', '.join(skipped)} (no LoRA ladder collected there)")
        collect(more, args.results, args.pool, model, configs=configs, **run)
    return 0


def _finish(args) -> int:
    import json
    import subprocess

    from autopelt.models import model_name, resolve_model
    from metalearning.collect import finish, hardware

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
    header = {"model": model_name(resolve_model(args.model)), "commit": commit,
              "hardware": json.loads(args.hardware) if args.hardware else hardware(),
              "created": time.strftime("%Y-%m-%d"),
              **({"predictions": _predictions_note(args.predictions)} if args.predictions else {})}
    if args.collected_commit:
        header["collected_by_commit"] = args.collected_commit
    data = finish(args.results, args.out, header, args.pool, args.model)
    print(f"{args.out}: {len(data['records'])} trials")
    return 0


def _predictions_note(folder: str) -> dict:
    from pathlib import Path

    files = list(Path(folder).rglob("*.npz"))
    return {"location": folder, "files": len(files), "megabytes": round(sum(f.stat().st_size for f in files) / 1e6, 1),
            "layout": "<task>/<config>@s<seed>.npz: dev, test (float16 probabilities, or values for a regression; "
                      "past 16 classes the top 10 as <split>_indices/_values/_classes), dev_labels, test_labels"}


def _build(args) -> int:
    from metalearning import build

    if args.size < 1:
        raise UserError("--size must be at least 1")
    from autopelt.portfolio.command import print_portfolio

    leave_out = args.leave_out.split(",") if args.leave_out else []
    print_portfolio(args.out, build.from_meta(args.meta, args.size, leave_out, args.out))
    return 0


def _prior(args) -> int:
    from autopelt.portfolio.command import print_portfolio
    from metalearning import build

    leave_out = tuple(args.leave_out.split(",")) if args.leave_out else ()
    print_portfolio(args.out, build.with_prior(args.meta, args.size, args.out, leave_out=leave_out))
    return 0


def _design(args) -> int:
    from metalearning.design import DESIGN

    for config in DESIGN:
        print(f"{config.name:28s} batch {config.batch_size:2d} · {config.pooling:4s} · "
              + " + ".join(m["method"] for m in config.methods))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m metalearning", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

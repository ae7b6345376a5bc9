"""`autopelt search`: find the best delta for a task (flags below; heavy imports only inside `run`)."""

from __future__ import annotations

import argparse
import sys

from autopelt.data.custom_task_args import add_custom_task_arguments, custom_task_fields, task_name
from autopelt.search.packs import PACK_CHOICES
from autopelt.study.storage import DEFAULT_STORAGE


def add_arguments(parser: argparse.ArgumentParser) -> None:
    what = parser.add_argument_group("what to search")
    what.add_argument("--task", help="GLUE task (rte, mrpc, sst2, ...), or your own (see below; with --train-file "
                                     "the default is the file's name)")
    what.add_argument("--model", help="base model: a local folder or a hub id (default: all-MiniLM-L6-v2)")
    what.add_argument("--data-dir", help="local task data, <dir>/<task>/<split>.jsonl (env AUTOPELT_DATA_DIR)")
    what.add_argument("--space", default="default", help="search space name or YAML path (default: default)")
    what.add_argument("--k", type=int, help="low-resource protocol: K training examples (default: full train)")
    what.add_argument("--epochs", type=int, help="epochs per trial (default: the space's train.epochs)")
    what.add_argument("--seed", type=int, default=0, help="training seed of every trial (default: 0)")
    what.add_argument("--max-params", help="parameter budget of a delta: 0.5%% of the base model, or 100k, 2M")
    what.add_argument("--multi-objective", action="store_true",
                      help="optimise dev metric and stored params %% together (Pareto front)")
    what.add_argument("--no-baselines", dest="baselines", action="store_false",
                      help="do not run UniPELT and the single methods first (paper structure, learning rate swept)")
    what.add_argument("--sampler", choices=("tpe", "random", "leaders", "none"), default="tpe",
                      help="what draws after the portfolio: Optuna's TPE (default), uniformly at random, leaders "
                           "(the two best members again at half and twice their rate, then TPE), or none (the "
                           "portfolio alone: its members take the budget the sampler would)")
    what.add_argument("--finalists", type=int,
                      help="at the end, train the best N trials again with another seed (--seed + 1000), inside "
                           "the budget, and answer with the best mean dev; 0: none (default: 3, rounded up to whole "
                           "rounds of --workers; on a wall-time budget at most the rounds that fit in a third of "
                           "what the baselines leave)")
    what.add_argument("--portfolio", default="auto",
                      help="configurations run first, learned across tasks: auto (default: the shipped portfolio, "
                           "for the default space; on a generation task one measured for generation on the model, "
                           "where one is), none, or a portfolio file")
    what.add_argument("--rates", choices=("absolute", "calibrated", "transfer"), default="absolute",
                      help="the portfolio's learning rates: as measured on its model (absolute, default), or "
                           "relative to the LoRA rate this study's LoRA baseline sweeps first (calibrated), or "
                           "scaled by a power of the two models' hidden sizes (transfer)")
    what.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=None,
                      help="every trial recomputes the model's activations in the backward pass: less memory, "
                           "more time (default: a generation search's trials whose delta can take it)")
    what.add_argument("--batch-size", type=int,
                      help="every trial's batch size, over the space's and the portfolio's (default: theirs)")
    what.add_argument("--max-length", type=int,
                      help="every trial's rows cut to this many tokens (default: the space's, else 128)")
    what.add_argument("--quantize", choices=("4bit",),
                      help="4bit: every trial's frozen base in NF4 on CUDA, LoRA over it (QLoRA; a decoder and a "
                           "LoRA-only space such as --space lora; needs bitsandbytes)")
    what.add_argument("--backbone-dropout", choices=("off", "attention-off", "model"), default="off",
                      help="the frozen model's dropout in every trial (default off; a portfolio member keeps its own)")
    what.add_argument("--no-early-stopping", dest="early_stopping", action="store_false",
                      help="train every trial to its last epoch (no ASHA)")

    add_custom_task_arguments(parser)
    how = parser.add_argument_group("how much and where")
    how.add_argument("--budget", default="20",
                     help="trials over the whole study (20), or wall time of this run (90s, 30m, 2h); default 20")
    how.add_argument("--storage", default=DEFAULT_STORAGE,
                     help=f"study database, an SQLAlchemy URL (default {DEFAULT_STORAGE}; "
                          "postgresql://user:pw@host/db to share a study between machines)")
    how.add_argument("--study-name", help="default: <task>-<model>-<space>-<space hash>")
    how.add_argument("--out", help="trial outputs (results, delta weights); default ./autopelt_runs/<study>")
    how.add_argument("--workers", type=int,
                     help="trials at once (default: on CUDA GPUs, as many as fit in their free memory by one measured "
                          "step and as the CPU cores feed, one core a trial; on a Ray cluster one per GPU; else 1)")
    how.add_argument("--cpus-per-trial", type=float, help="default: this machine's CPUs / workers")
    how.add_argument("--gpus-per-trial", type=float,
                     help="default: local CUDA GPUs / workers (at most 1), no more trials on a GPU than fit in its "
                          "memory by one measured step; 0 without CUDA or with --ray-address. A trial given less "
                          "than a GPU holds at most its part of the GPU's memory")
    how.add_argument("--precision", choices=("auto", "fp32", "bf16", "fp16"), default="auto",
                     help="of every trial; auto (default): bf16 where the trial's device computes it natively and "
                          "measurably faster, else fp32")
    how.add_argument("--pack", choices=PACK_CHOICES, default="off",
                     help="on: the finalists that can pack train together as one pack, one pass of the frozen model "
                          "a step for all (docs/packed.md); auto: the same, packed only where the pack's measured "
                          "steps beat its members' steps alone; off (default): each alone")
    how.add_argument("--ray-address", help="an existing Ray cluster (default: start a local one)")


def run(args: argparse.Namespace) -> int:
    import optuna

    from autopelt.search.run import SearchOptions, SearchStopped, run_search

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the live view says what happens

    options = SearchOptions(
        task=task_name(args), budget=args.budget, model=args.model, data_dir=args.data_dir, space=args.space,
        storage=args.storage, study_name=args.study_name, workers=args.workers,
        cpus_per_trial=args.cpus_per_trial, gpus_per_trial=args.gpus_per_trial, ray_address=args.ray_address,
        max_params=args.max_params, multi_objective=args.multi_objective, baselines=args.baselines, k=args.k,
        epochs=args.epochs, seed=args.seed, out=args.out, early_stopping=args.early_stopping, sampler=args.sampler,
        precision=args.precision, custom_task=custom_task_fields(args), finalists=args.finalists,
        portfolio=args.portfolio, rates=args.rates, backbone_dropout=args.backbone_dropout,
        gradient_checkpointing=args.gradient_checkpointing, batch_size=args.batch_size, max_length=args.max_length,
        quantize=args.quantize, pack=args.pack,
    )
    try:
        outcome = run_search(options)
    except SearchStopped as error:
        print(f"autopelt: error: {error}", file=sys.stderr)
        return 1
    if outcome.interrupted:
        print("autopelt: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    return 0

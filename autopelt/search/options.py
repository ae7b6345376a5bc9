"""What the user asks of a search (`SearchOptions`: the CLI flags, one for one), and the checks a flag's value
needs on its own, before anything is resolved (search/plan.py)."""

from __future__ import annotations

from dataclasses import dataclass

from autopelt.errors import UserError
from autopelt.search.packs import PACK_CHOICES
from autopelt.study.storage import DEFAULT_STORAGE
from autopelt.train.settings import PRECISIONS, QUANTIZE_CHOICES

SAMPLERS = ("tpe", "random", "leaders", "none")  # what draws after the portfolio (search/leaders.py)


@dataclass
class SearchOptions:
    """A search as the user states it (the CLI flags, one for one)."""

    task: str
    budget: str | int = 20
    model: str | None = None
    data_dir: str | None = None
    space: str = "default"
    storage: str = DEFAULT_STORAGE
    study_name: str | None = None
    workers: int | None = None  # None: as many as the hardware holds (search/resources.py); the plan holds the count
    cpus_per_trial: float | None = None  # default: this machine's CPUs shared among the workers
    gpus_per_trial: float | None = None  # default: a local machine's CUDA GPUs shared among the workers (≤ 1)
    batch_size: int | None = None  # of every trial, over the space's and the portfolio's; None: theirs
    max_length: int | None = None  # tokens of every trial's rows; None: the space's, else TrialSettings'
    quantize: str | None = None  # "4bit": every trial's base in NF4 (QLoRA; train/quantize.py); None: as stored
    ray_address: str | None = None
    max_params: str | None = None
    multi_objective: bool = False
    baselines: bool = True
    k: int | None = None  # the low-resource protocol: K training examples; None: the full protocol
    epochs: int | None = None
    seed: int = 0
    out: str | None = None  # trial outputs; default ./autopelt_runs/<study>
    early_stopping: bool = True
    sampler: str = "tpe"  # what draws after the portfolio: tpe, random, leaders or none (search/leaders.py)
    precision: str = "auto"  # of every trial: auto (bf16 where the device computes it natively and faster),
    # fp32, bf16 or fp16
    custom_task: dict | None = None  # your own data: `autopelt.data.custom_task` fields (text_columns, …)
    finalists: int | None = None  # trials trained again with another seed at the end (finalists.py); None: 3 or more
    backbone_dropout: str = "off"  # of every trial but a portfolio member (which keeps its own): TrialSettings'
    rates: str = "absolute"  # the portfolio's rates: absolute, calibrated to the study's LoRA rate, or transferred by
    # the hidden sizes (portfolio.py)
    portfolio: str = "auto"  # configurations run first: auto (the shipped one, default space), none, or a file
    gradient_checkpointing: bool | None = None  # of every trial whose delta can take it; None: the trial's default
    pack: str = "off"  # off, on (the finalists train as one pack when they can) or auto (and packed only where its
    #                    measured step pays): search/packs.py


def check_numbers(options: SearchOptions) -> None:
    """Raise UserError on the first number or choice out of its range; reads nothing else."""
    if options.workers is not None and (isinstance(options.workers, bool) or not isinstance(options.workers, int)
                                        or options.workers < 1):
        raise UserError(f"--workers must be at least 1, not {options.workers!r}")
    for flag, value in (("--batch-size", options.batch_size), ("--max-length", options.max_length)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise UserError(f"{flag} must be a whole number, at least 1, not {value!r}")
    if options.quantize not in QUANTIZE_CHOICES:
        raise UserError(f"--quantize must be 4bit, not {options.quantize!r}")
    if options.cpus_per_trial is not None and options.cpus_per_trial <= 0:
        raise UserError("--cpus-per-trial must be positive")
    if options.gpus_per_trial is not None and options.gpus_per_trial < 0:
        raise UserError("--gpus-per-trial cannot be negative")
    if options.epochs is not None and options.epochs < 1:
        raise UserError("--epochs must be at least 1")
    if options.k is not None and options.k < 1:
        raise UserError("--k must be a positive number of training examples")
    if options.sampler not in SAMPLERS:
        raise UserError(f"--sampler must be one of {', '.join(SAMPLERS)}, not {options.sampler!r}")
    if options.finalists is not None and (isinstance(options.finalists, bool) or not isinstance(options.finalists, int)
                                          or options.finalists < 0):
        raise UserError(f"--finalists must be a whole number, 0 or more, not {options.finalists!r}")
    if options.pack not in PACK_CHOICES:
        raise UserError(f"--pack must be off, on or auto, not {options.pack!r}")
    if options.precision not in PRECISIONS:
        raise UserError(f"--precision must be one of {', '.join(PRECISIONS)}, not {options.precision!r}")

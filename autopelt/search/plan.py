"""From what the user asked (`SearchOptions`) to everything a search needs (`SearchPlan`), checked up front.

`prepare` resolves the task, model, space, budgets and storage and raises `UserError` on the first bad
input, before any study, database file or Ray process exists.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autopelt.errors import UserError
from autopelt.search import phases, resources
from autopelt.search.budget import (Budget, ParamLimit, TimeBudget, parse_budget,
                                    parse_max_params)
from autopelt.study.storage import DEFAULT_STORAGE, check_storage, normalise_url
from autopelt.train.settings import PRECISIONS

DEFAULT_EPOCHS = 3  # when neither --epochs nor the space's `train.epochs` says


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
    workers: int = 1
    cpus_per_trial: float | None = None  # default: this machine's CPUs shared among the workers
    gpus_per_trial: float | None = None  # default: a local machine's CUDA GPUs shared among the workers (≤ 1)
    ray_address: str | None = None
    max_params: str | None = None
    multi_objective: bool = False
    baselines: bool = True
    k: int | None = None  # the low-resource protocol: K training examples; None: the full protocol
    epochs: int | None = None
    seed: int = 0
    out: str | None = None  # trial outputs; default ./autopelt_runs/<study>
    early_stopping: bool = True
    sampler: str = "tpe"  # tpe (Optuna's TPE) or random: the search's baseline strategy
    precision: str = "auto"  # of every trial: auto (bf16 where the device computes it natively and faster),
    # fp32, bf16 or fp16
    custom_task: dict | None = None  # your own data: `autopelt.data.custom_task` fields (text_columns, …)
    finalists: int | None = None  # trials trained again with another seed at the end (confirm.py); None: 3 or more
    backbone_dropout: str = "off"  # of every trial but a portfolio member (which keeps its own): TrialSettings'
    rates: str = "absolute"  # the portfolio's rates: absolute, calibrated to the study's LoRA rate, or transferred by
    # the hidden sizes (portfolio.py)
    portfolio: str = "auto"  # configurations run first: auto (the shipped one, default space), none, or a file
    gradient_checkpointing: bool = False  # of every trial whose delta can take it (TrialSettings')


@dataclass
class SearchPlan:
    """Everything resolved: what the controller, the Ray adapter and the view work from."""

    options: SearchOptions
    study_name: str
    storage: str
    task: str
    metric: str
    num_labels: int
    model: str
    model_config: Any
    space: Any  # a search.space.SearchSpace: .name, .fingerprint, .sample(trial, num_layers)
    budget: Budget
    param_limit: ParamLimit | None
    epochs: int
    protocol: dict
    out_dir: Path
    baselines: list[str]  # names of autopelt.delta.presets queued first in every study
    cpus_per_trial: float
    data_dir: str | None  # absolute: Ray workers run elsewhere
    gpus_per_trial: float = 0
    finalists: int = 0  # the best trials trained again with another seed at the end of the search (confirm.py)
    portfolio: Any = None  # autopelt.portfolio.portfolio.Portfolio run first, or None
    portfolio_size: int = 0  # its members this study runs (at most half of a trial budget)
    portfolio_note: str = ""  # which portfolio, and why, in one line
    gpu_note: str = ""  # how many trials share a GPU, and why, in one line (a local GPU machine without the flag)
    pooling: str = "cls"  # how the model was trained to be read (models.own_pooling): what the baselines' head reads
    generation: bool = False  # a generation task: trials train the language model; dev is minus the dev loss
    fit_note: str = ""  # what a wall-time budget left out of the plan, and why (search/fit.py)
    data: Any = None  # autopelt.data.check.DataCheck: the splits as every trial reads them (None: a generation task)

    @property
    def dev_label(self) -> str:
        """What the study's first objective is, as shown: the dev metric, or `-loss` for a generation task."""
        return "-loss" if self.generation else self.metric

    @property
    def dev_heading(self) -> str:
        """The live table's dev column: `dev accuracy`, or `-dev loss` for a generation task."""
        return "-dev loss" if self.generation else f"dev {self.metric}"

    @property
    def num_layers(self) -> int:
        return int(self.model_config.num_hidden_layers)

    @property
    def directions(self) -> list[str]:
        return ["maximize", "minimize"] if self.options.multi_objective else ["maximize"]

    @property
    def deadline_seconds(self) -> float | None:
        return self.budget.seconds if isinstance(self.budget, TimeBudget) else None


def prepare(options: SearchOptions) -> SearchPlan:
    """Check and resolve every input; raise UserError on the first bad one. Writes nothing (but a hub id's files
    fetched into the hub's cache: its config, and how it is pooled)."""
    from autopelt.data.generation import GenerationTask
    from autopelt.models import check_model_folder, load_config, load_tokenizer, own_pooling
    from autopelt.search.space import load_space

    budget = parse_budget(options.budget)
    param_limit = parse_max_params(options.max_params)
    _check_numbers(options)
    task = _task(options.task, options.custom_task)
    generation = isinstance(task, GenerationTask)  # your own input -> target text
    if generation:
        data_dir = _generation_data_dir(options.data_dir, task)
    else:
        data_dir = None if task.files else _data_dir(options.data_dir, task)
    model = _model(options.model)
    cpus_per_trial = resources.cpus_per_trial(options)
    resources.check_local(options, cpus_per_trial)
    if data_dir is None and not generation and not task.files:  # offline, one line now: before seconds of imports
        from autopelt.data.loading import check_hub_data

        check_hub_data(task)
    space = load_space(options.space)
    storage = normalise_url(options.storage)
    check_storage(storage)
    num_labels = 2 if generation else task.num_labels  # a generation trial's model has no task head
    model_config = load_config(model, num_labels)
    check_model_folder(model)  # weights and a tokenizer: without them every trial fails
    tokenizer = load_tokenizer(model)
    if generation:
        from autopelt.train.generate import check_generation_tokenizer, check_generator

        check_generator(model_config)
        check_generation_tokenizer(tokenizer, model)  # an end-of-sequence token ends every target
    from autopelt.delta.families import architecture_of
    from autopelt.search.space_models import cannot_apply_preset, for_model

    space = for_model(space, model_config)  # what the model's family cannot take is not drawn
    gpus_per_trial, gpu_note = resources.gpus_per_trial(options, model, num_labels, generation, space)
    epochs = options.epochs or _space_epochs(space, model_config) or DEFAULT_EPOCHS
    # the slowest check (the hub: online, a download), after the model's; its rows give the task's meta-features
    data, loaded = (None, {}) if generation else _check_data(task, data_dir, options)
    portfolio, portfolio_note = _generation_portfolio(options.portfolio, model) if generation else \
        _portfolio(options.portfolio, model, space,
                   lambda: _task_features(task, loaded.get(task.train_split), model, options.k), options.rates,
                   getattr(model_config, "hidden_size", None))
    if portfolio is not None:
        from autopelt.search.space_models import portfolio_for_model

        portfolio, said = portfolio_for_model(portfolio, model_config)
        portfolio_note += f"\n{said}" if said else ""
    baselines = phases.baselines_for(budget, with_portfolio=portfolio is not None) if options.baselines else []
    if portfolio is not None and portfolio.calibrate:
        portfolio, portfolio_note, baselines = phases.calibration_plan(portfolio, portfolio_note, baselines, budget)
    refused = {name: why for name in baselines if (why := cannot_apply_preset(name, model_config))}
    baselines = [name for name in baselines if name not in refused]
    if refused:  # said, not dropped in silence: UniPELT is every study's baseline where the family takes it
        portfolio_note = "\n".join(filter(None, [portfolio_note] + [
            f"baseline {name} left out: a {architecture_of(model_config).family} model cannot take it ({why})"
            for name, why in refused.items()]))
    portfolio_size = phases.portfolio_size(portfolio, budget, len(baselines))
    finalists = phases.finalists(options.finalists, options.workers, budget, len(baselines))
    name = options.study_name or study_name_for(task.name, model, space, options.k, options.multi_objective)
    return SearchPlan(
        options=options, study_name=name, storage=storage, task=task.name, metric=task.metric,
        num_labels=num_labels, model=model, model_config=model_config, space=space, budget=budget,
        param_limit=param_limit, epochs=epochs,
        protocol={"name": "k-shot", "k": options.k} if options.k else {"name": "full"},
        out_dir=Path(options.out or Path("autopelt_runs") / name).resolve(),
        baselines=baselines, cpus_per_trial=cpus_per_trial, gpus_per_trial=gpus_per_trial, data_dir=data_dir,
        pooling=_baseline_pooling(own_pooling(model), space),
        finalists=finalists, portfolio=portfolio, portfolio_size=portfolio_size, portfolio_note=portfolio_note,
        gpu_note=gpu_note,
        generation=generation, data=data,
    )


def _portfolio(choice: str, model: str, space, features, rates: str = "absolute", hidden_size: int | None = None):
    """The portfolio and its line(s); `features()` gives the task's meta-features (None where they cannot be read:
    the portfolio learned from every task answers); `rates` how its members' rates are read (portfolio.RATES)."""
    from autopelt.models import model_name
    from autopelt.portfolio.portfolio import for_search

    if choice == "none":
        return for_search("none", model_name(model), space.name, rates=rates)
    return for_search(choice or "auto", model_name(model), space.name, features(), rates, hidden_size)


def _task_features(task, rows: list[dict] | None, model: str, k: int | None):
    """The task's meta-features from its train rows as the data check loaded them (autopelt/portfolio/
    metafeatures.py), before any training; None without rows."""
    from autopelt.models import load_tokenizer
    from autopelt.portfolio import metafeatures

    if not rows:
        return None
    return metafeatures.compute(rows, task.text_columns, task.label_column, task.regression,
                                train_rows=min(k, len(rows)) if k else len(rows), tokenizer=load_tokenizer(model))


def _check_numbers(options: SearchOptions) -> None:
    if options.workers < 1:
        raise UserError("--workers must be at least 1")
    if options.cpus_per_trial is not None and options.cpus_per_trial <= 0:
        raise UserError("--cpus-per-trial must be positive")
    if options.gpus_per_trial is not None and options.gpus_per_trial < 0:
        raise UserError("--gpus-per-trial cannot be negative")
    if options.epochs is not None and options.epochs < 1:
        raise UserError("--epochs must be at least 1")
    if options.k is not None and options.k < 1:
        raise UserError("--k must be a positive number of training examples")
    if options.sampler not in ("tpe", "random"):
        raise UserError(f"--sampler must be tpe or random, not {options.sampler!r}")
    if options.finalists is not None and (isinstance(options.finalists, bool) or not isinstance(options.finalists, int)
                                          or options.finalists < 0):
        raise UserError(f"--finalists must be a whole number, 0 or more, not {options.finalists!r}")
    if options.precision not in PRECISIONS:
        raise UserError(f"--precision must be one of {', '.join(PRECISIONS)}, not {options.precision!r}")


def _task(name: str, custom: dict | None):
    """A Task (classification, regression), or a GenerationTask for your own input -> target columns."""
    from autopelt.data import custom_task, get_task
    from autopelt.data.generation import generation_task_of

    generation = generation_task_of(name, custom)
    if generation is not None:
        return generation
    return custom_task(name, **custom) if custom else get_task(name)


def _generation_data_dir(given: str | None, task) -> str:
    """The data folder of a generation task (absolute), its files and both columns checked: one line, no study."""
    from autopelt.data.generation import load_generation_splits

    folder = _data_folder(given)
    if folder is None:
        raise UserError("a generation task reads your own data: pass --data-dir DIR holding "
                        f"DIR/{task.name}/train.jsonl")
    load_generation_splits(task, str(folder))
    return str(folder)


def _generation_portfolio(choice: str, model: str):
    """A generation task's portfolio: one measured for generation on the model (portfolio.for_generation)."""
    from autopelt.models import model_name
    from autopelt.portfolio.portfolio import for_generation

    return for_generation(choice or "auto", model_name(model))


def _model(name: str | None) -> str:
    """A hub id, or an absolute folder (Ray workers do not share this process's working directory)."""
    from autopelt.models import resolve_model

    model = resolve_model(name)
    return str(Path(model).resolve()) if Path(model).exists() else model


def _check_data(task, data_dir: str | None, options: SearchOptions):
    """The task's data as every trial will read it (`autopelt.data.check`): a file, column, label, K or dev size
    that would fail every trial is one UserError now, before the study exists. Hub data is loaded once here:
    offline, that is one clear error; online, the workers then find it in the `datasets` cache. Returns the
    DataCheck and the splits' rows as loaded (split name -> rows)."""
    import logging

    from autopelt.data.check import load_and_check

    loggers = [logging.getLogger(name) for name in ("huggingface_hub", "datasets")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)  # the hub client logs every retry of an unreachable host
    try:
        return load_and_check(task, data_dir, options.k or "full", seed=options.seed)
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _data_dir(given: str | None, task) -> str | None:
    """The local data folder (absolute), checked to hold the task's splits; None: the hub."""
    from autopelt.data.files import find_split_file

    folder = _data_folder(given)
    if folder is None:
        return None
    for split in (task.train_split, task.test_split):
        if find_split_file(folder / task.dataset, split) is None:
            value = given or os.environ.get("AUTOPELT_DATA_DIR")
            raise UserError(f"--data-dir {value}: no {task.dataset}/{split}.jsonl|csv|parquet for task {task.name!r}")
    return str(folder)


def _data_folder(given: str | None) -> Path | None:
    """--data-dir, else $AUTOPELT_DATA_DIR, as an absolute folder that exists; None when neither is set."""
    value = given or os.environ.get("AUTOPELT_DATA_DIR")
    if not value:
        return None
    folder = Path(value).expanduser().resolve()
    if not folder.is_dir():
        raise UserError(f"--data-dir {value} is not a folder")
    return folder


def _baseline_pooling(own: str, space) -> str:
    """What the baselines' head reads: the model as it was trained to be read where the space's deltas may read it
    so; else as they read (a space without `head: pooling` reads the first token, as does one pinned to `cls` for
    deltas with a peft form), so that the baselines are drawn by the space like its own deltas."""
    allowed = space.poolings() or ("cls",)  # the spec's default
    return own if own in allowed else allowed[0]


def _space_epochs(space, model_config) -> int | None:
    """The space's `train.epochs` as one draw shows it (a malformed space fails here, before the study)."""
    import optuna

    probe = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)).ask()
    _, hparams = space.sample(probe, int(model_config.num_hidden_layers))
    epochs = hparams.get("epochs")
    return int(epochs) if isinstance(epochs, (int, float)) and epochs >= 1 else None


def study_name_for(task: str, model: str, space, k: int | None, multi_objective: bool) -> str:
    """`rte-all-MiniLM-L6-v2-default-1a2b3c4d`: same task, model, space file and protocol -> same study."""
    from autopelt.models import model_name

    parts = [task, model_short(model_name(model)), space.name, str(space.fingerprint)[:8]]
    if k:
        parts.append(f"k{k}")
    if multi_objective:
        parts.append("pareto")
    return "-".join(parts)


_GENERIC = {"model", "models", "snapshot", "snapshots", "main", "checkpoint", "final"}


def model_short(model: str) -> str:
    """A model's readable name: a hub id's last part, or a folder's name above generic ones like `model`."""
    path = Path(str(model).rstrip("/"))
    while path.name.lower() in _GENERIC and path.parent != path:
        path = path.parent
    return path.name or str(model)

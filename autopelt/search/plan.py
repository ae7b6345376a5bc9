"""From what the user asked (`SearchOptions`, options.py) to everything a search needs (`SearchPlan`), checked up
front.

`prepare` resolves the task, model, space, budgets and storage and raises `UserError` on the first bad
input, before any study, database file or Ray process exists. Its parts: the task and its data (task_data.py), what
each trial gets of the machine (resources.py), how the budget is split among the phases (phases.py), the study's
name (study_names.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autopelt.search import phases, resources
from autopelt.errors import UserError
from autopelt.search.budget import Budget, ParamLimit, TimeBudget, parse_budget, parse_max_params
from autopelt.search.hardware import Hardware, probe
from autopelt.search.options import SearchOptions, check_numbers
from autopelt.search.study_names import study_name_for
from autopelt.search.task_data import check_data, data_dir_of, task_of
from autopelt.study.storage import check_storage, normalise_url
from autopelt.train.settings import TrialSettings

DEFAULT_EPOCHS = 3  # when neither --epochs nor the space's `train.epochs` says


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
    finalists: int = 0  # the best trials trained again with another seed at the end of the search (finalists.py)
    portfolio: Any = None  # autopelt.portfolio.portfolio.Portfolio run first, or None
    portfolio_size: int = 0  # its members this study runs (at most half of a trial budget)
    portfolio_note: str = ""  # which portfolio, and why, in one line
    gpu_note: str = ""  # how many workers, or how many trials share a GPU, and why, in one line (resources.py)
    pooling: str = "cls"  # how the model was trained to be read (models.own_pooling): what the baselines' head reads
    generation: bool = False  # a generation task: trials train the language model; dev is minus the dev loss
    fit_note: str = ""  # what a wall-time budget left out of the plan, and why (search/budget_fit.py)
    data: Any = None  # autopelt.data.check.DataCheck: the splits as every trial reads them (None: a generation task)
    workers_given: bool = True  # --workers was given (else `options.workers` is what the hardware holds)

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

    def placed(self, placement) -> SearchPlan:
        """This plan with `placement`'s workers and shares (a Ray cluster's, once reached: resources.py), its
        finalists rounded to whole rounds of the new workers."""
        options = dataclasses.replace(self.options, workers=placement.workers)
        finalists = self.finalists
        if placement.workers != self.options.workers:
            finalists = phases.finalist_count(options.finalists, placement.workers, self.budget, len(self.baselines))
        return dataclasses.replace(self, options=options, cpus_per_trial=placement.cpus_per_trial,
                                   gpus_per_trial=placement.gpus_per_trial, gpu_note=placement.note or self.gpu_note,
                                   finalists=finalists)

    def trial_settings(self, spec: dict, hparams: dict, out_dir, seed: int | None = None,
                       score_test: bool = True) -> TrialSettings:
        """Everything a trial of this search trains with: the study's task, model, data and seed (a finalist's
        own `seed`), the delta, and the training hyper-parameters drawn for it (names of TrialSettings). The
        train/dev rows come from the study's seed (`data_seed`), so every trial sees the same ones."""
        options = self.options
        return TrialSettings(
            task=self.task, spec=spec, custom_task=options.custom_task, model=self.model, data_dir=self.data_dir,
            protocol=options.k or "full", seed=options.seed if seed is None else seed, data_seed=options.seed,
            precision=options.precision, out_dir=str(out_dir), score_test=score_test,
            keep_predictions=not self.generation,  # the ensemble is selected from them (autopelt/ensemble)
            gradient_checkpointing=self._checkpointing(spec), quantize=options.quantize,
            **{"backbone_dropout": options.backbone_dropout, **hparams, **self.trial_shape},
        )

    @property
    def trial_shape(self) -> dict:
        """`--batch-size` and `--max-length` as TrialSettings fields, where given: over what a trial drew."""
        given = {"batch_size": self.options.batch_size, "max_length": self.options.max_length}
        return {name: value for name, value in given.items() if value is not None}

    def _checkpointing(self, spec: dict) -> bool:
        """--gradient-checkpointing for every trial whose delta can take it (the others train without it); None
        where neither it nor --no-gradient-checkpointing was given (TrialSettings' default)."""
        if not self.options.gradient_checkpointing:
            return self.options.gradient_checkpointing
        from autopelt.train.backbone import checkpointing_refusal

        return checkpointing_refusal(self.model_config, spec) is None


def prepare(options: SearchOptions, hardware: Hardware | None = None) -> SearchPlan:
    """Check and resolve every input; raise UserError on the first bad one. Writes nothing (but a hub id's files
    fetched into the hub's cache: its config, and how it is pooled). `hardware`: this machine as the workers are
    placed on it (default: `hardware.probe()`)."""
    from autopelt.data.generation import GenerationTask
    from autopelt.models import check_model_folder, load_config, load_tokenizer, own_pooling
    from autopelt.search.space import load_space

    budget = parse_budget(options.budget)
    param_limit = parse_max_params(options.max_params)
    check_numbers(options)
    task = task_of(options.task, options.custom_task)
    generation = isinstance(task, GenerationTask)  # your own input -> target text
    data_dir = data_dir_of(options.data_dir, task, generation)
    model = _model(options.model)
    hardware = hardware or probe()
    resources.check_local(options, hardware)
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
    space = space.pinned(batch_size=options.batch_size, max_length=options.max_length)  # given, so not drawn
    check_trial_shape(options, model_config)
    if options.quantize:
        from autopelt.quantize import search_refusal

        _refuse(search_refusal(model_config, space, hardware.gpus != ()))
    placement = resources.place(options, hardware, resources.trial_step(options, model, num_labels, generation, space))
    workers_given = options.workers is not None
    options = dataclasses.replace(options, workers=placement.workers)  # what every part reads from here on
    epochs = options.epochs or _space_epochs(space, model_config) or DEFAULT_EPOCHS
    # the slowest check (the hub: online, a download), after the model's; its rows give the task's meta-features
    data, loaded = (None, {}) if generation else check_data(task, data_dir, options.k or "full", options.seed)
    choice = "none" if options.quantize else options.portfolio  # its members are not LoRA alone
    portfolio, portfolio_note = _generation_portfolio(choice, model) if generation else \
        _portfolio(choice, model, space,
                   lambda: _task_features(task, loaded.get(task.train_split), model, options.k), options.rates,
                   getattr(model_config, "hidden_size", None))
    if portfolio is not None:
        from autopelt.search.space_models import portfolio_for_model

        portfolio, said = portfolio_for_model(portfolio, model_config)
        portfolio_note += f"\n{said}" if said else ""
    baselines = phases.baselines_for(budget, with_portfolio=portfolio is not None) if options.baselines else []
    if portfolio is not None and portfolio.calibrate:
        portfolio, portfolio_note, baselines = phases.calibration_plan(portfolio, portfolio_note, baselines, budget)
    refused = {name: why for name in baselines if (why := cannot_apply_preset(name, model_config)
                                                   or _quantize_refusal(options.quantize, name))}
    baselines = [name for name in baselines if name not in refused]
    if refused:  # said, not dropped in silence: UniPELT is every study's baseline where the family takes it
        portfolio_note = "\n".join(filter(None, [portfolio_note] + [
            f"baseline {name} left out: a {architecture_of(model_config).family} model cannot take it ({why})"
            for name, why in refused.items()]))
    if portfolio is None and options.sampler in ("leaders", "none"):
        raise UserError(f"--sampler {options.sampler} works on a portfolio's members, and this search has none: "
                        "use --portfolio auto (the default space) or a portfolio file, or --sampler tpe")
    finalists = phases.finalist_count(options.finalists, options.workers, budget, len(baselines))
    portfolio_size = phases.portfolio_size(portfolio, budget, len(baselines), finalists,
                                           draws=options.sampler != "none")
    name = options.study_name or study_name_for(task.name, model, space, options.k, options.multi_objective)
    return SearchPlan(
        options=options, study_name=name, storage=storage, task=task.name, metric=task.metric,
        num_labels=num_labels, model=model, model_config=model_config, space=space, budget=budget,
        param_limit=param_limit, epochs=epochs,
        protocol={"name": "k-shot", "k": options.k} if options.k else {"name": "full"},
        out_dir=Path(options.out or Path("autopelt_runs") / name).resolve(),
        baselines=baselines, cpus_per_trial=placement.cpus_per_trial, gpus_per_trial=placement.gpus_per_trial,
        data_dir=data_dir,
        pooling=_baseline_pooling(own_pooling(model), space),
        finalists=finalists, portfolio=portfolio, portfolio_size=portfolio_size, portfolio_note=portfolio_note,
        gpu_note=placement.note,
        generation=generation, data=data, workers_given=workers_given,
    )


def check_trial_shape(options: SearchOptions, model_config) -> None:
    """--max-length within the model's positions (a longer row would index past its position embeddings)."""
    positions = getattr(model_config, "max_position_embeddings", None)
    if options.max_length and isinstance(positions, int) and options.max_length > positions:
        raise UserError(f"--max-length {options.max_length} is more than the model's {positions} positions; "
                        f"give --max-length {positions} or less")


def _quantize_refusal(quantize: str | None, baseline: str) -> str | None:
    """Why a baseline cannot train over the 4-bit base --quantize asks for (autopelt/quantize.py), else None."""
    if not quantize:
        return None
    from autopelt.delta.presets import PRESETS
    from autopelt.quantize import spec_refusal

    return spec_refusal(PRESETS[baseline])


def _refuse(reason: str | None) -> None:
    if reason:
        raise UserError(reason)


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

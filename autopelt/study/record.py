"""A study's record: each trial as autopelt writes and reads it (the study's own attributes are info.py's).

Optuna keeps a trial as a FrozenTrial; autopelt's data rides in its user attributes (docs/architecture.md, "A study"),
and a finished trial's later test scores in one study attribute (`add_later_test`). This module alone knows their
names. Writers (the controller, recovery, the baselines) build attributes with
`attrs` and the functions beside it, which refuse a name that is not a field of `TrialRecord`; readers (the
live view and summary, the report, export, the dashboard) get a `TrialRecord` from `read`: one trial, typed
and frozen, like Optuna's own FrozenTrial. Every attribute is optional when read, and numbers are checked, so
a study written by an older autopelt reads the same way.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from autopelt.numbers import is_finite_number
from autopelt.study.attr_values import as_integer, as_mapping, as_number, as_text

TIME_BUDGET = "time budget"  # stopped_by of a trial the wall-time budget's deadline stopped
FOR_FINALISTS = "finalists"  # stopped_by of a trial stopped to free its worker for the finalists (finalists.py)
CUT_BY_DEADLINE = (TIME_BUDGET, FOR_FINALISTS)  # stopped_by of trials the wall-time budget cut short


@dataclass(frozen=True)
class TrialRecord:
    """One trial. The fields after `distributions` are its user attributes, named as stored (but those of
    STORED_AS)."""

    number: int
    state: TrialState
    values: tuple[float, ...] = ()  # objectives of a COMPLETE trial: dev metric (, stored params %)
    params: dict = field(default_factory=dict)  # what the space drew, by Optuna parameter name
    distributions: dict = field(default_factory=dict)

    spec: dict | None = None  # the delta spec (docs/design.md)
    summary: str | None = None  # "lora r8 + prefix L10"
    methods: tuple[str, ...] = ()
    params_stored: int | None = None
    params_trainable: int | None = None
    params_pct: float | None = None  # stored parameters, % of the base model
    hparams: dict = field(default_factory=dict)  # training hyper-parameters drawn from the space
    fidelity: int | None = None  # epochs reached
    max_fidelity: int | None = None
    full_fidelity: bool = False  # trained to its last epoch: only such trials answer the study
    baseline: str | None = None  # the preset a baseline trial trains; None for a searched trial
    baseline_drawn: bool = False  # a baseline queued with the space's parameters that draw it (samplers learn)
    dev: dict = field(default_factory=dict)  # {metric: value}
    test: dict = field(default_factory=dict)
    extra_tests: dict = field(default_factory=dict)  # {split: {metric: value}} (MNLI mismatched)
    gates: dict = field(default_factory=dict)  # {kind: {layer: mean gate}}, from either stored form
    result_dir: str | None = None  # the trial's result.json and delta weights
    fail_reason: str | None = None
    stopped_by: str | None = None  # "early stopping", "time budget" or FOR_FINALISTS
    seconds: float | None = None  # wall time, as the controller saw it
    controller: dict | None = None  # {host, pid, start} of the process that ran it
    retry_of: int | None = None  # the interrupted trial this one runs again
    intermediate: dict = field(default_factory=dict)  # {epoch: dev metric}; the attribute (multi-objective
    #                                                   studies) and Optuna's intermediate values, merged
    train_seconds: float | None = None  # the delta's own training steps (not its rate sweep's losing candidates)
    eval_seconds: float | None = None
    examples_per_second: float | None = None
    peak_memory_mb: float | None = None
    best_epoch: int | None = None
    precision: str | None = None  # what the trial computed in: fp32, bf16 or fp16
    learning_rate: float | None = None  # the rate it trained at
    lr_choice: dict = field(default_factory=dict)  # how: {"how": "given" | "sweep", "seconds", "candidates", ...}
    lr_from: dict = field(default_factory=dict)  # a searched trial's rate: {"reference", "scale", "families"}
    refines: dict = field(default_factory=dict)  # {"baseline", "factor"[, "batch_size"][, "places"][, "pooling"]}:
    #      that baseline's delta at factor x its rate (at that batch size, in more places, read through the mean)
    portfolio: dict = field(default_factory=dict)  # {"name", "rank"}: a portfolio member this trial trains
    finalist_of: dict = field(default_factory=dict)  # {"trial", "seed"}: a finalist, that trial's delta, rate and
    #                                                  batch again with another training seed (finalists.py); never
    #                                                  an answer
    # not an attribute: read from the finalists that train this one again (`read_all`)
    dev_seeds: tuple[float, ...] = ()  # its dev metric seed by seed, its own first, where it was trained again

    @property
    def is_answer(self) -> bool:
        """COMPLETE, trained to full fidelity, with a finite dev metric: a trial that answers the study.
        Early-stopped and failed trials appear in histories and counts, never as an answer."""
        return self.state == TrialState.COMPLETE and self.full_fidelity and bool(self.values) \
            and is_finite_number(self.values[0]) and not self.finalist_of

    @property
    def dev_value(self) -> float | None:
        """The dev metric the study ranks it by, as every reader shows it: the mean over seeds of a trial trained
        again (`dev_seeds`), else the first objective when COMPLETE, else the last one reported during training."""
        if len(self.dev_seeds) > 1:
            return sum(self.dev_seeds) / len(self.dev_seeds)
        if self.state == TrialState.COMPLETE and self.values and is_finite_number(self.values[0]):
            return float(self.values[0])
        return self.intermediate[max(self.intermediate)] if self.intermediate else None

    @property
    def dev_of(self) -> str:
        """What `dev_value` is: "mean of 2 seeds" where it was trained again, else ""."""
        return f"mean of {len(self.dev_seeds)} seeds" if len(self.dev_seeds) > 1 else ""

    @property
    def is_leader_variant(self) -> bool:
        """A portfolio member trained again at another factor of its rate (search/leaders.py)."""
        return is_finite_number(self.portfolio.get("leader")) and is_finite_number(self.portfolio.get("factor"))

    @property
    def phase(self) -> str:
        """Which step of the search ran it: "baseline unipelt_apl", "portfolio #1" (its rank, from 1), "portfolio
        #2 ×0.5 lr" (a leader's variant, search/leaders.py), "refined lora", "finalist #3 again", or "searched"
        (drawn by the sampler)."""
        if self.baseline:
            return f"baseline {self.baseline}"
        if is_finite_number(self.portfolio.get("rank")):
            return f"portfolio #{int(self.portfolio['rank']) + 1}"
        if self.is_leader_variant:
            return f"portfolio #{int(self.portfolio['leader']) + 1} ×{self.portfolio['factor']:g} lr"
        if self.refines.get("baseline"):
            return f"refined {self.refines['baseline']}"
        if is_finite_number(self.finalist_of.get("trial")):
            return f"#{self.finalist_of['trial']} again"
        return "searched"

    def test_value(self, metric: str) -> float | None:
        value = self.test.get(metric)
        return float(value) if is_finite_number(value) else None

    @property
    def label(self) -> str:
        """`#9 lora r8 + prefix L10`, `#0 [unipelt_apl] ...` for a baseline, `#7 [lora ×2 lr] lora r8` for a
        baseline's delta at another rate (refine.py)."""
        summary = self.summary or "?"
        again = self.finalist_of
        if is_finite_number(again.get("trial")):
            return f"#{self.number} [#{again['trial']} again, seed {again.get('seed')}] {summary}"
        if self.baseline:
            return f"#{self.number} [{self.baseline}] {summary}"
        if self.is_leader_variant:
            return f"#{self.number} [{self.phase}] {summary}"
        if self.refines.get("baseline") and is_finite_number(self.refines.get("factor")):
            batch = self.refines.get("batch_size")
            batch = f", batch {batch}" if isinstance(batch, int) else ""
            batch += ", in more places" if self.refines.get("places") else ""
            return f"#{self.number} [{self.refines['baseline']} ×{self.refines['factor']:g} lr{batch}] {summary}"
        return f"#{self.number} {summary}"

    @property
    def fidelity_text(self) -> str:
        """`2/3` epochs; '' when neither is known."""
        if self.fidelity is None and self.max_fidelity is None:
            return ""
        reached, top = ("?" if n is None else n for n in (self.fidelity, self.max_fidelity))
        return f"{reached}/{top}"


OPTUNA_FIELDS = ("number", "state", "values", "params", "distributions")
STORED_AS = {"finalist_of": "confirms"}  # fields stored under another name: the one studies were always written with
ATTRIBUTES = frozenset(f.name for f in dataclasses.fields(TrialRecord)) - set(OPTUNA_FIELDS) - {"dev_seeds"}


# -- reading ---------------------------------------------------------------------------------------------------


def read(trial: FrozenTrial) -> TrialRecord:
    """A FrozenTrial as autopelt's record; missing or malformed attributes read as unknown."""
    a = trial.user_attrs
    return TrialRecord(
        number=trial.number, state=trial.state,
        values=tuple(trial.values) if trial.values else (),
        params=dict(trial.params), distributions=dict(trial.distributions),
        spec=as_mapping(a.get("spec")) or None, summary=as_text(a.get("summary")),
        methods=tuple(str(m) for m in a.get("methods") or () if m),
        params_stored=as_integer(a.get("params_stored")), params_trainable=as_integer(a.get("params_trainable")),
        params_pct=as_number(a.get("params_pct")), hparams=as_mapping(a.get("hparams")),
        fidelity=as_integer(a.get("fidelity")), max_fidelity=as_integer(a.get("max_fidelity")),
        full_fidelity=a.get("full_fidelity") is True, baseline=baseline_of(trial),
        baseline_drawn=is_drawn_baseline(trial),
        dev=as_mapping(a.get("dev")), test=as_mapping(a.get("test")), extra_tests=as_mapping(a.get("extra_tests")),
        gates=gate_table(a.get("gates")), result_dir=as_text(a.get("result_dir")),
        fail_reason=as_text(a.get("fail_reason")), stopped_by=as_text(a.get("stopped_by")),
        seconds=as_number(a.get("seconds")), controller=as_mapping(a.get("controller")) or None,
        retry_of=as_integer(a.get("retry_of")), intermediate=_intermediate(trial),
        train_seconds=as_number(a.get("train_seconds")), eval_seconds=as_number(a.get("eval_seconds")),
        examples_per_second=as_number(a.get("examples_per_second")),
        peak_memory_mb=as_number(a.get("peak_memory_mb")), best_epoch=as_integer(a.get("best_epoch")),
        precision=as_text(a.get("precision")), learning_rate=as_number(a.get("learning_rate")),
        lr_choice=as_mapping(a.get("lr_choice")), lr_from=as_mapping(a.get("lr_from")),
        refines=refines_of(trial), finalist_of=finalist_of(trial),
        portfolio=as_mapping(a.get("portfolio")),
    )


class TrialKind(str, Enum):
    """What queued or drew a trial, read once from its attributes (`kind_of`): a finalist trains a trial again
    (finalists.py), a member a portfolio configuration, a baseline a preset, a refinement a baseline's delta reshaped
    (refine.py); the sampler drew the rest. What decides a trial's rate (search/rate_policy.py), whether it may be
    stopped early and how the summary names it."""

    FINALIST = "finalist"
    MEMBER = "member"
    BASELINE = "baseline"
    REFINEMENT = "refinement"
    DRAWN = "drawn"


def kind_of(trial) -> TrialKind:
    """The kind of a trial (live optuna.Trial or FrozenTrial)."""
    if finalist_of(trial).get("trial") is not None:
        return TrialKind.FINALIST
    if portfolio_of(trial):
        return TrialKind.MEMBER
    if baseline_of(trial):
        return TrialKind.BASELINE
    if is_refinement(trial):
        return TrialKind.REFINEMENT
    return TrialKind.DRAWN


def baseline_of(trial) -> str | None:
    """The preset a trial (live optuna.Trial or FrozenTrial) trains as a baseline, or None."""
    return as_text(trial.user_attrs.get("baseline"))


def is_refinement(trial) -> bool:
    """A trial (live optuna.Trial or FrozenTrial) that re-runs a baseline's delta at another rate (refine.py)."""
    return bool(refines_of(trial))


def refines_of(trial) -> dict:
    """{"baseline", "factor", ...} of a trial (live optuna.Trial or FrozenTrial) that re-runs a baseline's delta
    reshaped (refine.py); else {}."""
    return as_mapping(trial.user_attrs.get("refines"))


def finalist_of(trial) -> dict:
    """{"trial", "seed"} of a trial (live optuna.Trial or FrozenTrial) that trains another again as a finalist
    (finalists.py); else {}."""
    return as_mapping(trial.user_attrs.get(STORED_AS["finalist_of"]))


def portfolio_of(trial) -> dict:
    """{"name", "rank"} of a trial (live optuna.Trial or FrozenTrial) that trains a portfolio member; else {}."""
    return as_mapping(trial.user_attrs.get("portfolio"))


def is_drawn_baseline(trial) -> bool:
    """A baseline (live optuna.Trial or FrozenTrial) queued with the space's parameters that draw it."""
    return trial.user_attrs.get("baseline_drawn") is True


def trial_dirs(study) -> list[Path]:
    """The result folders of the trials the study holds as finished (complete, or stopped early), in trial order.

    A trial the study failed is left out even where its folder holds a finished result.json: a search killed
    after a trial wrote its result and before the study recorded it runs that trial again, and the ensemble must
    not count it twice (the resumed study's ensemble equals an uninterrupted one's)."""
    finished = (TrialState.COMPLETE, TrialState.PRUNED)
    return [Path(t.result_dir) for t in read_all(study) if t.result_dir and t.state in finished]


LATER_TESTS = "tests_scored_later"  # study attribute: {"<trial number>": {"test": {...}, "extra_tests": {...}}}


def read_all(study) -> list[TrialRecord]:
    """Every trial of an optuna.Study, in number order, with the test scores given it after it finished
    (`add_later_test`: a search trial is scored on test only if it answers the study)."""
    later = study.user_attrs.get(LATER_TESTS)
    later = later if isinstance(later, dict) else {}
    records = [read(trial) for trial in study.get_trials(deepcopy=False)]
    records = [_with_later(r, as_mapping(later.get(str(r.number)))) if str(r.number) in later else r for r in records]
    devs = seed_devs(records)
    return [dataclasses.replace(r, dev_seeds=tuple(devs[r.number])) if r.number in devs else r for r in records]


def seed_devs(records) -> dict[int, list[float]]:
    """{trial number: its dev metric and those of the finished finalists that train it again, seed by seed} for
    every answer trial that has at least one (finalists.py); other trials are absent."""
    records = list(records)
    again: dict[int, list[float]] = {}
    for r in records:
        trial = r.finalist_of.get("trial")
        if isinstance(trial, int) and r.state == TrialState.COMPLETE and r.full_fidelity and r.values \
                and is_finite_number(r.values[0]):
            again.setdefault(trial, []).append(float(r.values[0]))
    return {r.number: [float(r.values[0]), *again[r.number]] for r in records if r.is_answer and r.number in again}


def _with_later(record: TrialRecord, scores: dict) -> TrialRecord:
    if record.test or not as_mapping(scores.get("test")):
        return record
    return dataclasses.replace(record, test=as_mapping(scores["test"]),
                               extra_tests=as_mapping(scores.get("extra_tests")) or record.extra_tests)


def add_later_test(study, number: int, test: dict, extra_tests: dict | None = None) -> None:
    """Record the test scores of a finished trial (Optuna keeps a finished trial's attributes as they were; the
    study's attributes take them). Read back by `read_all`."""
    later = study.user_attrs.get(LATER_TESTS)
    later = dict(later) if isinstance(later, dict) else {}
    later[str(number)] = {"test": dict(test), "extra_tests": dict(extra_tests or {})}
    study.set_user_attr(LATER_TESTS, later)


def gate_table(gates: Any) -> dict[str, dict[int, float]]:
    """{kind: {layer: mean gate}} from either stored form: {kind: {"0": g}} or {kind: [g0, g1, ...]}."""
    if not isinstance(gates, dict):
        return {}
    table: dict[str, dict[int, float]] = {}
    for kind, layers in gates.items():
        items = layers.items() if isinstance(layers, dict) else enumerate(layers or [])
        values = {int(layer): float(value) for layer, value in items if _is_layer(layer) and is_finite_number(value)}
        if values:
            table[str(kind)] = values
    return table


def _intermediate(trial: FrozenTrial) -> dict[int, float]:
    # multi-objective studies keep the dev metric per epoch in a user attribute (Optuna cannot store them)
    reported = dict(trial.intermediate_values)
    stored = trial.user_attrs.get("intermediate")
    for step, value in (stored.items() if isinstance(stored, dict) else ()):
        if str(step).isdigit():
            reported.setdefault(int(step), value)
    return {int(step): float(value) for step, value in sorted(reported.items()) if is_finite_number(value)}


def _is_layer(key: Any) -> bool:
    return (isinstance(key, int) and not isinstance(key, bool)) or (isinstance(key, str) and key.isdigit())


# -- writing ---------------------------------------------------------------------------------------------------


def attrs(**values: Any) -> dict:
    """User attributes to write, by their stored names; a name that is not a TrialRecord field is a programming
    error."""
    unknown = sorted(set(values) - ATTRIBUTES)
    if unknown:
        raise KeyError(f"{unknown[0]!r} is not a trial attribute of autopelt's study record")
    return {STORED_AS.get(name, name): value for name, value in values.items()}


def write(trial, values: dict) -> None:
    """Set `values` (from `attrs` and friends) on a live optuna.Trial."""
    for key, value in values.items():
        trial.set_user_attr(key, value)


def _size(count) -> dict:
    """`count`: a delta.ParamCount."""
    return attrs(params_stored=int(count.stored), params_trainable=int(count.trainable),
                 params_pct=100.0 * count.stored / count.base)


def sized(spec: dict, summary: str, count) -> dict:
    """A drawn delta refused for its size: what it was, and how big."""
    return {**attrs(spec=spec, summary=summary), **_size(count)}


def planned(spec: dict, summary: str, count, max_fidelity: int, result_dir: str, hparams: dict) -> dict:
    """Known before training: the delta, its size, its training hyper-parameters, where its outputs go."""
    delta = attrs(spec=spec, summary=summary, methods=[entry["method"] for entry in spec["methods"]])
    return {**delta, **_size(count), **attrs(hparams=hparams, max_fidelity=max_fidelity, result_dir=result_dir)}


def trained(result: dict, fidelity: int, max_fidelity: int) -> dict:
    """Known after training, from the trial result JSON (docs/design.md)."""
    values = attrs(dev=result.get("dev") or {}, test=result.get("test") or {},
                   fidelity=int(result.get("epochs_run") or fidelity), max_fidelity=max_fidelity, full_fidelity=True)
    for key in ("gates", "extra_tests", "precision"):
        if result.get(key):
            values[key] = result[key]
    if isinstance(result.get("lr_choice"), dict):
        values["lr_choice"] = result["lr_choice"]
    for key in ("train_seconds", "eval_seconds", "examples_per_second", "peak_memory_mb", "best_epoch",
                "learning_rate"):
        if isinstance(result.get(key), (int, float)):
            values[key] = result[key]
    return attrs(**values)


def stopped(fidelity: int, why: str) -> dict:
    """Stopped before its last epoch: by the scheduler (early stopping) or by the wall-time budget."""
    return attrs(fidelity=fidelity, full_fidelity=False, stopped_by=why)


def failed(reason: str) -> dict:
    return attrs(fail_reason=reason)


def intermediate_values(values: dict[int, float]) -> dict:
    """The dev metric per epoch, for multi-objective studies, where Optuna keeps no intermediate values."""
    return attrs(intermediate={str(epoch): value for epoch, value in sorted(values.items())})


def queued_baseline(name: str, drawn: bool = False) -> dict:
    return attrs(baseline=name, baseline_drawn=True) if drawn else attrs(baseline=name)


def requeued(trial: FrozenTrial) -> dict:
    """A queued re-run of an interrupted trial: which one it replaces, and what it was queued as (a baseline, a
    portfolio member, a refinement, a finalist), so that it trains the same delta at the same rate."""
    old = read(trial)
    queued_as = {key: getattr(old, key) for key in ("refines", "finalist_of", "portfolio") if getattr(old, key)}
    values = attrs(retry_of=trial.number, **queued_as)
    return {**values, **queued_baseline(old.baseline, old.baseline_drawn)} if old.baseline else values


def failure_reason(result: dict) -> str | None:
    """Why a finished trial counts as failed, or None when its dev metric is usable."""
    if result.get("status") != "ok":
        return str(result.get("reason") or "the trial failed without a reason")
    value = result.get("dev_metric")
    if not is_finite_number(value):
        return f"dev metric is {value!r} (not a finite number)"
    return None


def objective_values(result: dict, params_pct: float, multi_objective: bool) -> list[float]:
    """(dev metric) or (dev metric, stored params %): the study's objectives, in its directions' order."""
    values = [float(result["dev_metric"])]
    return values + [float(params_pct)] if multi_objective else values

"""The study a search writes to: created on the first run, resumed by every later run of the same command.

A resumed study must be about the same thing: its task, space, objectives and protocol are stored as study
user attributes (docs/architecture.md; `StudyInfo` of autopelt/study/info.py) and compared before anything is
written.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
import zlib

import optuna

from autopelt.errors import UserError
from autopelt.models import model_name
from autopelt.search.plan import SearchPlan
from autopelt.search.study_names import model_short
from autopelt.search.recovery import GRACE_SECONDS, HEARTBEAT_SECONDS
from autopelt.study.info import StudyInfo, read_study, write_study
from autopelt.study.storage import hide_password, open_storage, sqlite_path

TRIAL_OPTIONS = ("batch_size", "max_length", "quantize")  # flags given to every trial, kept by the study


def study_info(plan: SearchPlan) -> StudyInfo:
    return StudyInfo(
        task=plan.task, model=model_name(plan.model), model_path=plan.model, space=plan.space.name,
        space_fingerprint=str(plan.space.fingerprint), metric=plan.metric, direction="maximize",
        objectives=(f"dev {plan.dev_label}",) + (("stored params %",) if plan.options.multi_objective else ()),
        protocol=plan.protocol, epochs=plan.epochs, baseline_pooling=plan.pooling,
        trial_options={name: getattr(plan.options, name) for name in TRIAL_OPTIONS},
    )


def check_existing(plan: SearchPlan) -> tuple[SearchPlan, list]:
    """UserError if the plan's study exists for another task, space, ...; else (the plan with the trial options
    the study recorded where this run leaves them out: `with_recorded`, its trials' records), a new study's
    (plan, []). Reads only (a missing SQLite file stays missing)."""
    from autopelt.study.record import read_all

    path = sqlite_path(plan.storage)
    if path is not None and not path.exists():
        return plan, []
    storage = _open(plan.storage, write_ahead_log=False)
    try:
        if plan.study_name not in optuna.get_all_study_names(storage):
            return plan, []
        study = optuna.load_study(study_name=plan.study_name, storage=storage)
        check_same(study, plan)
        return with_recorded(plan, read_study(study)), read_all(study)
    finally:
        storage.engine.dispose()


def with_recorded(plan: SearchPlan, stored: StudyInfo) -> SearchPlan:
    """The plan with each trial option (`TRIAL_OPTIONS`) this run leaves out as the study recorded it, so that a
    resumed study trains its later trials as its first (`check_same` refused a given one that differs)."""
    recorded = {name: value for name, value in (stored.trial_options or {}).items()
                if name in TRIAL_OPTIONS and value is not None and getattr(plan.options, name) is None}
    if not recorded:
        return plan
    return dataclasses.replace(plan, options=dataclasses.replace(plan.options, **recorded))


def open_study(plan: SearchPlan) -> optuna.Study:
    """Load the plan's study, or create it with its attributes; UserError if it exists for something else."""
    path = sqlite_path(plan.storage)
    existed = path is None or path.exists()
    storage = _open(plan.storage)
    if existed and plan.study_name in optuna.get_all_study_names(storage):
        study = optuna.load_study(study_name=plan.study_name, storage=storage, sampler=_sampler(plan))
        check_same(study, plan)
        return study
    try:
        study = optuna.create_study(
            study_name=plan.study_name, storage=storage, directions=plan.directions, sampler=_sampler(plan),
        )
    except optuna.exceptions.DuplicatedStudyError:  # another process created it a moment ago
        study = optuna.load_study(study_name=plan.study_name, storage=storage, sampler=_sampler(plan))
        check_same(study, plan)
        return study
    info = study_info(plan)
    write_study(study, info)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        study.set_metric_names(list(info.objectives))
    return study


def check_same(study: optuna.Study, plan: SearchPlan) -> None:
    """A resumed study must have been made for this task, space, model, protocol and objectives."""
    stored, wanted = read_study(study), study_info(plan)
    differences = [
        f"{key} {getattr(stored, key)!r} (now {getattr(wanted, key)!r})"
        for key in ("task", "space_fingerprint", "protocol", "epochs")
        if getattr(stored, key) is not None and getattr(stored, key) != getattr(wanted, key)
    ]
    for name in TRIAL_OPTIONS:
        given, kept = getattr(plan.options, name), (stored.trial_options or {}).get(name)
        if given is not None and given != kept:
            differences.append(f"{_flag(name)} {kept if kept is not None else 'as each trial draws it'} "
                               f"(now {given})")
    if stored.model is not None and model_short(model_name(stored.model)) != model_short(model_name(plan.model)):
        differences.append(f"model {stored.model!r} (now {model_name(plan.model)!r})")
    if [d.name.lower() for d in study.directions] != plan.directions:
        differences.append(f"{len(study.directions)} objective(s) (now {len(plan.directions)})")
    if differences:
        raise UserError(
            f"study {plan.study_name!r} in {hide_password(plan.storage)} was made for "
            f"{'; '.join(differences)}; pick another --study-name"
        )


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _sampler(plan: SearchPlan) -> optuna.samplers.BaseSampler:
    # Processes sharing a study must not draw the same deltas: the seed is mixed with the process id.
    seed = zlib.crc32(f"{plan.options.seed}:{os.getpid()}".encode())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if plan.options.sampler == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        if plan.options.multi_objective:
            return optuna.samplers.TPESampler(seed=seed, constant_liar=True)
        return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True, constant_liar=True)


def _open(url: str, write_ahead_log: bool = True):
    """The storage with heartbeats on: the controller records them for the trials it runs (recovery.py)."""
    return open_storage(url, HEARTBEAT_SECONDS, GRACE_SECONDS, write_ahead_log)

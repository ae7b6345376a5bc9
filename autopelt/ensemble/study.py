"""A study's ensemble: from its finished trials' folders (result.json + predictions.npz) to the ensemble, whether
it answers under the margin rule, and the lines a search prints at its end.

Candidates are the trials that finished ("ok") with dev predictions on the same dev set as the best trial (the
same data seed and dev labels; a search fixes the data seed across its trials). The metric is the task's own
(`Task.compute_metrics`), read through fast numpy for accuracy and Pearson. `DEFAULT_RULE` and `DEFAULT_MARGIN`
are what bench/ensemble_loo.py's leave-one-task-out chose on the meta-dataset's predictions, each fold on the
other tasks' dev halves: Caruana's best-prefix climb up to 32 picks, no margin (20 of 21 folds; the other chose
8 picks).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from autopelt.ensemble.select import Ensemble, Rule, accuracy, answers, pearson, select
from autopelt.errors import UserError

DEFAULT_RULE = Rule(max_size=32, stop="best", bags=0)
DEFAULT_MARGIN = 0.0  # in the metric's units


@dataclass(frozen=True)
class Member:
    """One trial folder as a candidate: its folder, what it was, its dev metric as recorded."""

    folder: Path
    summary: str
    dev: float
    result: dict = field(repr=False, default_factory=dict)


@dataclass(frozen=True)
class StudyEnsemble:
    """The ensemble of a study's trials: `members` with `weights` (heaviest first), the ensemble's dev metric and
    the single answer's (best dev) beside it, whether the ensemble answers under `margin`, and what was left out."""

    members: list[Member]
    weights: list[float]
    dev: float
    single: Member
    single_dev: float
    answers: bool
    margin: float
    rule: Rule
    metric: str
    left_out: list[str] = field(default_factory=list)
    test: float | None = None  # its test metric (`with_test`), computed after every choice; None until then
    single_test: float | None = None  # the single answer's, computed alike beside it

    @property
    def forward_passes(self) -> int:
        """The ensemble's inference cost: one forward pass a member."""
        return len(self.members)

    def lines(self) -> list[str]:
        """The summary a search prints at its end."""
        verdict = ("the ensemble answers" if self.answers else
                   f"the single answer stays (the ensemble's dev gain {100 * (self.dev - self.single_dev):+.2f} "
                   f"is not above the margin {100 * self.margin:.2f})")
        test = f"; test {self.metric} {self.test:.4f}" if self.test is not None else ""
        test += f" vs the single answer's {self.single_test:.4f}" if test and self.single_test is not None else ""
        out = [f"ensemble of {len(self.members)} trials (greedy selection with replacement, Caruana et al. 2004): "
               f"dev {self.metric} {self.dev:.4f} vs the single answer's {self.single_dev:.4f}, on the dev rows "
               f"that chose its members ({self.single.summary}){test}; {verdict}; inference: {self.forward_passes} "
               f"forward passes an input"]
        out += [f"  {weight:.3f} × {member.summary} (dev {member.dev:.4f}) {member.folder}"
                for member, weight in zip(self.members, self.weights)]
        if self.left_out:
            shown = "; ".join(self.left_out[:2]) + (f"; … {len(self.left_out) - 2} more" if len(self.left_out) > 2
                                                    else "")
            out.append(f"  left out: {len(self.left_out)} trial(s) ({shown})")
        return out

    def brief(self) -> dict:
        """What is said of the ensemble beside the single answer (an export's metrics.json, the report): its
        size and inference cost, dev of both on the dev rows that chose its members, test of both (None until
        `with_test`), whether it answers."""
        return {"members": len(self.members), "forward_passes": self.forward_passes, "metric": self.metric,
                "dev": self.dev, "single_dev": self.single_dev, "dev_rows": "the dev rows that chose its members",
                "test": self.test, "single_test": self.single_test, "answers": self.answers, "margin": self.margin}

    def to_dict(self) -> dict:
        return {"members": [{"folder": str(m.folder), "summary": m.summary, "dev": m.dev, "weight": w}
                            for m, w in zip(self.members, self.weights)],
                "dev": self.dev, "single": {"folder": str(self.single.folder), "summary": self.single.summary,
                                            "dev": self.single_dev},
                "answers": self.answers, "margin": self.margin, "rule": self.rule.to_dict(), "metric": self.metric,
                "forward_passes": self.forward_passes, "left_out": self.left_out, "test": self.test,
                "single_test": self.single_test}


def study_ensemble(trial_dirs: list, rule: Rule = DEFAULT_RULE, margin: float = DEFAULT_MARGIN,
                   max_members: int | None = None, answer_dir=None) -> StudyEnsemble:
    """The ensemble of the finished trials in `trial_dirs` (each a folder with result.json and predictions.npz).

    Args:
        trial_dirs: the study's trial folders (any order; unfinished ones and ones without predictions are left
            out and listed in `left_out`).
        rule: size, stopping rule and bagging of the selection (select.Rule).
        margin: the ensemble answers only when its dev metric is more than this above the single answer's.
        max_members: keep only the heaviest k members (k forward passes at inference).
        answer_dir: the folder of the trial the study answers with (its answer rule: autopelt/study/answers.py:
            a finalist's mean over seeds, the best dev, the portfolio's favourite on a tie); the ensemble is set
            beside it. None, or a folder that is no candidate: beside the candidate of the best dev.

    Returns:
        The StudyEnsemble; with one usable trial, that trial alone (answers False).

    Raises:
        UserError: no trial folder holds a finished trial with dev predictions.
    """
    from autopelt.ensemble import select as selection

    candidates, left_out = _candidates(trial_dirs)
    if not candidates:
        raise UserError("no finished trial with dev predictions (predictions.npz) to ensemble; train trials with "
                        "keep_predictions")
    task_name, metric_name = candidates[0][0].result.get("task"), candidates[0][0].result.get("metric")
    regression = candidates[0][1]["dev"].ndim == 1
    metric = metric_of(task_name, metric_name, regression)
    labels = candidates[0][1]["dev_labels"]
    chosen: Ensemble = select([c[1]["dev"] for c in candidates], labels, rule, regression, metric)
    if max_members is not None:
        chosen = selection.limit(chosen, [c[1]["dev"] for c in candidates], labels, max_members, regression, metric)
    answer = next((i for i, c in enumerate(candidates) if answer_dir is not None
                   and Path(c[0].folder).resolve() == Path(answer_dir).resolve()), None)
    if answer is not None:  # its dev on these predictions, as the ensemble's is measured
        chosen = dataclasses.replace(chosen, single=answer, single_dev=metric(candidates[answer][1]["dev"], labels))
    members = [candidates[i][0] for i in chosen.members]
    return StudyEnsemble(members=members, weights=[float(chosen.weights[i]) for i in chosen.members],
                         dev=chosen.dev, single=candidates[chosen.single][0], single_dev=chosen.single_dev,
                         answers=answers(chosen, margin), margin=margin, rule=rule,
                         metric=metric_name or ("pearson" if regression else "accuracy"), left_out=left_out)


def metric_of(task_name: str | None, metric_name: str | None, regression: bool):
    """(averaged outputs, labels) -> the task's metric: numpy for accuracy and Pearson, else the task's own
    `compute_metrics` (MCC, F1, …)."""
    if metric_name in (None, "accuracy") and not regression:
        return accuracy
    if metric_name in (None, "pearson") and regression:
        return pearson
    from autopelt.data import get_task

    task = get_task(task_name)
    return lambda outputs, labels: float(task.compute_metrics(outputs, labels)[metric_name])


def _candidates(trial_dirs) -> tuple[list[tuple[Member, dict]], list[str]]:
    """(member, predictions) of every usable trial, best recorded dev first; and why the others were left out."""
    from autopelt.train.predictions import dense, load

    usable, left_out = [], []
    for folder in map(Path, trial_dirs):
        if not (folder / "result.json").is_file():
            left_out.append(f"{folder}: stopped before its end (early stopping or the deadline)")
            continue
        try:
            result = json.loads((folder / "result.json").read_text())
        except (OSError, json.JSONDecodeError):
            left_out.append(f"{folder}: an unreadable result.json")
            continue
        if result.get("status") != "ok" or result.get("dev_metric") is None:
            left_out.append(f"{folder}: not finished ({result.get('status')})")
            continue
        try:
            predictions = load(folder)
        except UserError as error:
            left_out.append(str(error))
            continue
        predictions = {**predictions, "dev": dense(predictions, "dev")}
        member = Member(folder, result.get("summary") or folder.name, float(result["dev_metric"]), result)
        usable.append((member, predictions))
    usable.sort(key=lambda c: -c[0].dev)  # ties keep the folders' order
    if not usable:
        return [], left_out
    kept = [usable[0]]
    for candidate in usable[1:]:
        reason = _differs(usable[0], candidate)
        if reason:
            left_out.append(f"{candidate[0].folder}: {reason}")
        else:
            kept.append(candidate)
    return kept, left_out


def _differs(best, other) -> str | None:
    (a, pa), (b, pb) = best, other
    for key, what in (("task", "task"), ("model", "base model")):
        if a.result.get(key) != b.result.get(key):
            return f"another {what} ({b.result.get(key)} vs {a.result.get(key)})"
    if _data_seed(a.result) != _data_seed(b.result) or not np.array_equal(pa["dev_labels"], pb["dev_labels"]):
        return "another dev set (data seed or dev labels differ)"
    if pa["dev"].shape != pb["dev"].shape:
        return f"another label set (dev predictions {pb['dev'].shape} vs {pa['dev'].shape})"
    return None


def _data_seed(result: dict):
    settings = result.get("settings") or {}
    return settings["data_seed"] if settings.get("data_seed") is not None else settings.get("seed")


def of_study(study, max_members: int | None = None) -> StudyEnsemble | None:
    """The ensemble of a study's finished trials (`autopelt.study.record.trial_dirs`), set beside the study's
    answer (autopelt/study/answers.py); None where no finished trial has dev predictions (a generation study's
    trials keep none)."""
    from autopelt.study import answers as study_answers
    from autopelt.study.record import read_all, trial_dirs

    found = study_answers.best(read_all(study), study_answers.maximizes(study))
    try:
        return study_ensemble(trial_dirs(study), max_members=max_members,
                              answer_dir=found.result_dir if found else None)
    except UserError:
        return None


def with_test(chosen: StudyEnsemble, say=lambda line: None, compute: bool = True) -> StudyEnsemble:
    """The ensemble with its test metric: each member's test predictions (train.saved.test_predictions_of: kept
    where it scored test, else one forward pass from its saved delta, the members and the single answer on one
    backbone load), averaged with its weight, scored against the test labels as dev was. Test is read here and
    nowhere in the choice of members or weights. `say` gets one line before the forward passes. `compute` False:
    kept predictions only, and the ensemble as it is (test None) where one of them kept none. Raises UserError
    where a member kept no delta or predictions."""
    from autopelt.ensemble.select import combine
    from autopelt.train.saved import kept_test_predictions, test_predictions_of

    folders = [member.folder for member in chosen.members]
    single = next((i for i, folder in enumerate(folders) if _same(folder, chosen.single.folder)), None)
    folders_scored = folders + ([chosen.single.folder] if single is None else [])
    if compute:
        say(f"scoring the ensemble's {len(chosen.members)} members on the test split …")
        scored = test_predictions_of(folders_scored)
    else:
        scored = [kept_test_predictions(folder) for folder in folders_scored]
        if any(s is None for s in scored):
            return chosen
    labels = scored[0]["test_labels"]
    if any(not np.array_equal(s["test_labels"], labels) for s in scored[1:]):
        raise UserError("the ensemble's members were scored on different test rows; train them on one data seed")
    regression = scored[0]["test"].ndim == 1
    first = chosen.members[0].result
    metric = metric_of(first.get("task"), first.get("metric"), regression)
    averaged = combine([s["test"] for s in scored[: len(folders)]], chosen.weights)
    alone = scored[len(folders) if single is None else single]["test"]
    return dataclasses.replace(chosen, test=float(metric(averaged, labels)), single_test=float(metric(alone, labels)))


def _same(a, b) -> bool:
    return Path(a).resolve() == Path(b).resolve()

"""Ensemble selection from a library of trained deltas (Caruana et al. 2004, "Ensemble selection from libraries
of models"): greedy forward selection with replacement on the dev predictions.

A candidate is one trained delta's dev predictions: class probabilities (rows, classes) for a classifier, values
(rows,) for a regression. The ensemble's prediction is the weighted average of its members' (probabilities, or
values); a member chosen n times out of N steps weighs n/N. Selection starts from the best single candidate
(Caruana's initialisation with the one best model), then adds, step by step and with replacement, the candidate
whose addition gives the highest dev metric, up to `Rule.max_size` members. `Rule.stop` decides which prefix of
that hill-climb is the ensemble: "no_gain" stops at the first step that does not improve dev; "best" climbs to
`max_size` and keeps the best prefix (Caruana's choice; ties go to the smaller ensemble). With `Rule.bags` > 0,
selection runs on `bags` random subsets of `bag_fraction` of the candidates and the bags' weights are averaged
(Caruana's section 2.3, against over-fitting a small dev set). The rule is chosen by leave-one-task-out
(bench/ensemble_loo.py), never by test scores.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from autopelt.errors import UserError

Metric = Callable[[np.ndarray, np.ndarray], float]  # (averaged outputs, labels) -> higher is better


@dataclass(frozen=True)
class Rule:
    """How large an ensemble may grow and where its hill-climb stops (module docstring)."""

    max_size: int = 16
    stop: str = "best"  # "best" prefix of the climb, or stop at the first step with "no_gain"
    bags: int = 0  # 0: no bagging
    bag_fraction: float = 0.5
    seed: int = 0  # draws the bags

    def __post_init__(self):
        if self.max_size < 1:
            raise UserError(f"an ensemble's max_size must be at least 1, not {self.max_size}")
        if self.stop not in ("best", "no_gain"):
            raise UserError(f"an ensemble's stop rule is 'best' or 'no_gain', not {self.stop!r}")
        if self.bags < 0 or not 0 < self.bag_fraction <= 1:
            raise UserError("an ensemble's bags must be ≥ 0 and bag_fraction in (0, 1]")

    def to_dict(self) -> dict:
        return {"max_size": self.max_size, "stop": self.stop, "bags": self.bags, "bag_fraction": self.bag_fraction,
                "seed": self.seed}


@dataclass(frozen=True)
class Ensemble:
    """A selected ensemble: `weights[i]` of candidate i (0 for the unchosen; they sum to 1), its dev metric, the
    single best candidate and its dev metric, and the climb's dev metric after each step."""

    weights: np.ndarray
    dev: float
    single: int
    single_dev: float
    climb: tuple[float, ...] = field(default=())

    @property
    def members(self) -> list[int]:
        """The chosen candidates, heaviest first (ties by index)."""
        chosen = np.flatnonzero(self.weights > 0)
        return sorted(chosen.tolist(), key=lambda i: (-self.weights[i], i))

    @property
    def gain(self) -> float:
        """The ensemble's dev metric minus the single best candidate's."""
        return self.dev - self.single_dev


def accuracy(outputs: np.ndarray, labels: np.ndarray) -> float:
    """The fraction of rows whose most probable class is the label (the first of tied classes, as argmax)."""
    return float(np.mean(np.argmax(outputs, axis=-1) == labels))


def pearson(outputs: np.ndarray, labels: np.ndarray) -> float:
    """Pearson correlation; 0 for a constant side, as autopelt.data.metrics scores it."""
    x = outputs.astype(np.float64) - outputs.mean()
    y = labels.astype(np.float64) - labels.mean()
    norm = np.sqrt((x * x).sum() * (y * y).sum())
    return float((x * y).sum() / norm) if norm > 0 else 0.0


def default_metric(regression: bool) -> Metric:
    """Accuracy for a classifier, Pearson for a regression: the meta-dataset's metrics."""
    return pearson if regression else accuracy


def combine(predictions: list[np.ndarray] | np.ndarray, weights) -> np.ndarray:
    """The weighted average of the candidates' predictions (weights sum to 1; zero weights skipped)."""
    weights = np.asarray(weights, dtype=np.float64)
    total = None
    for prediction, weight in zip(predictions, weights):
        if weight > 0:
            term = np.asarray(prediction, dtype=np.float32) * np.float32(weight)
            total = term if total is None else total + term
    if total is None:
        raise UserError("an ensemble needs at least one member of positive weight")
    return total


def select(predictions: list[np.ndarray], labels: np.ndarray, rule: Rule = Rule(), regression: bool = False,
           metric: Metric | None = None) -> Ensemble:
    """Greedy forward selection with replacement (Caruana et al. 2004) over `predictions`.

    Args:
        predictions: one array a candidate, all of the same shape: (rows, classes) probabilities or (rows,) values.
        labels: (rows,) class ids or gold values.
        rule: size, stopping rule and bagging.
        regression: whether the outputs are values (default metric Pearson) or probabilities (accuracy).
        metric: (averaged outputs, labels) -> float, higher is better; default `default_metric(regression)`.

    Returns:
        The Ensemble (weights over the candidates; the single best candidate beside it).

    Raises:
        UserError: no candidates, or candidates of different shapes or of another row count than the labels.
    """
    stack = _stack(predictions, labels)
    metric = metric or default_metric(regression)
    singles = np.array([metric(p, labels) for p in stack])
    single = int(np.argmax(singles))  # the first of tied bests: the order the candidates were given
    if rule.bags == 0:
        weights, climb = _climb(stack, labels, rule, metric, np.arange(len(stack)), single)
    else:
        rng = np.random.default_rng(rule.seed)
        weights = np.zeros(len(stack))
        per_bag = max(1, round(rule.bag_fraction * len(stack)))
        for _ in range(rule.bags):
            pool = np.sort(rng.choice(len(stack), size=per_bag, replace=False))
            start = int(pool[np.argmax(singles[pool])])
            bag_weights, _ = _climb(stack, labels, rule, metric, pool, start)
            weights += bag_weights / rule.bags
        climb = ()
    dev = metric(combine(stack, weights), labels)
    return Ensemble(weights=weights, dev=float(dev), single=single, single_dev=float(singles[single]),
                    climb=tuple(climb))


def _stack(predictions, labels) -> np.ndarray:
    if len(predictions) == 0:
        raise UserError("no candidates to ensemble: the study has no finished trial with dev predictions")
    shapes = {np.shape(p) for p in predictions}
    if len(shapes) != 1:
        raise UserError(f"candidates' dev predictions differ in shape ({sorted(shapes)}): were they scored on one "
                        "dev set and one label set?")
    stack = np.stack([np.asarray(p, dtype=np.float32) for p in predictions])
    if stack.shape[1] != len(labels):
        raise UserError(f"candidates predict {stack.shape[1]} dev rows but there are {len(labels)} dev labels")
    return stack


def _climb(stack, labels, rule: Rule, metric: Metric, pool: np.ndarray, start: int) -> tuple[np.ndarray, list]:
    """Counts of the kept prefix of one hill-climb over `pool`, as weights, and the climb's dev after each step."""
    total = stack[start].copy()
    chosen = [start]
    climb = [metric(total, labels)]
    best_size, best = 1, climb[0]
    while len(chosen) < rule.max_size:
        scores = [metric((total + stack[j]) / (len(chosen) + 1), labels) for j in pool]
        pick = int(pool[int(np.argmax(scores))])  # the first candidate of the top score
        score = max(scores)
        if rule.stop == "no_gain" and score <= climb[-1]:
            break
        total += stack[pick]
        chosen.append(pick)
        climb.append(score)
        if score > best:
            best_size, best = len(chosen), score
    kept = chosen[:best_size] if rule.stop == "best" else chosen
    weights = np.bincount(kept, minlength=len(stack)).astype(np.float64)
    return weights / weights.sum(), climb


def answers(ensemble: Ensemble, margin: float) -> bool:
    """The margin rule: the ensemble is the answer only when its dev metric beats the single best candidate's by
    more than `margin` (in the metric's units: 0.005 is half a point of accuracy) and it has two or more members."""
    return len(ensemble.members) > 1 and ensemble.gain > margin


def limit(ensemble: Ensemble, predictions: list[np.ndarray], labels: np.ndarray, k: int, regression: bool = False,
          metric: Metric | None = None) -> Ensemble:
    """The ensemble limited to its k heaviest members (weights renormalised): k forward passes at inference."""
    if k < 1:
        raise UserError(f"an ensemble limited to k members needs k ≥ 1, not {k}")
    keep = ensemble.members[:k]
    weights = np.zeros_like(ensemble.weights)
    weights[keep] = ensemble.weights[keep]
    weights /= weights.sum()
    metric = metric or default_metric(regression)
    dev = metric(combine(_stack(predictions, labels), weights), labels)
    return Ensemble(weights=weights, dev=float(dev), single=ensemble.single, single_dev=ensemble.single_dev)

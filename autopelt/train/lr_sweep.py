"""Choosing a learning rate for a delta, a task and a budget: a sweep by successive halving on the trial's own
schedule, as a careful user would sweep, at a fraction of the cost.

Each candidate rate trains from the same initial state, on the same batches, to the trial's first dev evaluation
(the end of epoch 1 by default); the best (learned, then dev metric, then dev loss) goes on to the end from where
it stands, so its run is exactly the run a trial given that rate would make. Candidates start at a decade of rates where
parameter-efficient methods usually learn and walk along a ladder of half-decades while the best one sits at an
edge, or, while none has learned anything (beaten predicting one class on dev), between and below them. A sweep
of n candidates costs (n - 1) first-evaluation segments more than one trial, and one segment more when none has
learned by the first evaluation.

Ranking by the first evaluation fails in measured ways, each handled here: a narrow band that learns (midpoints
on either side of the best, once); nothing learned yet (walk down); a small lead that is not learning (a rate has
learned only once it beats one class by LEARNED_SE standard errors); the fastest rate on the edge of stability
(back off to the rung below when it has BACK_OFF_SHARE of the gain and BACK_OFF_LOSS_SHARE of the loss drop); and
no rate learned at all (the two likeliest train on to the second evaluation). Each but the midpoints is kept
because replaying the sweep without it on tasks it was not chosen on (lab/experiments/sweep-rules/sweep_rules_loo.py)
did worse for LoRA or prefix-tuning; the midpoints are undecided there (the replays without them leave the grid).
docs/learning-rates.md has the cases, the judgement and the rules it removed.

One sweep serves every kind of task, its differences a `SweepPlan`: classification and regression (CLASSIFICATION)
start at START with every rule; generation (GENERATION) ranks by dev loss alone, with no floor to learn past.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from autopelt.train import device as devices
from autopelt.train.loop import NonFiniteLoss, Objective, Training, TrainOutcome

LADDER = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 1e-1)  # half-decades
START = (1e-3, 3e-3, 1e-2)
MAX_CANDIDATES = 6
GENERATION_START = (3e-4, 1e-3, 3e-3)  # a generation sweep's first candidates: LoRA's usual decade on decoders
GENERATION_MAX = 5  # candidates at most, walking the half-decade ladder while the best sits at an edge
LEARNED_SE = 3.0  # a candidate has learned when its dev metric beats predicting one class by this many standard
LEARNED_MARGIN = 0.01  # errors of the dev metric (a proportion of the dev rows), and at least by this much
BACK_OFF_SHARE = 0.75  # the rate below the best is nearly as good when it has this share of the best's gain
BACK_OFF_LOSS_SHARE = 0.6  # and this share of its drop in dev loss from the rung above (docs/learning-rates.md)
# the special cases, by name: a sweep without one of them is what leave-one-task-out compares against
# (lab/experiments/sweep-rules/sweep_rules_loo.py; docs/learning-rates.md says which earned their place)
RULES = frozenset({"midpoints", "walk_down", "learned_margin", "back_off", "second_round"})


@dataclass(frozen=True)
class SweepPlan:
    """What a kind of task's sweep starts from and may do: its first candidates, how many it tries at most, the
    special cases in play (of RULES), and what the choice records of a candidate's evaluation."""
    start: tuple[float, ...]
    max_candidates: int
    rules: frozenset
    recorded: Callable[[dict], dict]


def _metric_and_loss(entry: dict) -> dict:
    return {key: entry[key] for key in ("dev_metric", "dev_loss")}


def _rounded_loss(entry: dict) -> dict:
    loss = entry["dev_loss"]
    return {"dev_loss": round(loss, 5) if loss is not None and math.isfinite(loss) else None}


CLASSIFICATION = SweepPlan(START, MAX_CANDIDATES, RULES, _metric_and_loss)
# Generation has no one-class floor to learn past (its dev metric is minus the dev loss): the rules that need one,
# back-off and the second round are not in play, and a sweep walks along the ladder while its best sits at an edge.
GENERATION = SweepPlan(GENERATION_START, GENERATION_MAX, frozenset(), _rounded_loss)


@dataclass
class LearningRateChoice:
    rate: float
    how: str  # "given", or "sweep"
    seconds: float = 0.0  # spent on the candidates that lost
    candidates: dict[str, dict] = field(default_factory=dict)  # rate -> its first evaluation
    steps: int = 0  # of each candidate to its first evaluation
    backed_off_from: float | None = None  # the best rate at the first evaluation, when the rung above it collapsed
    second: dict[str, dict] = field(default_factory=dict)  # rate -> its second evaluation, when none had learned

    def to_dict(self) -> dict:
        out = {"rate": self.rate, "how": self.how, "seconds": round(self.seconds, 3)}
        if self.how == "sweep":
            out.update(candidates=self.candidates, steps=self.steps)
        if self.backed_off_from is not None:
            out["backed_off_from"] = self.backed_off_from
        if self.second:
            out["second"] = self.second
        return out


def train_at_chosen_rate(objective: Objective, settings, plan: SweepPlan = CLASSIFICATION,
                         report: Callable[[dict], object] | None = None,
                         on_step: Callable[[int, int, float], None] | None = None,
                         outcome: TrainOutcome | None = None) -> tuple[TrainOutcome, LearningRateChoice]:
    """Train `objective.model` in place at `settings.learning_rate`, or, when it is None, at the rate a sweep by
    `plan` chooses; the best evaluated state restored."""
    if settings.learning_rate is not None:
        run = Training(objective, settings, report, on_step, outcome)
        run.run()
        return run.finish(), LearningRateChoice(settings.learning_rate, "given")
    winner, choice = _Sweep(objective, settings, plan, on_step).run()
    winner.report, winner.on_step = report, on_step
    if outcome is not None:
        winner.adopt(outcome)
    for entry in winner.outcome.history:  # the scheduler sees the evaluations so far, as in any trial
        if winner.tell(entry):
            break
    winner.run()
    return winner.finish(), choice


class _Sweep:
    def __init__(self, objective: Objective, settings, plan: SweepPlan, on_step):
        self.objective, self.model, self.settings, self.device = objective, objective.model, settings, objective.device
        self.plan, self.rules, self.on_step = plan, plan.rules, on_step
        self.initial = [p.detach().clone() for p in self.model.parameters() if p.requires_grad]
        self.rng = devices.rng_state(self.device)
        self.tried: dict[float, tuple[Training, dict, float]] = {}  # rate -> (run, its state, seconds)
        self.steps_done = 0
        self._start(*objective.floor())

    def _start(self, floor: float | None, rows: int) -> None:
        """What the rankings compare with: the dev metric of predicting one class (`floor`, on `rows` dev rows);
        None for regression."""
        self.floor = floor
        self.margin = None if floor is None else learned_margin(floor, rows) if "learned_margin" in self.rules else 0.0
        self.midpoints: list[float] | None = None if "midpoints" in self.rules else []  # around the first best
        #                                                                     inside that learned nothing

    def _explore(self) -> None:
        """Try the start rates, then the next the rules ask for, up to the plan's most candidates."""
        for rate in self.plan.start:
            self._try(rate)
        while len(self.tried) < self.plan.max_candidates:
            rate = self._next()
            if rate is None:
                break
            self._try(rate)

    def run(self) -> tuple[Training, LearningRateChoice]:
        self._explore()
        if not any(self._finite(rate) for rate in self.tried):
            rates = ", ".join(f"{rate:g}" for rate in sorted(self.tried))
            raise NonFiniteLoss(f"the loss became non-finite at every learning rate tried ({rates})")
        steps = self.tried[self._best()][0].outcome.steps
        second = self._second_round()
        best, backed_off_from = self._choose(second)
        winner, state, _ = self.tried[best]
        winner.restore(state)
        lost = sum(seconds for rate, (_, _, seconds) in self.tried.items() if rate != best)
        return winner, LearningRateChoice(best, "sweep", lost, self._evaluations(self.tried, 0), steps,
                                          backed_off_from, self._evaluations(second, 1))

    def _choose(self, second: list[float]) -> tuple[float, float | None]:
        """(the rate that goes on, the best one when backed off from it): the better of a second round at its second
        evaluation, else the best at the first (of equals the lowest rate), backed off when it sits on the edge of
        stability."""
        if second:
            return max(second, key=lambda rate: self._score(rate, 1)), None
        return self._back_off(max(sorted(self.tried), key=self._score))

    def _evaluations(self, rates, index: int) -> dict[str, dict]:
        return {f"{rate:g}": self.plan.recorded(self._entry(rate, index)) for rate in sorted(rates)}

    def _second_pair(self) -> list[float]:
        """When no candidate learned by the first evaluation: the lowest in dev loss and the one that moved furthest
        from predicting one class (by the learned margin, either way; else the next lowest in loss), to train on to
        the second evaluation. None when something learned or the trial ends at its first."""
        finite = sorted((rate for rate in self.tried if self._finite(rate)), key=self._score, reverse=True)
        if "second_round" not in self.rules or self.floor is None or len(finite) < 2 \
                or any(self._learned(rate) for rate in finite):
            return []
        leader, others = finite[0], finite[1:]
        if self.tried[leader][0].done:
            return []

        def moved(rate: float) -> float:
            return abs(self._first(rate)["dev_metric"] - self.floor)

        furthest = max(others, key=moved)
        return [leader, furthest if moved(furthest) >= self.margin else others[0]]

    def _second_round(self) -> list[float]:
        """The `_second_pair` trained on to their second evaluation; the rates that reached it."""
        pair = self._second_pair()
        for rate in pair:
            run, state, seconds = self.tried[rate]
            started = time.perf_counter()
            run.restore(state)
            run.on_step = self._progress(run, second=True)
            try:
                run.run(until_evaluations=2)
                diverged = False
            except NonFiniteLoss:
                diverged = True
            self.steps_done += run.outcome.steps - state["outcome"].steps
            if diverged:  # it stays as it was at the first evaluation, and out of the second round
                run.restore(state)
            else:
                state = run.snapshot()
            self.tried[rate] = (run, state, seconds + time.perf_counter() - started)
        return [rate for rate in pair if len(self.tried[rate][0].outcome.history) >= 2]

    def _next(self) -> float | None:
        """The rung beyond the edge where the best rate sits; below the lowest when every rate failed. When none has
        learned and the best is inside the rates tried: first the midpoints on either side of it (once), then the
        rung below the lowest. None when the best learned inside the rates tried, or the ladder ends."""
        tried, best = sorted(self.tried), self._best()
        failed = not any(self._finite(rate) for rate in tried)
        learned = any(self._learned(rate) for rate in tried)
        if self.midpoints is None and not (learned or failed) and tried[0] < best < tried[-1]:
            below, above = self._neighbours(best)
            self.midpoints = [_two_digits(math.sqrt(best * above)), _two_digits(math.sqrt(best * below))]
        if self.midpoints and not learned:
            return self.midpoints.pop(0)
        walk_down = "walk_down" in self.rules and not learned and best != tried[-1]
        if failed or best == tried[0] or walk_down:
            index = LADDER.index(tried[0]) - 1
        elif best == tried[-1]:
            index = LADDER.index(tried[-1]) + 1
        else:
            return None
        return LADDER[index] if 0 <= index < len(LADDER) else None

    def _neighbours(self, rate: float) -> tuple[float | None, float | None]:
        """The tried rates just below and just above `rate` (None past either end)."""
        tried = sorted(self.tried)
        index = tried.index(rate)
        return (tried[index - 1] if index > 0 else None), (tried[index + 1] if index + 1 < len(tried) else None)

    def _back_off(self, best: float) -> tuple[float, float | None]:
        """(the rate to continue, the best one if that is not it): the rate tried just below the best when the one
        just above it did not learn (the best sits on the edge of stability) and the one below has learned nearly
        as much: BACK_OFF_SHARE of the best's gain over predicting one class, and BACK_OFF_LOSS_SHARE of its drop
        in dev loss from the rung above (when that one's loss is finite; a rung above whose loss is no higher than
        the best's did not collapse, and nothing is backed off). A safer rate at a small cost."""
        below, above = self._neighbours(best)
        if "back_off" not in self.rules or above is None or self._learned(above) or below is None \
                or not self._learned(below):
            return best, None
        if self.floor is not None and self._gain(below) < BACK_OFF_SHARE * self._gain(best):
            return best, None
        reference = self._loss(above)
        if math.isfinite(reference):
            drop_best, drop_below = reference - self._loss(best), reference - self._loss(below)
            if not drop_best > 0:  # the rung above lost no more than the best: slow, not collapsed
                return best, None
            if not drop_below >= BACK_OFF_LOSS_SHARE * drop_best:  # (a NaN loss below does not back off)
                return best, None
        return below, best

    def _loss(self, rate: float) -> float:
        """The candidate's dev loss at the first evaluation (NaN where it has none)."""
        loss = self._first(rate)["dev_loss"]
        return math.nan if loss is None else float(loss)

    def _gain(self, rate: float) -> float:
        return self._first(rate)["dev_metric"] - self.floor

    def _try(self, rate: float) -> None:
        started = time.perf_counter()
        with torch.no_grad():
            for param, value in zip((p for p in self.model.parameters() if p.requires_grad), self.initial):
                param.copy_(value)
        devices.set_rng_state(self.device, self.rng)
        run = Training(self.objective, self.settings.replace(learning_rate=rate))
        run.on_step = self._progress(run)
        try:
            run.run(until_evaluations=1)
        except NonFiniteLoss as error:  # too high a rate: a candidate that lost, not a failed trial
            run.outcome.history.append({"dev_metric": None, "dev_loss": None, "failed": str(error)})
        self.steps_done += run.outcome.steps
        self.tried[rate] = (run, run.snapshot(), time.perf_counter() - started)

    def _progress(self, run: Training, second: bool = False):
        """Steps of every candidate on one count; the total as planned so far (the winner's rest included)."""
        if self.on_step is None:
            return None
        done_before = self.steps_done - run.outcome.steps  # a candidate trained on counts its steps from the start
        first = min(self.settings.eval_every or run.steps_per_epoch, run.total)
        planned = max(len(self.tried) + (0 if second else 1), len(self.plan.start)) * first + run.total - first
        if second:
            planned += min(first, run.total - first)  # the other of the two trained on
        return lambda step, total, loss: self.on_step(done_before + step, planned, loss)

    def _first(self, rate: float) -> dict:
        """The candidate's first evaluation (`dev_metric` None: its loss became non-finite)."""
        return self._entry(rate, 0)

    def _entry(self, rate: float, index: int) -> dict:
        return self.tried[rate][0].outcome.history[index]

    def _finite(self, rate: float, index: int = 0) -> bool:
        metric = self._entry(rate, index)["dev_metric"]
        return metric is not None and math.isfinite(metric)

    def _learned(self, rate: float, index: int = 0) -> bool:
        """The candidate's evaluation (the first by default) is finite and beats predicting one class by the learned
        margin (any finite one, for regression)."""
        if not self._finite(rate, index):
            return False
        return self.floor is None or self._entry(rate, index)["dev_metric"] > self.floor + self.margin

    def _score(self, rate: float, index: int = 0) -> tuple[bool, float, float]:
        """Whether it learned, then the dev metric, then dev loss (lower is better), at its evaluation `index`. Early
        in training several rates still predict one class and tie on the metric (prefix-tuning on SST-2: 0.581,
        0.582, 0.581, 0.581); the loss tells tied ones apart."""
        entry = self._entry(rate, index)
        if not self._finite(rate, index):
            return False, -math.inf, -math.inf
        loss = entry["dev_loss"] if entry["dev_loss"] is not None else math.inf
        return self._learned(rate, index), entry["dev_metric"], -loss

    def _best(self) -> float:
        return max(self.tried, key=self._score)


def _two_digits(rate: float) -> float:
    """A rate as a person writes it (5.5e-3, not 5.477e-3): what the study records is what it trained at."""
    return float(f"{rate:.2g}")


def learned_margin(floor: float, rows: int) -> float:
    """How far a dev metric must beat predicting one class (`floor`) on `rows` dev rows to count as learned:
    LEARNED_SE standard errors of a proportion at the floor (at one half for a floor that is no proportion, as a
    correlation's 0), and at least LEARNED_MARGIN. SST-2 and SNLI at K=1000 (1,000 dev rows): 4.7 and 4.5 points."""
    share = floor if 0 < floor < 1 else 0.5
    return max(LEARNED_MARGIN, LEARNED_SE * math.sqrt(share * (1 - share) / max(rows, 1)))


def one_class_metric(data) -> float | None:
    """The dev metric of predicting one class for every row, for the best such class (the majority class for
    accuracy); None for regression or unlabelled dev rows."""
    task, labels = data.task, data.dev.labels
    if task.regression or labels is None or len(labels) == 0:
        return None
    return max(task.compute_metrics(np.full(len(labels), label, dtype=np.int64), labels)[task.metric]
               for label in range(task.num_labels))

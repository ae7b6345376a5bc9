"""Strategies simulated on the meta-dataset: what each answers on a task at a budget, by dev only.

Budgets are in full-trial equivalents: the seconds of the reference trial (LoRA r8 on query/value, 3 epochs) on
that task. Every strategy runs at least one trial. A strategy's answer is the trial with the best dev metric among
those it trained to full fidelity (successive halving answers from its last rung), under the search's answer rule
(autopelt/study/answers.py): where a portfolio ran, its first configuration answers unless the best other beats it
by `Task.margin` standard errors; the answer's test metric is what the simulation reports. No strategy reads a
test metric to choose; `Task.oracle` and `by_test_at_other_seed` do, for reporting only.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass

from autopelt.portfolio.config import rate_text
from metalearning.metadata import MetaDataset, answer
from autopelt.study.answers import MARGIN_SE, beats

REFERENCE = "lora-r8-qv@3e-3"
ETA = 3  # successive halving keeps the best third of a rung (Hyperband's and ASHA's default reduction)
LOW_FIDELITY = 1  # epochs at the first rung
LADDER = (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2)  # the LoRA r8 (q,v) rates of the design: the sweep's half-decades
SWEEP_START, SWEEP_MAX = (1e-3, 3e-3, 1e-2), 6  # as train/lr_sweep.py starts and caps its candidates
UNIPELT = ("unipelt-apl@1e-3", "unipelt-apl@3e-3")


@dataclass(frozen=True)
class Outcome:
    config: str
    dev: float
    test: float
    seconds: float
    trials: int
    trained: tuple[str, ...] = ()  # the configurations trained to full fidelity, in the order they ran


class Task:
    """One task's trials at one seed, with costs in seconds."""

    def __init__(self, meta: MetaDataset, task: str, seed: int = 0, margin: float = MARGIN_SE):
        self.meta, self.name, self.seed, self.margin = meta, task, seed, margin
        reference = meta.trial(task, REFERENCE, seed)
        self.unit = answer(reference).seconds  # one full-trial equivalent

    def at(self, config: str, fidelity: int | None = None):
        record = self.meta.trial(self.name, config, self.seed)
        return answer(record, fidelity) if record else None

    def full(self, configs: list[str], budget: float, favourite: bool = False) -> Outcome:
        """Train `configs` one after another to full fidelity while the budget lasts (at least one); `favourite`:
        the first is a portfolio's favourite (`answer`)."""
        head = configs[0] if favourite and configs else None
        seconds, trained = 0.0, []
        for config in configs:
            result = self.at(config)
            if result is None:
                continue
            if trained and seconds + result.seconds > budget * self.unit:
                break
            seconds += result.seconds
            trained.append(config)
        return self.outcome(self.answer(trained, head), seconds, len(trained), trained)

    def halving(self, configs: list[str], budget: float, favourite: bool = False) -> Outcome:
        """Successive halving over the first n configurations, n as large as the budget allows: all at
        LOW_FIDELITY epochs, the first and the best of the others by dev (1/ETA of them in all) on to full
        fidelity; the answer is the best of those (`answer`; `favourite`: the first is a portfolio's favourite)."""
        head = configs[0] if favourite and configs else None
        configs = [c for c in configs if self.at(c) is not None]
        for n in range(len(configs), 0, -1):
            first = configs[:n]
            low = {c: self.at(c, LOW_FIDELITY) for c in first}
            # the first configuration, the prior's favourite, always goes on: a first epoch ranks poorly
            keep = [first[0]] + sorted(first[1:], key=lambda c: -low[c].dev)[: math.ceil(n / ETA) - 1]
            seconds = sum(low[c].seconds for c in first) + sum(self.at(c).seconds - low[c].seconds for c in keep)
            if seconds <= budget * self.unit or n == 1:
                trained = [c for c in first if c in keep]
                return self.outcome(self.answer(trained, head), seconds, n, trained)
        raise ValueError("no configuration to run")

    def answer(self, trained: list[str], favourite: str | None = None) -> str:
        """The search's answer among configurations trained to full fidelity (autopelt/study/answers.py): the best
        dev, the earlier on a tie; the portfolio's `favourite` instead, where it was trained, unless the best beats
        it by the margin (`beats`)."""
        best = max(trained, key=lambda c: self.at(c).dev)  # max keeps the first of equals
        if favourite in trained and best != favourite and not beats(self.at(best).dev, self.at(favourite).dev,
                                                                     self.margin):
            return favourite
        return best

    def outcome(self, config: str, seconds: float, trials: int, trained: list[str]) -> Outcome:
        result = self.at(config)
        return Outcome(config, result.dev, result.test, seconds, trials, tuple(trained))

    def oracle(self, configs: list[str]) -> float:
        """The best test metric of any configuration (for reporting distances only)."""
        return max(self.at(c).test for c in configs if self.at(c) is not None)


def portfolio_then_random(task: Task, portfolio: list[str], others: list[str], budget: float,
                          rng: random.Random, share: float = 0.5) -> Outcome:
    """The default strategy: successive halving over the portfolio with `share` of the budget, then draws at
    full fidelity from the rest of the design (the sampler, simulated as uniform draws: a lower bound for TPE); the
    answer among all it trained to full fidelity, the portfolio's first its favourite (`Task.answer`)."""
    first = task.halving(portfolio, budget * share, favourite=True)
    left = budget - first.seconds / task.unit
    if left <= 0:
        return first
    rest = [c for c in others if c not in portfolio]
    rng.shuffle(rest)
    if not rest or left * task.unit < task.at(rest[0]).seconds:
        return first
    extra = task.full(rest, left)
    trained = [*first.trained, *extra.trained]
    return task.outcome(task.answer(trained, portfolio[0] if portfolio[0] in first.trained else None),
                        first.seconds + extra.seconds, first.trials + extra.trials, trained)


def random_search(task: Task, configs: list[str], budget: float, draws: int, seed: int,
                  halving: bool = False) -> float:
    """The mean test metric of random search's answer over `draws` orders of the design: every draw trained to
    full fidelity, or (`halving`) with successive halving over the draws, as a search with ASHA early stopping runs
    them (the same procedure as the portfolio's, over a random order)."""
    rng = random.Random(seed)
    tests = []
    for _ in range(draws):
        order = list(configs)
        rng.shuffle(order)
        tests.append((task.halving(order, budget) if halving else task.full(order, budget)).test)
    return statistics.mean(tests)


def by_test_at_other_seed(meta: MetaDataset, task: str, configs: list[str], seeds: tuple[int, int]) -> float:
    """The test metric at seed `seeds[1]` of the configuration with the best test metric at seed `seeds[0]`: what a
    choice among `configs` from one run of each, knowing even their test metric, is worth on `task` when the chosen
    configuration is trained again (for reporting only; an estimate from one pair of seeds, not a bound)."""
    chosen, again = seeds
    best = max(configs, key=lambda c: answer(meta.trial(task, c, chosen)).test)
    return answer(meta.trial(task, best, again)).test


def tuned_lora(task: Task) -> Outcome:
    """LoRA r8 (q,v) with its rate chosen as train/lr_sweep.py's sweep chooses it, on the design's ladder: the
    three start rates to the first epoch, then the next half-decade while the best sits at an edge (at most
    SWEEP_MAX candidates), the best by first-epoch dev trained on to the end; its cost is the losers' first epochs
    and the winner's whole run. The live sweep's special cases (midpoints, walking down while nothing has learned,
    the learned margin, backing off) are not simulated: they need rates the ladder does not hold."""
    def name(rate: float) -> str:
        return f"lora-r8-qv@{rate_text(rate)}"

    tried = [rate for rate in SWEEP_START if task.at(name(rate)) is not None]
    while True:
        best = max(tried, key=lambda rate: task.at(name(rate), LOW_FIDELITY).dev)
        index = LADDER.index(best)
        step = -1 if best == min(tried) else 1 if best == max(tried) else 0
        beyond = LADDER[index + step] if step and 0 <= index + step < len(LADDER) else None
        if beyond is None or beyond in tried or task.at(name(beyond)) is None or len(tried) >= SWEEP_MAX:
            break
        tried.append(beyond)
    result = task.at(name(best))
    losers = sum(task.at(name(rate), LOW_FIDELITY).seconds for rate in tried if rate != best)
    return Outcome(name(best), result.dev, result.test, result.seconds + losers, len(tried))

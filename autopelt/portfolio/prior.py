"""The task-aware prior: a portfolio learned from the meta-dataset's tasks most like the user's.

A shipped portfolio file may carry a `prior` section: every meta-dataset task's meta-features (metafeatures.py)
and its dev score per configuration (the mean over the seeds collected), the configurations themselves, and `k`.
For a new task, the k tasks nearest in meta-feature space (Euclidean, each feature divided by its spread across
the meta-dataset's tasks; a feature that does not vary there is not used) are the ones its portfolio is learned
from, by the same greedy selection as the global one (select.py; TabRepo's zero-shot selection restricted to
neighbours, as auto-sklearn 1.0 warm-starts from its nearest datasets). A task farther from its nearest than any
meta-dataset task is from its own nearest (`unlike`) is unlike all of them: the global portfolio answers, and the
search says so. `k` was chosen by leave-one-task-out (lab/metalearning/prior.py; docs/portfolio.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autopelt.portfolio import select
from autopelt.portfolio.config import Config
from autopelt.portfolio.metafeatures import NAMES, MetaFeatures


@dataclass(frozen=True)
class Prior:
    k: int  # nearest tasks a portfolio is learned from
    tasks: dict[str, MetaFeatures]
    scores: dict[str, dict[str, float]]  # task -> configuration -> dev score
    configs: dict[str, Config]
    unlike: float  # distances past this from the nearest task mean "unlike every task"

    @property
    def scale(self) -> np.ndarray:
        """Each feature's spread across the tasks (0 where it does not vary: that feature is not used)."""
        return np.stack([f.vector() for f in self.tasks.values()]).std(axis=0)

    def distances(self, features: MetaFeatures, among: list[str] | None = None) -> list[tuple[str, float]]:
        """(task, distance) for the tasks `among` (default: all), nearest first; ties by name."""
        scale = self.scale
        used = scale > 0
        here = features.vector()[used] / scale[used]
        out = [(name, float(np.linalg.norm(self.tasks[name].vector()[used] / scale[used] - here)))
               for name in (among or list(self.tasks))]
        return sorted(out, key=lambda item: (round(item[1], 9), item[0]))

    def portfolio(self, features: MetaFeatures, size: int) -> tuple[list[Config], list[tuple[str, float]], bool]:
        """(the members for a task of these features, the nearest tasks they were learned from with distances,
        whether the task is like the meta-dataset's: False means the global portfolio over every task)."""
        nearest = self.distances(features)
        like = nearest[0][1] <= self.unlike
        chosen = nearest[: self.k] if like else nearest
        members = select.greedy_portfolio({t: self.scores[t] for t, _ in chosen}, size)
        return [self.configs[name] for name in members], chosen, like

    def to_dict(self) -> dict:
        return {"policy": "nearest tasks", "k": self.k, "unlike": round(self.unlike, 4), "features": list(NAMES),
                "tasks": {name: {"features": f.to_dict(), "scores": self.scores[name]}
                          for name, f in self.tasks.items()},
                "configs": {name: config.to_dict() for name, config in self.configs.items()}}

    @classmethod
    def from_dict(cls, data: dict, member) -> Prior:
        """`member(entry) -> Config` reads a configuration as the portfolio file's members are read."""
        tasks = {name: MetaFeatures.from_dict(entry["features"]) for name, entry in data["tasks"].items()}
        scores = {name: {c: float(v) for c, v in entry["scores"].items()} for name, entry in data["tasks"].items()}
        return cls(k=int(data["k"]), tasks=tasks, scores=scores,
                   configs={name: member(entry) for name, entry in data["configs"].items()},
                   unlike=float(data["unlike"]))


def unlike_threshold(tasks: dict[str, MetaFeatures]) -> float:
    """The largest distance from a task to its nearest other task: past it, a new task is unlike all of them."""
    probe = Prior(k=1, tasks=tasks, scores={}, configs={}, unlike=0.0)
    return max(probe.distances(f, [t for t in tasks if t != name])[0][1] for name, f in tasks.items())

"""Reading the meta-dataset: its trials, and what a trial answers at a fidelity.

A trial keeps the state of its best dev evaluation so far (train/loop.py), so at fidelity e (epochs trained) its
answer is the epoch <= e with the best dev metric: that epoch's dev metric selects, its test metric reports.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from autopelt.errors import UserError

FORMAT = "autopelt-meta-dataset"
CALIBRATED = "~cal@"  # in the name of a calibrated member's trial (metalearning/calibrated.py)
SHIPPED = Path(__file__).parent / "data"


@dataclass(frozen=True)
class Answer:
    dev: float
    test: float
    seconds: float  # training and dev evaluation up to that fidelity


def answer(record: dict, fidelity: int | None = None) -> Answer | None:
    """What a trial answers after `fidelity` epochs (None: all it ran); None for a failed trial."""
    epochs = record.get("epochs") or []
    if record.get("status") != "ok" or not epochs:
        return None
    seen = epochs[: fidelity or len(epochs)]
    best = max(seen, key=lambda e: e["dev"])  # the first of equal dev values, as the trainer keeps it
    return Answer(best["dev"], best["test"], seen[-1]["seconds"])


@dataclass(frozen=True)
class MetaDataset:
    header: dict
    records: tuple[dict, ...]

    @cached_property
    def tasks(self) -> list[str]:
        return sorted({r["task"] for r in self.records})

    @cached_property
    def by_key(self) -> dict[tuple, dict]:
        return {(r["task"], r["config"], r["seed"]): r for r in self.records}

    def configs(self, seed: int = 0, complete: bool = True) -> list[str]:
        """Configurations with a trial at `seed` (on every task, if `complete`), in the order first recorded."""
        names = list(dict.fromkeys(r["config"] for r in self.records if r["seed"] == seed))
        if complete:
            names = [c for c in names if all((t, c, seed) in self.by_key for t in self.tasks)]
        return names

    def trial(self, task: str, config: str, seed: int = 0) -> dict | None:
        return self.by_key.get((task, config, seed))

    @cached_property
    def seeds(self) -> tuple[int, ...]:
        """Every training seed with a trial."""
        return tuple(sorted({r["seed"] for r in self.records}))

    @cached_property
    def selection_seeds(self) -> tuple[int, ...]:
        """The training seeds the design was run at: those at which at least half of seed 0's configurations are
        complete on every task (a seed run for a few configurations only, as the dropout study's, is not one)."""
        base = len(self.configs(seed=0))
        seeds = sorted({r["seed"] for r in self.records})
        return tuple(s for s in seeds if s == 0 or 2 * len(self.configs(seed=s)) >= base)

    def candidates(self) -> list[str]:
        """The configurations complete on every task at every selection seed: what a portfolio chooses from. A
        calibrated member's trial (metalearning/calibrated.py, MEMBER~cal@RATE) is another model's reading of
        MiniLM's member at that task's rate, never a configuration of the design, even where two tasks share its
        name."""
        complete = [set(self.configs(seed=s)) for s in self.selection_seeds]
        return [c for c in self.configs(seed=0) if all(c in seen for seen in complete) and CALIBRATED not in c]

    def dev_scores(self, tasks: list[str], configs: list[str]) -> dict[str, dict[str, float]]:
        """task -> config -> dev metric at full fidelity, the mean over the selection seeds: a configuration that
        collapses at one seed scores low, so the selection prefers what holds across seeds."""
        return {t: {c: sum(answer(self.trial(t, c, s)).dev for s in self.selection_seeds) / len(self.selection_seeds)
                    for c in configs} for t in tasks}


def load(path: str | Path) -> MetaDataset:
    """A meta-dataset file written by `python -m metalearning finish`."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise UserError(f"cannot read meta-dataset {path}: {error}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise UserError(f"{path} is not an autopelt meta-dataset (format {data.get('format')!r} "
                        f"where {FORMAT!r} was expected)" if isinstance(data, dict) else f"{path}: not a JSON object")
    header = {k: v for k, v in data.items() if k != "records"}
    return MetaDataset(header, tuple(data["records"]))


def shipped(model: str = "all-MiniLM-L6-v2") -> MetaDataset:
    path = SHIPPED / f"{model}.json"
    if not path.exists():
        raise UserError(f"no meta-dataset ships for model {model!r}; build one with `python -m metalearning collect`")
    return load(path)

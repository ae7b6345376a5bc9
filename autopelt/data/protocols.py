"""Train/dev/test protocols. The test split is only ever scored, never used to choose anything.

- `full`: all of train except a dev part carved from it at random (default: 10% of train, at least 1 row,
  at most 1,000 — big enough to rank trials, small enough that large tasks keep ~all their training data);
  the official validation split is the test set.
- `k-shot` (UniPELT's low-resource protocol): shuffle train with the seed, the first K rows train, the next
  1,000 rows (fewer if train runs out; `info["dev_size"]` says how many) are dev; official validation is test.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from autopelt.data.tasks import Task, get_task
from autopelt.errors import UserError

K_SHOT_DEV_SIZE = 1000
FULL_DEV_FRACTION = 0.1
FULL_DEV_CAP = 1000


@dataclass(frozen=True)
class Splits:
    """The rows a trial trains on, selects on (dev) and reports on (test), and how they were made."""

    train: tuple[dict, ...]
    dev: tuple[dict, ...]
    test: tuple[dict, ...]
    info: dict = field(default_factory=dict)


def parse_protocol(value: str | int) -> str | int:
    """"full" or a positive K (int, or a string like "1000" / "k1000")."""
    text = str(value).strip().lower()
    if text == "full":
        return "full"
    digits = text[1:] if text.startswith("k") else text
    if not digits.lstrip("-").isdigit() or int(digits) <= 0:
        raise UserError(f"protocol {value!r}: use 'full' or a positive number of training examples K")
    return int(digits)


def make_splits(split_rows: dict, task: str | Task, protocol: str | int, seed, dev_size: int | None = None) -> Splits:
    """Apply the protocol ("full" or K) to a task's loaded splits with an explicit seed."""
    protocol = parse_protocol(protocol)
    if protocol == "full":
        return full_protocol(split_rows, task, seed, dev_size)
    return k_shot_protocol(split_rows, task, protocol, seed, K_SHOT_DEV_SIZE if dev_size is None else dev_size)


def full_protocol(split_rows: dict, task: str | Task, seed, dev_size: int | None = None) -> Splits:
    """All of train minus a random dev part; the official validation split as test."""
    task = get_task(task)
    train_rows = split_rows[task.train_split]
    if len(train_rows) < 2:
        raise UserError(f"task {task.name!r}: train has {len(train_rows)} row(s); need 2 to carve a dev set")
    size = _default_dev_size(len(train_rows)) if dev_size is None else dev_size
    _check_dev_size(task, size, len(train_rows) - 1)
    order = _rng(seed).permutation(len(train_rows))
    dev_positions = set(order[:size].tolist())
    train = tuple(row for position, row in enumerate(train_rows) if position not in dev_positions)
    dev = tuple(train_rows[position] for position in order[:size])
    return _splits("full", None, train, dev, split_rows[task.test_split], seed)


def k_shot_protocol(split_rows: dict, task: str | Task, k: int, seed, dev_size: int = K_SHOT_DEV_SIZE) -> Splits:
    """K random training rows, up to `dev_size` further training rows as dev, official validation as test."""
    task = get_task(task)
    train_rows = split_rows[task.train_split]
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 < k < len(train_rows):
        raise UserError(
            f"k={k!r} does not fit task {task.name!r}: its train split has {len(train_rows):,} rows, "
            f"so K must be 1..{len(train_rows) - 1:,} (at least one row must remain for dev)"
        )
    _check_dev_size(task, dev_size, None)
    order = _rng(seed).permutation(len(train_rows))
    train = tuple(train_rows[position] for position in order[:k])
    dev = tuple(train_rows[position] for position in order[k : k + dev_size])
    return _splits("k-shot", int(k), train, dev, split_rows[task.test_split], seed)


def _default_dev_size(train_size: int) -> int:
    return max(1, min(FULL_DEV_CAP, round(FULL_DEV_FRACTION * train_size)))


def _check_dev_size(task: Task, size, largest: int | None) -> None:
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
        raise UserError(f"task {task.name!r}: dev size must be a positive integer, not {size!r}")
    if largest is not None and size > largest:
        raise UserError(f"task {task.name!r}: dev size {size:,} leaves no training rows (train has {largest + 1:,})")


def _rng(seed) -> np.random.Generator:
    # A Generator passed in is used as is (the caller owns its stream); an int makes a fresh one.
    if seed is None:
        raise TypeError("a split needs an explicit seed (int or numpy Generator), not None")
    return seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)


def _splits(name: str, k: int | None, train, dev, test, seed) -> Splits:
    info = {
        "name": name, "k": k, "train_size": len(train), "dev_size": len(dev), "test_size": len(test),
        "seed": None if isinstance(seed, np.random.Generator) else seed,
    }
    return Splits(train=tuple(train), dev=tuple(dev), test=tuple(test), info=info)

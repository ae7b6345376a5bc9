"""What a search may spend: a number of trials or a wall time (`--budget`), and a delta size (`--max-params`).

Both are parsed from the user's words and checked before anything is created, so a typo costs nothing.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from autopelt.errors import UserError

_TIME_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_COUNT_UNITS = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9}


@dataclass(frozen=True)
class TrialBudget:
    """Trials that train (complete or stopped early), counted over the whole study, across processes."""

    trials: int

    def __str__(self) -> str:
        return f"{self.trials} trials"


@dataclass(frozen=True)
class TimeBudget:
    """Wall time of this process; trials still running at the deadline are stopped and recorded."""

    seconds: float

    def __str__(self) -> str:
        return format_duration(self.seconds)


Budget = TrialBudget | TimeBudget


def parse_budget(text: str | int) -> Budget:
    """`20` -> 20 trials; `90s`, `30m`, `2h`, `1.5h`, `1d` -> a wall time."""
    raw = str(text).strip().lower()
    if re.fullmatch(r"\d+", raw):
        if int(raw) == 0:
            raise UserError("--budget must be at least 1 trial")
        return TrialBudget(int(raw))
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([smhd])", raw)
    if not match:
        raise UserError(f"--budget {text!r}: give a number of trials (20) or a time (90s, 30m, 2h)")
    seconds = float(match[1]) * _TIME_UNITS[match[2]]
    if seconds <= 0:
        raise UserError("--budget must be a positive time")
    return TimeBudget(seconds)


@dataclass(frozen=True)
class ParamLimit:
    """A cap on a delta's stored parameters: a share of the base model (percent) or a count."""

    percent: float | None = None
    count: int | None = None

    def excess(self, stored: int, base: int) -> str | None:
        """None when `stored` fits, else why not (one line)."""
        if self.count is not None and stored > self.count:
            return f"{format_count(stored)} stored parameters > --max-params {format_count(self.count)}"
        if self.percent is not None and 100.0 * stored / base > self.percent:
            return f"{100.0 * stored / base:.4g}% stored parameters > --max-params {self.percent:g}%"
        return None

    def __str__(self) -> str:
        return f"{self.percent:g}%" if self.percent is not None else format_count(self.count)


def parse_max_params(text: str | int | None) -> ParamLimit | None:
    """`0.5%` -> 0.5 % of the base model; `100k`, `2M`, `12345` -> a number of stored parameters."""
    if text is None or str(text).strip() == "":
        return None
    raw = str(text).strip().lower().replace("_", "").replace(",", "")
    if raw.endswith("%"):
        value = _number(raw[:-1], text)
        if not 0 < value <= 100:
            raise UserError(f"--max-params {text!r}: a percentage must be in (0, 100]")
        return ParamLimit(percent=value)
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([kmb]?)", raw)
    if not match:
        raise UserError(f"--max-params {text!r}: give a share of the base model (0.5%) or a count (100k, 2M, 12345)")
    count = int(round(float(match[1]) * _COUNT_UNITS[match[2]]))
    if count <= 0:
        raise UserError(f"--max-params {text!r} must be positive")
    return ParamLimit(count=count)


def _number(raw: str, text) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise UserError(f"--max-params {text!r}: {raw!r} is not a number") from None
    if not math.isfinite(value):
        raise UserError(f"--max-params {text!r} must be finite")
    return value


def format_count(n: int | float) -> str:
    """12345 -> '12.3k', 2_000_000 -> '2M'."""
    for unit, size in (("B", 10**9), ("M", 10**6), ("k", 10**3)):
        if abs(n) >= size:
            return f"{n / size:.3g}{unit}"
    return str(int(n))


def format_duration(seconds: float) -> str:
    """3725 -> '1h02m', 125 -> '2m05s', 7.2 -> '7s'."""
    seconds = int(round(max(seconds, 0)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"

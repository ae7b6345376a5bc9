"""How autopelt reads a stored attribute's value: a missing or malformed one reads as unknown (None, or {} for a
mapping), and numbers are checked, so that a study written by an older autopelt, or by hand, reads the same way."""

from __future__ import annotations

from typing import Any

from autopelt.numbers import is_finite_number


def as_mapping(value: Any) -> dict:
    return dict(value) if isinstance(value, dict) else {}


def as_text(value: Any) -> str | None:
    return str(value) if value not in (None, "") else None


def as_number(value: Any) -> float | None:
    return float(value) if is_finite_number(value) else None


def as_integer(value: Any) -> int | None:
    return int(value) if is_finite_number(value) else None

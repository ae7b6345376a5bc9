"""The one test of "is this a usable number" (study attributes, trial results, method fields)."""

from __future__ import annotations

import math
from typing import Any


def is_finite_number(value: Any) -> bool:
    """An int or float that is finite; True and False are not numbers here."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

"""What a method field accepts: declared once, beside the field (its method's file), and read twice: by the
spec's own checks, and by the search spaces (autopelt/search/space_schema.py), whose schema is derived from the spec.

    rank: int = declare("rank r of the update", 8, POSITIVE_INT)

Metadata a field may carry besides its help text and kind:
    search=False   search spaces may not set it (the spec still accepts it)
    abbrev="r"     it gives the delta's size in a spec's summary: `lora r8`
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from autopelt.numbers import is_finite_number


@dataclass(frozen=True)
class Kind:
    """The values one field accepts: `what` completes "expected ..." in messages; `ranges` says which search
    space ranges ({int: [...]}, {float: [...]}) may draw it."""

    what: str
    accepts: Callable[[Any], bool]
    ranges: tuple[str, ...] = ()


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


POSITIVE_INT = Kind("a positive integer", lambda v: _is_int(v) and v > 0, ("int",))
NON_NEGATIVE_INT = Kind("a non-negative integer", lambda v: _is_int(v) and v >= 0, ("int",))
POSITIVE_NUMBER = Kind("a positive number", lambda v: is_finite_number(v) and v > 0, ("int", "float"))
NON_NEGATIVE_NUMBER = Kind("a non-negative number", lambda v: is_finite_number(v) and v >= 0, ("int", "float"))
NON_ZERO_NUMBER = Kind("a non-zero number", lambda v: is_finite_number(v) and v != 0, ("int", "float"))
PROBABILITY = Kind("a probability in [0, 1)", lambda v: is_finite_number(v) and 0 <= v < 1, ("float",))
BOOL = Kind("true or false", lambda v: isinstance(v, bool))
LAYER_INDICES = Kind("a non-empty list of layer indices, or null for all layers",
                     lambda v: v is None or (isinstance(v, (list, tuple)) and len(v) > 0
                                             and all(_is_int(i) and i >= 0 for i in v)))
NESTED_DELTA = Kind("a delta entry of a method the mixture mixes", lambda v: hasattr(v, "method"))


def one_of(*values: str) -> Kind:
    what = " or ".join(values) if len(values) < 3 else f"{', '.join(values[:-1])} or {values[-1]}"
    return Kind(what, lambda v: v in values)


def site_list(sites: tuple[str, ...], nullable: bool = False) -> Kind:
    """A non-empty list of distinct site names (null too when `nullable`)."""
    def accepts(v: Any) -> bool:
        if v is None:
            return nullable
        return isinstance(v, (list, tuple)) and len(v) > 0 and len(set(v)) == len(v) and set(v) <= set(sites)

    return Kind(f"{'null or ' if nullable else ''}a non-empty list among {', '.join(sites)}", accepts)


def declare(help_text: str, default: Any, kind: Kind, search: bool = True, abbrev: str = "") -> Any:
    """A method config field with its help text (`autopelt methods`) and kind."""
    metadata = {"help": help_text, "kind": kind, "search": search, "abbrev": abbrev}
    return dataclasses.field(default=default, metadata=metadata)


def kind_of(field: dataclasses.Field) -> Kind | None:
    return field.metadata.get("kind")

"""What a search-space file may name, derived from the delta spec.

The methods, their fields and the values each field accepts are the delta library's: `autopelt.delta.spec`'s
METHODS and the kind each field declares (autopelt/delta/fields.py), read here at call time. A new method in the
spec is a new method in every space file, with nothing to add here. Declared here are only the space's own
words: layer placements (`layers: upper_half`), the fields one draw may give to several methods (`shared`),
and the training hyper-parameters (`train`).

The delta library stays the judge of a whole spec (the controller parses every drawn spec); checking each value
here as well lets a bad file fail when it is loaded, naming its key, instead of trials failing one by one.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from autopelt.delta.fields import (
    LAYER_INDICES, NON_NEGATIVE_NUMBER, POSITIVE_INT, POSITIVE_NUMBER, PROBABILITY, Kind, kind_of, one_of,
)
from autopelt.delta.registry import inner_field
from autopelt.delta.spec import ADAPTER_PRESETS, METHODS, POOLINGS

NAMED_PLACEMENTS = {"all": None, "upper_half": ("top", 0.5), "lower_half": ("bottom", 0.5)}
SHARED = ("gate", "layers")  # fields a space may draw once for every chosen method that has them
LEARNING_RATE = Kind("a positive number, or auto (the rates the study's baselines chose for the drawn methods, "
                     "times lr_scale)", lambda v: v == "auto" or POSITIVE_NUMBER.accepts(v), ("int", "float"))
TRAIN_FIELDS = {"learning_rate": LEARNING_RATE, "lr_scale": POSITIVE_NUMBER, "epochs": POSITIVE_INT,
                "batch_size": POSITIVE_INT, "weight_decay": NON_NEGATIVE_NUMBER, "warmup_ratio": PROBABILITY,
                "grad_clip": POSITIVE_NUMBER, "max_length": POSITIVE_INT}  # TrialSettings' names, and lr_scale
TRAIN_REQUIRED = ("learning_rate",)
HEAD_FIELDS = {"pooling": one_of(*POOLINGS)}  # the spec's own fields beside its methods


def parse_placement(v: Any) -> tuple[str, float] | None | list[int]:
    """('top'|'bottom', fraction), None for all layers, or an explicit index list; ValueError if malformed."""
    if v is None or isinstance(v, str) and v in NAMED_PLACEMENTS:
        return NAMED_PLACEMENTS.get(v)
    if isinstance(v, (list, tuple)) and v and all(isinstance(i, int) and not isinstance(i, bool) for i in v) \
            and len(set(v)) == len(v):
        return list(v)
    side, _, fraction = str(v).partition(":")
    if isinstance(v, str) and side in ("top", "bottom"):
        share = float(fraction)
        if 0 < share <= 1:
            return side, share
    raise ValueError(v)


def _is_placement(v: Any) -> bool:
    try:
        parse_placement(v)
    except ValueError:
        return False
    return True


# a spec's layer indices, as a space says them (resolved per model by `layer_indices`)
PLACEMENT = Kind("a layer placement: all, upper_half, lower_half, top:F, bottom:F (0 < F <= 1), null "
                 "or a list of layer indices (negative counts from the top)", _is_placement)


def layer_indices(placement: Any, num_layers: int) -> list[int] | None:
    """A placement resolved for a model with `num_layers` layers; None means all. ValueError if out of range."""
    parsed = parse_placement(placement)
    if parsed is None:
        return None
    if isinstance(parsed, list):
        bad = [i for i in parsed if not -num_layers <= i < num_layers]
        if bad:
            raise ValueError(f"layer {bad[0]} is out of range for a model with {num_layers} layers")
        return sorted({i % num_layers for i in parsed})
    side, share = parsed
    count = max(1, math.ceil(share * num_layers - 1e-9))
    return list(range(num_layers - count, num_layers)) if side == "top" else list(range(count))


# -- derived from the delta spec -------------------------------------------------------------------------------


def method_names() -> tuple[str, ...]:
    """Every method, in the spec's order (the order a space draws and lists them in)."""
    return tuple(METHODS)


def method_fields(method: str) -> dict[str, Kind]:
    """The fields a space may set for `method`, in the spec's order, with the values each accepts."""
    return {f.name: _as_space_kind(kind_of(f)) for f in dataclasses.fields(METHODS[method])
            if f.metadata.get("search", True)}


def _as_space_kind(kind: Kind) -> Kind:
    return PLACEMENT if kind is LAYER_INDICES else kind


def nested_field(method: str) -> str | None:
    """The field holding a mixture's own delta (AdaMix's `delta`), or None for a plain method."""
    return inner_field(method)


def field_default(method: str, name: str) -> Any:
    """What `method`'s field `name` is when a spec leaves it out."""
    return next(f.default for f in dataclasses.fields(METHODS[method]) if f.name == name)


def mixed_methods(mixture: str) -> tuple[str, ...]:
    return METHODS[mixture].mixes


def mixed_fields(mixture: str, method: str) -> dict[str, Kind]:
    """The fields of `method` a space may set inside `mixture` (its experts leave some at their defaults)."""
    leave = METHODS[mixture].experts_leave
    return {name: kind for name, kind in method_fields(method).items() if name not in leave}


def required_fields(method: str) -> tuple[str, ...]:
    """A mixture must say what it mixes."""
    nested = nested_field(method)
    return (nested,) if nested else ()


def shared_fields() -> dict[str, Kind]:
    """SHARED with the kind the methods that have the field give it."""
    kinds = {name: kind for method in METHODS for name, kind in method_fields(method).items() if name in SHARED}
    return {name: kinds[name] for name in SHARED if name in kinds}


def preset_fields(name: str) -> str | None:
    """`placement: pfeiffer, projection: compacter` for an adapter preset name (compacter++), else None."""
    preset = ADAPTER_PRESETS.get(name)
    return None if preset is None else ", ".join(f"{key}: {value}" for key, value in preset.items())

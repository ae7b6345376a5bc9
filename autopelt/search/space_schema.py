"""What a search-space file may name: delta methods and their fields, training hyper-parameters, layer placements.

The method fields mirror the delta spec of docs/design.md; the delta library stays the judge of a whole spec
(tests run every sampled spec through `autopelt.delta.parse_spec`). Checking values here as well lets a bad
file fail when it is loaded, naming its key, instead of trials failing one by one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

METHOD_ORDER = ("lora", "adapter", "prefix", "prompt", "bitfit", "adamix")
LINEAR_SITES = ("query", "key", "value", "attention_output", "intermediate", "output")
BIAS_SITES = LINEAR_SITES + ("layernorm", "embeddings")
ACTIVATIONS = ("relu", "gelu", "tanh", "swish")
ADAPTER_PRESETS = {  # accepted by the delta library, but a space says them as adapter fields
    "houlsby": "placement: houlsby",
    "pfeiffer": "placement: pfeiffer",
    "phm_adapter": "projection: phm",
    "compacter": "placement: houlsby, projection: compacter",
    "compacter++": "placement: pfeiffer, projection: compacter",
}
NAMED_PLACEMENTS = {"all": None, "upper_half": ("top", 0.5), "lower_half": ("bottom", 0.5)}


@dataclass(frozen=True)
class Kind:
    """What one field accepts: `what` for messages, `ranges` says which of int/float ranges may draw it."""

    what: str
    accepts: Callable[[Any], bool]
    ranges: tuple[str, ...] = ()


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _site_list(v: Any, sites: tuple[str, ...]) -> bool:
    return isinstance(v, (list, tuple)) and len(v) > 0 and len(set(v)) == len(v) and set(v) <= set(sites)


def parse_placement(v: Any) -> tuple[str, float] | None | list[int]:
    """('top'|'bottom', fraction), None for all layers, or an explicit index list; ValueError if malformed."""
    if v is None or isinstance(v, str) and v in NAMED_PLACEMENTS:
        return NAMED_PLACEMENTS.get(v)
    if isinstance(v, (list, tuple)) and v and all(_is_int(i) for i in v) and len(set(v)) == len(v):
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


POSITIVE_INT = Kind("a positive integer", lambda v: _is_int(v) and v > 0, ("int",))
NON_NEGATIVE_INT = Kind("a non-negative integer", lambda v: _is_int(v) and v >= 0, ("int",))
POSITIVE_NUMBER = Kind("a positive number", lambda v: _is_number(v) and v > 0, ("int", "float"))
NON_NEGATIVE_NUMBER = Kind("a non-negative number", lambda v: _is_number(v) and v >= 0, ("int", "float"))
DROPOUT = Kind("a probability in [0, 1)", lambda v: _is_number(v) and 0 <= v < 1, ("float",))
BOOL = Kind("true or false", lambda v: isinstance(v, bool))
LINEAR_TARGETS = Kind(f"a non-empty list among {', '.join(LINEAR_SITES)}", lambda v: _site_list(v, LINEAR_SITES))
BIAS_TARGETS = Kind(f"null or a non-empty list among {', '.join(BIAS_SITES)}",
                    lambda v: v is None or _site_list(v, BIAS_SITES))
LAYERS = Kind("a layer placement: all, upper_half, lower_half, top:F, bottom:F (0 < F <= 1), null "
              "or a list of layer indices (negative counts from the top)", _is_placement)
NESTED = Kind("the mixed delta: {choice: {adapter: {...}, lora: {...}}} or {adapter: {...}}", lambda v: False)


def one_of(*values: str) -> Kind:
    return Kind(" or ".join(values), lambda v: v in values)


_LORA = {"rank": POSITIVE_INT, "alpha": POSITIVE_NUMBER, "targets": LINEAR_TARGETS, "dropout": DROPOUT,
         "gate": BOOL, "layers": LAYERS}
_ADAPTER = {"placement": one_of("houlsby", "pfeiffer", "ffn"), "bottleneck": POSITIVE_INT,
            "activation": one_of(*ACTIVATIONS), "projection": one_of("dense", "phm", "compacter"),
            "n": POSITIVE_INT, "phm_rank": POSITIVE_INT, "gate": BOOL, "layers": LAYERS}
METHOD_FIELDS: dict[str, dict[str, Kind]] = {
    "lora": _LORA,
    "adapter": _ADAPTER,
    "prefix": {"length": POSITIVE_INT, "reparam_hidden": NON_NEGATIVE_INT, "gate": BOOL, "split_gate": BOOL,
               "layers": LAYERS},
    "prompt": {"length": POSITIVE_INT},
    "bitfit": {"targets": BIAS_TARGETS, "pooler": BOOL},
    "adamix": {"experts": POSITIVE_INT, "share_up": BOOL, "consistency": NON_NEGATIVE_NUMBER,
               "expert_init": one_of("copy", "independent"), "delta": NESTED},
}
# AdaMix averages its experts into one module, so it mixes ungated dense deltas only.
MIXED_FIELDS: dict[str, dict[str, Kind]] = {
    "adapter": {k: v for k, v in _ADAPTER.items() if k not in ("projection", "n", "phm_rank", "gate")},
    "lora": {k: v for k, v in _LORA.items() if k != "gate"},
}
SHARED_FIELDS = {"gate": BOOL, "layers": LAYERS}
TRAIN_FIELDS = {"learning_rate": POSITIVE_NUMBER, "epochs": POSITIVE_INT, "batch_size": POSITIVE_INT,
                "weight_decay": NON_NEGATIVE_NUMBER, "warmup_ratio": DROPOUT, "grad_clip": POSITIVE_NUMBER,
                "max_length": POSITIVE_INT}  # names of autopelt.train.TrialSettings
REQUIRED = {"train": ("learning_rate",), "adamix": ("delta",)}


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

"""The delta library: every PEFT method as composable, gated, serialisable modules on transformers 5."""

from autopelt.delta.count import ParamCount, count_parameters
from autopelt.delta.gates import gate_values
from autopelt.delta.inject import apply_delta, merge, unmerge
from autopelt.delta.io import delta_state, load_delta, read_delta_header, save_delta, stored_spec
from autopelt.delta.modules.mixture import consistency_loss, has_mixtures, route_all
from autopelt.delta.presets import BASELINES, PRESETS
from autopelt.delta.spec import DeltaSpec, parse_spec

__all__ = [
    "BASELINES", "PRESETS", "DeltaSpec", "ParamCount", "apply_delta", "consistency_loss", "count_parameters",
    "delta_state", "gate_values", "has_mixtures", "load_delta", "merge", "parse_spec", "read_delta_header",
    "route_all", "save_delta", "stored_spec", "unmerge",
]

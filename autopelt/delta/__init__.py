"""The delta library: every PEFT method as composable, gated, serialisable modules on transformers 5.

Names are imported on first use, so that `import autopelt.delta.spec` (or the CLI) does not load torch.
"""

import importlib

_EXPORTS = {
    "ParamCount": "count", "count_parameters": "count", "gate_values": "gate_readings",
    "apply_delta": "inject", "merge": "inject", "unmerge": "inject",
    "delta_state": "io", "load_delta": "io", "read_delta_header": "io", "save_delta": "io", "stored_spec": "io",
    "consistency_loss": "modules.mixture", "has_mixtures": "modules.mixture", "route_all": "modules.mixture",
    "BASELINES": "presets", "PRESETS": "presets", "DeltaSpec": "spec", "parse_spec": "spec",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'autopelt.delta' has no attribute {name!r}")
    return getattr(importlib.import_module(f"autopelt.delta.{_EXPORTS[name]}"), name)

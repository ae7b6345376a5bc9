"""autopelt: search for the best parameter-efficient fine-tuning (delta) of a transformer for a task.

The Python API (`autopelt/api.py`): `apply`, `load`, `save` a delta on a transformers model; `train_delta`,
`search_delta`, `export_delta`. Loaded on first use, so `import autopelt` imports neither torch nor transformers.
"""

import importlib

__version__ = "0.1.0"

_API = ("apply", "load", "save", "train_delta", "search_delta", "export_delta", "TrialFailed")
__all__ = list(_API)


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module 'autopelt' has no attribute {name!r}")
    return getattr(importlib.import_module("autopelt.api"), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))

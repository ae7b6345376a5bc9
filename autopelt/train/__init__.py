"""One trial: train and evaluate one delta spec on one task, reproducibly. (Names load on first use.)"""

import importlib

_EXPORTS = {"TrialSettings": "settings", "run_trial": "trial", "run_packed": "packed"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'autopelt.train' has no attribute {name!r}")
    return getattr(importlib.import_module(f"autopelt.train.{_EXPORTS[name]}"), name)

"""Ensembles of the deltas a study trained: greedy selection with replacement on dev predictions (Caruana et al.
2004, "Ensemble selection from libraries of models"), the margin rule, a LoRA soup, and the folder that
`autopelt export` writes and `autopelt predict` / `autopelt.load` run with one backbone load (docs/ensembles.md).

Names are imported on first use, so that importing the package does not load torch.
"""

import importlib

_EXPORTS = {
    "Ensemble": "select", "Rule": "select", "select": "select", "answers": "select", "limit": "select",
    "combine": "select", "StudyEnsemble": "study", "study_ensemble": "study", "DEFAULT_RULE": "study",
    "DEFAULT_MARGIN": "study", "soup_state": "soup", "soup_folders": "soup", "why_not_soup": "soup",
    "EnsembleModel": "model", "is_ensemble": "folder", "write_ensemble": "folder", "read_manifest": "folder",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'autopelt.ensemble' has no attribute {name!r}")
    return getattr(importlib.import_module(f"autopelt.ensemble.{_EXPORTS[name]}"), name)

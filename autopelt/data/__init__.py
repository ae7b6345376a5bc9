"""Tasks, metrics, loading (local dir or hub), train/dev/test protocols, tokenisation cache and batching.

Names are imported on first use: the CLI can check a task name without loading torch or scikit-learn.
"""

import importlib

_EXPORTS = {
    "eval_batches": "batching", "map_in_order": "batching", "pad_batch": "batching", "train_batches": "batching",
    "train_order": "batching", "Features": "features", "tokenize": "features", "load_task_splits": "loading",
    "Splits": "protocols", "full_protocol": "protocols", "k_shot_protocol": "protocols", "make_splits": "protocols",
    "parse_protocol": "protocols", "GLUE_TASKS": "tasks", "Task": "tasks", "custom_task": "tasks", "get_task": "tasks",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'autopelt.data' has no attribute {name!r}")
    return getattr(importlib.import_module(f"autopelt.data.{_EXPORTS[name]}"), name)

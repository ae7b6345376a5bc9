"""Tasks, metrics, loading (local dir or hub), train/dev/test protocols, tokenisation cache and batching."""

from autopelt.data.batching import eval_batches, map_in_order, pad_batch, train_batches, train_order
from autopelt.data.features import Features, tokenize
from autopelt.data.loading import load_task_splits
from autopelt.data.protocols import Splits, full_protocol, k_shot_protocol, make_splits, parse_protocol
from autopelt.data.tasks import GLUE_TASKS, Task, custom_task, get_task

__all__ = [
    "GLUE_TASKS", "Task", "custom_task", "get_task", "load_task_splits", "Splits", "full_protocol",
    "k_shot_protocol", "make_splits", "parse_protocol", "Features", "tokenize", "pad_batch", "train_order",
    "train_batches", "eval_batches", "map_in_order",
]

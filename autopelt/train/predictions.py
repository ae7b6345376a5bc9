"""A trial's per-example predictions: what ensembles are selected from (Caruana et al. 2004) and simulated on.

A classifier's prediction of a row is its class probabilities (softmax of the logits), a regression's the
predicted value; both are kept as float16. `predictions.npz` beside a trial's `result.json` holds `dev` and `test`
(rows in the split's order, the kept state's outputs) and is written atomically: a process killed meanwhile leaves
the whole file or none. For storage across many trials, `compact` keeps a many-class row's top-k probabilities
(the rest of its mass spread evenly by `expand`), which is what averaging needs: an averaged row's winner is
among its members' top classes.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import torch

from autopelt.errors import UserError
from autopelt.files import write_atomic

PREDICTIONS_FILE = "predictions.npz"


def from_outputs(outputs: torch.Tensor, regression: bool) -> np.ndarray:
    """(rows, classes) float16 probabilities, or (rows,) float16 values for a regression's (rows, 1) outputs."""
    outputs = outputs.float()
    if regression:
        return outputs[:, 0].numpy().astype(np.float16)
    return torch.softmax(outputs, dim=-1).numpy().astype(np.float16)


def save(out_dir: str | Path, predictions: dict[str, np.ndarray], name: str = PREDICTIONS_FILE) -> Path:
    """Write `predictions` ({name: array}; None values left out) to `out_dir/name`, atomically; returns the path."""
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **{name: array for name, array in predictions.items() if array is not None})
    return write_atomic(Path(out_dir) / name, buffer.getvalue())


def load(out_dir: str | Path) -> dict[str, np.ndarray]:
    """{split: array} of a trial folder's predictions. Raises UserError when the file is missing or unreadable."""
    path = Path(out_dir) / PREDICTIONS_FILE
    if not path.is_file():
        raise UserError(f"{path} does not exist: the trial kept no predictions (train it with keep_predictions)")
    try:
        with np.load(path) as data:
            return {name: data[name] for name in data.files}
    except (OSError, ValueError) as error:
        raise UserError(f"{path} is not a readable predictions file ({error}); train the trial again") from None


def compact(probabilities: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(indices, values): each row's k most probable classes (uint8, or uint16 past 256 classes) and their
    float16 probabilities, most probable first."""
    top = np.argsort(-probabilities.astype(np.float32), axis=1, kind="stable")[:, :k]
    dtype = np.uint8 if probabilities.shape[1] <= 256 else np.uint16
    return top.astype(dtype), np.take_along_axis(probabilities, top, axis=1).astype(np.float16)


def expand(indices: np.ndarray, values: np.ndarray, num_classes: int) -> np.ndarray:
    """Dense float32 probabilities from `compact`'s form: the kept classes as stored, the rest of each row's mass
    (1 - their sum, at least 0) spread evenly over the other classes."""
    rows, k = indices.shape
    dense = np.zeros((rows, num_classes), dtype=np.float32)
    kept = values.astype(np.float32)
    rest = np.clip(1.0 - kept.sum(axis=1), 0.0, None) / max(num_classes - k, 1)
    dense += rest[:, None]
    np.put_along_axis(dense, indices.astype(np.int64), kept, axis=1)
    return dense


def compact_many(predictions: dict[str, np.ndarray], max_classes: int, k: int) -> dict[str, np.ndarray]:
    """`predictions` with each split of more than `max_classes` classes as `<split>_indices` and
    `<split>_values` (`compact`'s top-k form); other arrays as they are."""
    out = {}
    for name, array in predictions.items():
        if name in ("dev", "test") and array is not None and array.ndim == 2 and array.shape[1] > max_classes:
            out[f"{name}_indices"], out[f"{name}_values"] = compact(array, k)
            out[f"{name}_classes"] = np.asarray(array.shape[1], dtype=np.int32)
        else:
            out[name] = array
    return out


def dense(predictions: dict[str, np.ndarray], split: str) -> np.ndarray:
    """A split's float32 predictions, expanded from the top-k form where `compact_many` stored it."""
    if split in predictions:
        return predictions[split].astype(np.float32)
    return expand(predictions[f"{split}_indices"], predictions[f"{split}_values"],
                  int(predictions[f"{split}_classes"]))

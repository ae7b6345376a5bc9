"""Padded batches of torch tensors from `Features`, each padded only to its own longest row.

Training batches group rows of similar length: the epoch's shuffled order is cut into mega-batches of
`group_size` batches, each mega-batch is sorted by length and cut into batches, and the batches are shuffled.
Evaluation batches are sorted by length over the whole split; `map_in_order` puts results back in row order.
"""

from __future__ import annotations

from typing import Callable, Iterator

import numpy as np
import torch

from autopelt.data.features import Features

# Batches per length-sorted chunk. Small enough that a K=1000 training set spans several chunks, so a row's
# batch-mates change from epoch to epoch; large enough to keep padding low. Measured: docs/benchmarks.md (padding).
DEFAULT_GROUP_SIZE = 8


def pad_batch(features: Features, indices) -> dict[str, torch.Tensor]:
    """The rows `indices` as a batch: input_ids, attention_mask, token_type_ids (if any), labels (if any),
    soft_targets (a teacher's float32 predictions, if any)."""
    indices = np.asarray(indices, dtype=np.int64)
    lengths = features.lengths[indices]
    width = int(lengths.max()) if len(indices) else 0
    input_ids = np.full((len(indices), width), features.pad_id, dtype=np.int64)
    mask = np.arange(width)[None, :] < lengths[:, None]  # (B, W) True on real tokens
    input_ids[mask] = _gather(features.ids, features.offsets, indices)
    batch = {"input_ids": torch.from_numpy(input_ids), "attention_mask": torch.from_numpy(mask.astype(np.int64))}
    if features.token_type_ids is not None:
        types = np.zeros((len(indices), width), dtype=np.int64)
        types[mask] = _gather(features.token_type_ids, features.offsets, indices)
        batch["token_type_ids"] = torch.from_numpy(types)
    if features.labels is not None:
        dtype = torch.float32 if features.regression else torch.long
        batch["labels"] = torch.as_tensor(features.labels[indices], dtype=dtype)
    if features.soft_targets is not None:
        batch["soft_targets"] = torch.as_tensor(features.soft_targets[indices], dtype=torch.float32)
    return batch


def _gather(flat: np.ndarray, offsets: np.ndarray, indices: np.ndarray) -> np.ndarray:
    # Row-major order of the mask matches concatenating the rows in batch order.
    return np.concatenate([flat[offsets[i] : offsets[i + 1]] for i in indices]) if len(indices) else flat[:0]


def train_order(features: Features, batch_size: int, seed, group_size: int = DEFAULT_GROUP_SIZE) -> list[np.ndarray]:
    """One epoch's batches of row indices: shuffled, length-grouped; every row exactly once."""
    _check_batch_size(batch_size)
    generator = _generator(seed)
    order = torch.randperm(len(features), generator=generator).numpy()
    lengths = features.lengths
    batches = []
    chunk = batch_size * max(1, group_size)
    for start in range(0, len(order), chunk):
        group = order[start : start + chunk]
        group = group[np.argsort(-lengths[group], kind="stable")]  # ties keep their shuffled order
        batches.extend(group[i : i + batch_size] for i in range(0, len(group), batch_size))
    # Shuffle whole batches, else every mega-batch would run from its longest to its shortest batch.
    return [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]


def train_batches(features: Features, batch_size: int, seed, group_size: int = DEFAULT_GROUP_SIZE) -> Iterator[dict]:
    """One training epoch of padded batches; pass `seed + epoch` or one `torch.Generator` across epochs."""
    for indices in train_order(features, batch_size, seed, group_size):
        yield pad_batch(features, indices)


def eval_batches(features: Features, batch_size: int) -> Iterator[tuple[np.ndarray, dict]]:
    """(row indices, padded batch) pairs over the rows sorted longest first, for batched evaluation."""
    _check_batch_size(batch_size)
    order = np.argsort(-features.lengths, kind="stable")
    for start in range(0, len(order), batch_size):
        indices = order[start : start + batch_size]
        yield indices, pad_batch(features, indices)


def map_in_order(features: Features, batch_size: int, function: Callable[[dict], torch.Tensor]) -> torch.Tensor:
    """`function(batch)` over length-sorted batches, outputs concatenated back in the rows' original order."""
    positions, outputs = [], []
    for indices, batch in eval_batches(features, batch_size):
        positions.append(torch.from_numpy(indices))
        outputs.append(function(batch))
    if not outputs:
        return torch.empty(0)
    stacked = torch.cat(outputs)
    result = torch.empty_like(stacked)
    result[torch.cat(positions)] = stacked
    return result


def _generator(seed) -> torch.Generator:
    if isinstance(seed, torch.Generator):
        return seed  # the caller's stream advances, so successive epochs differ
    if seed is None:
        raise TypeError("training order needs an explicit seed (int or torch.Generator), not None")
    return torch.Generator().manual_seed(int(seed))


def _check_batch_size(batch_size: int) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch size must be a positive integer, not {batch_size!r}")

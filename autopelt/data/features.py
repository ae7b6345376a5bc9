"""Tokenising a task's rows once, without padding, and reusing the result from the on-disk cache.

Rows are stored ragged: every row's token ids concatenated into one flat array plus offsets, which is what
the cache writes (.npz) and what batching slices. Padding happens per batch, to that batch's longest row.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from dataclasses import dataclass

import numpy as np

from autopelt.data import cache
from autopelt.data.tasks import Task, get_task
from autopelt.errors import UserError

FORMAT_VERSION = 1  # bump when the stored arrays change meaning, so old entries are never read
CHUNK_ROWS = 4096  # rows per tokenizer call: bounds the memory of the tokenizer's Python lists


@dataclass(frozen=True)
class Features:
    """Token ids of N rows, unpadded: row i is `ids[offsets[i]:offsets[i + 1]]`."""

    ids: np.ndarray  # (T,) int32, all rows concatenated
    offsets: np.ndarray  # (N + 1,) int64
    token_type_ids: np.ndarray | None  # (T,) int8 aligned with ids, or None if the tokenizer gives none
    labels: np.ndarray | None  # (N,) int64 class ids or float32 scores; None for unlabelled rows
    pad_id: int
    regression: bool
    soft_targets: np.ndarray | None = None  # (N, C) a teacher's probabilities, or (N,) its values (distillation);
    #                                         never cached: a trial attaches them to its train rows

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        """(N,) tokens per row."""
        return np.diff(self.offsets)

    def row(self, index: int) -> np.ndarray:
        """The token ids of one row."""
        return self.ids[self.offsets[index] : self.offsets[index + 1]]

    def select(self, indices) -> "Features":
        """Rows `indices`, in that order (a protocol's subset of a tokenised split)."""
        indices = np.asarray(indices, dtype=np.int64).reshape(-1)
        lengths = self.lengths[indices]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        # position of every kept token in the flat arrays: its row's old start plus its place in the row
        gather = np.repeat(self.offsets[indices] - offsets[:-1], lengths) + np.arange(offsets[-1])
        return Features(
            ids=self.ids[gather], offsets=offsets,
            token_type_ids=None if self.token_type_ids is None else self.token_type_ids[gather],
            labels=None if self.labels is None else self.labels[indices], pad_id=self.pad_id,
            regression=self.regression, soft_targets=None if self.soft_targets is None else self.soft_targets[indices],
        )

    @staticmethod
    def join(parts: "list[Features]") -> "Features":
        """The rows of `parts`, one after another (every part of one tokenizer and kind; soft targets kept only
        where every part has them)."""
        first = parts[0]
        lengths = np.concatenate([p.lengths for p in parts])
        types = [p.token_type_ids for p in parts]
        labels = [p.labels for p in parts]
        soft = [p.soft_targets for p in parts]
        return Features(
            ids=np.concatenate([p.ids for p in parts]),
            offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
            token_type_ids=None if any(t is None for t in types) else np.concatenate(types),
            labels=None if any(x is None for x in labels) else np.concatenate(labels), pad_id=first.pad_id,
            regression=first.regression, soft_targets=None if any(x is None for x in soft) else np.concatenate(soft),
        )

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Named arrays for the cache (absent parts left out)."""
        arrays = {"ids": self.ids, "offsets": self.offsets, "pad_id": np.array(self.pad_id),
                  "regression": np.array(self.regression)}
        optional = {"token_type_ids": self.token_type_ids, "labels": self.labels}
        arrays.update({name: value for name, value in optional.items() if value is not None})
        return arrays

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> "Features":
        """The inverse of `to_arrays`."""
        return cls(
            ids=arrays["ids"], offsets=arrays["offsets"], token_type_ids=arrays.get("token_type_ids"),
            labels=arrays.get("labels"), pad_id=int(arrays["pad_id"]), regression=bool(arrays["regression"]),
        )


def tokenize(
    rows, task: str | Task, tokenizer, max_length: int = 128, cache_dir=None, use_cache: bool = True
) -> Features:
    """Features for `rows`, read from the cache when this tokenizer/max_length/content was seen before."""
    task = get_task(task)
    max_length = effective_max_length(tokenizer, max_length)
    path = cache.entry_path(features_key(rows, task, tokenizer, max_length), cache_dir)
    stored = cache.load_arrays(path) if use_cache else None
    if stored is not None:
        return Features.from_arrays(stored)
    features = encode(rows, task, tokenizer, max_length)
    if use_cache:
        cache.save_arrays(path, features.to_arrays())
    return features


def effective_max_length(tokenizer, max_length: int) -> int:
    """`max_length`, clipped to what the tokenizer's model accepts."""
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2:
        raise UserError(f"max length must be an integer >= 2, not {max_length!r}")
    return min(max_length, int(tokenizer.model_max_length))


def encode(rows, task: Task, tokenizer, max_length: int) -> Features:
    """Tokenise `rows` (truncated to `max_length`, unpadded), bypassing the cache."""
    if tokenizer.pad_token_id is None:
        raise UserError("the tokenizer has no pad token; pick a model whose tokenizer defines one")
    chunks = [_encode_chunk(rows[start : start + CHUNK_ROWS], task, tokenizer, max_length)
              for start in range(0, len(rows), CHUNK_ROWS)]
    ids = [row for chunk in chunks for row in chunk["input_ids"]]
    types = [row for chunk in chunks for row in chunk.get("token_type_ids", ())]
    lengths = np.fromiter((len(row) for row in ids), dtype=np.int64, count=len(ids))
    return Features(
        ids=_flatten(ids, np.int32), offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        token_type_ids=_flatten(types, np.int8) if types and len(types) == len(ids) else None,
        labels=_labels(rows, task), pad_id=int(tokenizer.pad_token_id), regression=task.regression,
    )


def _encode_chunk(rows, task: Task, tokenizer, max_length: int):
    texts = [[_text(row[column]) for row in rows] for column in task.text_columns]
    return tokenizer(*texts, truncation=True, max_length=max_length)


def _text(value) -> str:
    return "" if value is None else str(value)  # a missing text (e.g. an empty CSV cell) is an empty text


def _flatten(rows: list[list[int]], dtype) -> np.ndarray:
    total = sum(len(row) for row in rows)
    return np.fromiter(itertools.chain.from_iterable(rows), dtype=dtype, count=total)


def _labels(rows, task: Task) -> np.ndarray | None:
    labelled = [task.label_column in row for row in rows]
    if not any(labelled):
        return None  # e.g. texts to predict
    if not all(labelled):
        raise UserError(f"task {task.name!r}: some rows have a {task.label_column!r} column and some do not")
    dtype = np.float32 if task.regression else np.int64
    return np.array([task.encode_label(row[task.label_column]) for row in rows], dtype=dtype)


def features_key(rows, task: Task, tokenizer, max_length: int) -> str:
    """The cache key: tokenizer content, max length, the task's columns and the rows' content."""
    digest = hashlib.blake2b(digest_size=20)
    task_part = [task.text_columns, task.label_column, task.regression, task.num_labels, task.label_names]
    for part in (str(FORMAT_VERSION), tokenizer_fingerprint(tokenizer), str(max_length), json.dumps(task_part)):
        digest.update(part.encode())
        digest.update(b"\0")
    digest.update(rows_fingerprint(rows, task).encode())
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '_', task.name)}-{digest.hexdigest()}"


def rows_fingerprint(rows, task: Task) -> str:
    """A hash of what tokenising reads from the rows: their texts and labels, in order."""
    columns = task.columns
    content = [[row.get(column) for column in columns] for row in rows]
    return hashlib.blake2b(json.dumps(content, default=str).encode(), digest_size=20).hexdigest()


def tokenizer_fingerprint(tokenizer) -> str:
    """A hash of everything that decides a tokenizer's output (not where it was loaded from)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        spec = json.loads(backend.to_str())
        # The tokenizer rewrites these on every call (they hold the last max_length), so they are not identity.
        spec.pop("truncation", None)
        spec.pop("padding", None)
        content = json.dumps(spec)  # key order is fixed by the serialiser; sorting 30k vocab entries is slow
    else:
        content = json.dumps(sorted(tokenizer.get_vocab().items()))
    extra = [type(tokenizer).__name__, getattr(tokenizer, "truncation_side", "right"), tokenizer.pad_token_id,
             getattr(tokenizer, "do_lower_case", None)]
    return hashlib.blake2b((content + json.dumps(extra)).encode(), digest_size=20).hexdigest()

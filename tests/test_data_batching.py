"""Length-grouped training batches and length-sorted evaluation batches, padded per batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from autopelt.data.batching import eval_batches, map_in_order, pad_batch, train_batches, train_order
from autopelt.data.features import Features


def make_features(lengths, pad_id=0, regression=False, with_types=True) -> Features:
    """Row i is [i + 10, i + 10, ...] of the given length, so a token names its row."""
    lengths = np.asarray(lengths, dtype=np.int64)
    ids = np.concatenate([np.full(n, i + 10, dtype=np.int32) for i, n in enumerate(lengths)] + [np.zeros(0, np.int32)])
    types = np.concatenate([np.arange(n, dtype=np.int8) % 2 for n in lengths] + [np.zeros(0, np.int8)])
    labels = np.arange(len(lengths)) * (0.5 if regression else 1)
    return Features(ids=ids, offsets=np.concatenate([[0], np.cumsum(lengths)]),
                    token_type_ids=types if with_types else None,
                    labels=labels.astype(np.float32 if regression else np.int64), pad_id=pad_id,
                    regression=regression)


@pytest.fixture
def feats():
    return make_features(np.random.default_rng(0).integers(3, 120, size=1003))


def rows_of(batch) -> list[int]:
    return (batch["input_ids"][:, 0] - 10).tolist()


def test_every_row_once_per_epoch(feats):
    for seed in range(3):
        seen = [row for batch in train_batches(feats, 16, seed) for row in rows_of(batch)]
        assert sorted(seen) == list(range(1003))


def test_padding_only_to_the_batch_max(feats):
    for batch in train_batches(feats, 16, seed=0):
        rows = rows_of(batch)
        lengths = feats.lengths[rows]
        assert batch["input_ids"].shape == (len(rows), lengths.max())
        assert batch["attention_mask"].sum(1).tolist() == lengths.tolist()
        assert ((batch["input_ids"] == 0) == (batch["attention_mask"] == 0)).all()  # pad exactly where masked
        for position, row in enumerate(rows):
            assert batch["input_ids"][position, : lengths[position]].tolist() == feats.row(row).tolist()


def test_token_types_are_padded_with_zero(feats):
    batch = pad_batch(feats, [0, 1, 2])
    for position in range(3):
        n = feats.lengths[position]
        assert batch["token_type_ids"][position, :n].tolist() == (np.arange(n) % 2).tolist()
        assert batch["token_type_ids"][position, n:].eq(0).all()


def test_a_non_zero_pad_id_is_used(feats):
    roberta_like = make_features([3, 5], pad_id=1, with_types=False)
    batch = pad_batch(roberta_like, [0, 1])
    assert batch["input_ids"][0].tolist() == [10, 10, 10, 1, 1]
    assert "token_type_ids" not in batch


def test_label_dtypes():
    assert pad_batch(make_features([2, 3]), [0, 1])["labels"].dtype == torch.long
    regression = pad_batch(make_features([2, 3], regression=True), [1, 0])
    assert regression["labels"].dtype == torch.float32 and regression["labels"].tolist() == [0.5, 0.0]


def test_same_seed_same_order_other_seed_other_order(feats):
    def order(seed):
        return [batch.tolist() for batch in train_order(feats, 16, seed)]

    assert order(5) == order(5)
    assert order(5) != order(6)


def test_one_generator_gives_a_new_order_each_epoch(feats):
    generator = torch.Generator().manual_seed(0)
    first = [b.tolist() for b in train_order(feats, 16, generator)]
    second = [b.tolist() for b in train_order(feats, 16, generator)]
    assert first != second
    assert first == [b.tolist() for b in train_order(feats, 16, torch.Generator().manual_seed(0))]


def test_grouping_by_length_cuts_padding(feats):
    def padded_tokens(group_size):
        return sum(b["input_ids"].numel() for b in train_batches(feats, 16, 0, group_size=group_size))

    real = int(feats.lengths.sum())
    grouped, ungrouped = padded_tokens(50), padded_tokens(1)  # group_size 1: a plain shuffle
    assert grouped < real * 1.05 < real * 1.4 < ungrouped


def test_batches_are_shuffled_not_longest_first(feats):
    widths = [feats.lengths[batch].max() for batch in train_order(feats, 16, 0)]
    assert widths != sorted(widths, reverse=True)


def test_eval_batches_sorted_and_order_restored(feats):
    widths = [batch["input_ids"].shape[1] for _, batch in eval_batches(feats, 32)]
    assert widths == sorted(widths, reverse=True)
    restored = map_in_order(feats, 32, lambda batch: batch["input_ids"][:, 0] - 10)
    assert restored.tolist() == list(range(1003))


def test_map_in_order_keeps_per_row_outputs(feats):
    logits = map_in_order(feats, 7, lambda batch: torch.stack([batch["attention_mask"].sum(1),
                                                               batch["labels"]], dim=1).float())
    assert logits.shape == (1003, 2)
    assert logits[:, 0].tolist() == feats.lengths.tolist() and logits[:, 1].tolist() == list(range(1003))


def test_empty_features():
    empty = make_features(np.zeros(0, dtype=np.int64))
    assert list(train_batches(empty, 4, 0)) == [] and map_in_order(empty, 4, lambda b: b).numel() == 0


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_bad_batch_size(feats, bad):
    with pytest.raises(ValueError):
        next(train_batches(feats, bad, 0))


def test_a_seed_is_required(feats):
    with pytest.raises(TypeError):
        train_order(feats, 16, None)


def test_padded_sorted_batches_give_each_row_its_unpadded_logits():
    from conftest import tiny_model

    model = tiny_model("bert", num_labels=3)
    rng = np.random.default_rng(1)
    lengths = rng.integers(2, 40, size=30)
    ids = rng.integers(3, 100, size=int(lengths.sum())).astype(np.int32)
    feats = Features(ids=ids, offsets=np.concatenate([[0], np.cumsum(lengths)]), token_type_ids=None,
                     labels=None, pad_id=0, regression=False)
    with torch.no_grad():
        batched = map_in_order(feats, 8, lambda batch: model(**batch).logits)
        alone = torch.cat([model(input_ids=torch.from_numpy(feats.row(i)).long()[None]).logits for i in range(30)])
    torch.testing.assert_close(batched, alone, atol=1e-5, rtol=1e-5)

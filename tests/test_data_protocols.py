"""The full and K-shot protocols on the real RTE data: disjoint splits, sizes, seeds, bad K."""

from __future__ import annotations

import numpy as np
import pytest

from autopelt.data.loading import load_task_splits
from autopelt.data.protocols import full_protocol, k_shot_protocol, make_splits, parse_protocol
from autopelt.errors import UserError


@pytest.fixture(scope="module")
def rte(glue_dir):
    return load_task_splits("rte", glue_dir)


def idx(rows) -> set[int]:
    return {row["idx"] for row in rows}


def test_k_shot_sizes_and_no_overlap(rte):
    splits = make_splits(rte, "rte", 1000, seed=0)
    assert splits.info == {"name": "k-shot", "k": 1000, "train_size": 1000, "dev_size": 1000, "test_size": 277,
                           "seed": 0}
    assert (len(splits.train), len(splits.dev), len(splits.test)) == (1000, 1000, 277)
    assert len(idx(splits.train)) == 1000 and len(idx(splits.dev)) == 1000
    assert not idx(splits.train) & idx(splits.dev)
    assert idx(splits.train) | idx(splits.dev) <= idx(rte["train"])


def test_test_is_the_official_validation_split_whatever_the_seed(rte):
    for seed in (0, 1):
        for protocol in ("full", 100):
            assert list(make_splits(rte, "rte", protocol, seed).test) == rte["validation"]


def test_same_seed_same_split_and_other_seed_other_split(rte):
    first, again, other = (k_shot_protocol(rte, "rte", 100, seed) for seed in (3, 3, 4))
    assert first == again
    assert [row["idx"] for row in first.train] != [row["idx"] for row in other.train]
    assert idx(first.train) != idx(other.train)
    assert idx(first.dev) != idx(other.dev)


def test_dev_shrinks_when_train_runs_out(rte):
    splits = k_shot_protocol(rte, "rte", 2000, seed=0)
    assert splits.info["dev_size"] == 490 == len(splits.dev)  # 2,490 - 2,000
    assert idx(splits.train) | idx(splits.dev) == idx(rte["train"])
    assert not idx(splits.train) & idx(splits.dev)


def test_k_shot_dev_size_is_configurable(rte):
    assert k_shot_protocol(rte, "rte", 100, seed=0, dev_size=50).info["dev_size"] == 50


@pytest.mark.parametrize("k", [0, -5, 2490, 10_000, True, 2.5])
def test_bad_k_is_a_user_error(rte, k):
    with pytest.raises(UserError, match="rte"):
        k_shot_protocol(rte, "rte", k, seed=0)


def test_full_protocol_carves_dev_from_train(rte):
    splits = full_protocol(rte, "rte", seed=0)
    assert splits.info == {"name": "full", "k": None, "train_size": 2241, "dev_size": 249, "test_size": 277,
                           "seed": 0}
    assert not idx(splits.train) & idx(splits.dev)
    assert idx(splits.train) | idx(splits.dev) == idx(rte["train"])
    assert full_protocol(rte, "rte", seed=0) == splits
    assert idx(full_protocol(rte, "rte", seed=1).dev) != idx(splits.dev)


def test_full_dev_is_capped_and_configurable():
    rows = {"train": [{"idx": i} for i in range(20_000)], "validation": [{"idx": -1}]}
    assert full_protocol(rows, "sst2", seed=0).info["dev_size"] == 1000
    assert full_protocol(rows, "sst2", seed=0, dev_size=3000).info["train_size"] == 17_000
    tiny = {"train": [{"idx": i} for i in range(4)], "validation": [{"idx": -1}]}
    assert full_protocol(tiny, "sst2", seed=0).info["dev_size"] == 1


@pytest.mark.parametrize("dev_size", [0, 2490, -1])
def test_bad_full_dev_size(rte, dev_size):
    with pytest.raises(UserError):
        full_protocol(rte, "rte", seed=0, dev_size=dev_size)


def test_a_numpy_generator_is_accepted_and_advances(rte):
    generator = np.random.default_rng(7)
    first = k_shot_protocol(rte, "rte", 100, generator)
    second = k_shot_protocol(rte, "rte", 100, generator)
    assert first.info["seed"] is None
    assert idx(first.train) != idx(second.train)
    assert first == k_shot_protocol(rte, "rte", 100, np.random.default_rng(7))


def test_a_seed_is_required(rte):
    with pytest.raises(TypeError):
        k_shot_protocol(rte, "rte", 100, None)


def test_mnli_mismatched_tests_on_its_own_split():
    rows = {"train": [{"idx": i} for i in range(10)], "validation_matched": [{"idx": 100}],
            "validation_mismatched": [{"idx": 200}, {"idx": 201}]}
    assert idx(make_splits(rows, "mnli-mm", 5, seed=0).test) == {200, 201}
    assert idx(make_splits(rows, "mnli", 5, seed=0).test) == {100}


@pytest.mark.parametrize("value, parsed", [("full", "full"), ("FULL", "full"), (100, 100), ("500", 500),
                                           ("k1000", 1000)])
def test_parse_protocol(value, parsed):
    assert parse_protocol(value) == parsed


@pytest.mark.parametrize("value", ["0", -3, "few", "k", ""])
def test_parse_protocol_errors(value):
    with pytest.raises(UserError, match="'full' or a positive number"):
        parse_protocol(value)

"""Tokenising with the real MiniLM tokenizer, and the on-disk cache: hits, keys, atomic writes."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest

from autopelt.data import cache, features
from autopelt.data.features import encode, tokenize, tokenizer_fingerprint
from autopelt.data.loading import load_task_splits
from autopelt.data.tasks import custom_task, get_task
from autopelt.errors import UserError


@pytest.fixture(scope="module")
def tokenizer(minilm_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(minilm_path)


@pytest.fixture(scope="module")
def rte_rows(glue_dir):
    return load_task_splits("rte", glue_dir)["train"][:200]


class CountingTokenizer:
    """The real tokenizer, counting how often it is asked to tokenise."""

    def __init__(self, inner):
        self.inner = inner
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.inner(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def entries(cache_dir):
    return sorted((cache_dir / "features").glob("*"))


def test_pair_rows_match_the_tokenizer(tokenizer, rte_rows, tmp_path):
    feats = tokenize(rte_rows, "rte", tokenizer, max_length=128, cache_dir=tmp_path)
    expected = tokenizer(rte_rows[0]["sentence1"], rte_rows[0]["sentence2"], truncation=True, max_length=128)
    assert feats.row(0).tolist() == expected["input_ids"]
    start, end = feats.offsets[0], feats.offsets[1]
    assert feats.token_type_ids[start:end].tolist() == expected["token_type_ids"]
    assert feats.labels.dtype == np.int64 and feats.labels.tolist() == [row["label"] for row in rte_rows]
    assert len(feats) == 200 and feats.pad_id == tokenizer.pad_token_id == 0
    assert feats.ids.dtype == np.int32


def test_truncation_without_padding(tokenizer, rte_rows, tmp_path):
    short = tokenize(rte_rows, "rte", tokenizer, max_length=32, cache_dir=tmp_path)
    full = tokenize(rte_rows, "rte", tokenizer, max_length=512, cache_dir=tmp_path)
    assert short.lengths.max() == 32 and full.lengths.max() > 32  # long rows cut, nothing padded
    assert len(set(short.lengths.tolist())) > 1
    assert short.row(int(np.argmax(full.lengths)))[-1] == tokenizer.sep_token_id


def test_single_sentence_and_regression_labels(tokenizer, tmp_path):
    sst2 = tokenize([{"sentence": "a fine film", "label": 1}], "sst2", tokenizer, 16, cache_dir=tmp_path)
    assert sst2.row(0).tolist() == tokenizer("a fine film")["input_ids"]
    stsb_rows = [{"sentence1": "a", "sentence2": "b", "label": "3.8"}, {"sentence1": "c", "sentence2": "d", "label": 1}]
    stsb = tokenize(stsb_rows, "stsb", tokenizer, 16, cache_dir=tmp_path)
    assert stsb.labels.dtype == np.float32 and stsb.labels.tolist() == pytest.approx([3.8, 1.0])
    assert stsb.regression and not sst2.regression


def test_label_names_and_unlabelled_rows(tokenizer, tmp_path):
    task = custom_task("reviews", "text", label_column="stars", label_names=["bad", "good"])
    labelled = tokenize([{"text": "x", "stars": "good"}, {"text": "y", "stars": "bad"}], task, tokenizer, 8, tmp_path)
    assert labelled.labels.tolist() == [1, 0]
    assert tokenize([{"text": "x"}], task, tokenizer, 8, tmp_path).labels is None
    with pytest.raises(UserError, match="some rows have"):
        tokenize([{"text": "x"}, {"text": "y", "stars": "bad"}], task, tokenizer, 8, tmp_path)


def test_second_call_hits_the_cache(tokenizer, rte_rows, tmp_path):
    counting = CountingTokenizer(tokenizer)
    first = tokenize(rte_rows, "rte", counting, 128, cache_dir=tmp_path)
    assert counting.calls == 1 and len(entries(tmp_path)) == 1
    second = tokenize(rte_rows, "rte", counting, 128, cache_dir=tmp_path)
    assert counting.calls == 1  # not tokenised again
    for name, array in first.to_arrays().items():
        np.testing.assert_array_equal(second.to_arrays()[name], array)


def test_cache_key_tracks_max_length_rows_task_and_tokenizer(tokenizer, rte_rows, tmp_path):
    counting = CountingTokenizer(tokenizer)
    tokenize(rte_rows, "rte", counting, 128, cache_dir=tmp_path)
    tokenize(rte_rows, "rte", counting, 64, cache_dir=tmp_path)
    tokenize(rte_rows[:10], "rte", counting, 128, cache_dir=tmp_path)
    changed = [dict(row) for row in rte_rows]
    changed[5]["label"] = 1 - changed[5]["label"]
    tokenize(changed, "rte", counting, 128, cache_dir=tmp_path)
    assert counting.calls == 4 and len(entries(tmp_path)) == 4
    mrpc_rows = [{"sentence1": row["sentence1"], "sentence2": row["sentence2"], "label": 0} for row in rte_rows[:3]]
    keys = {features.features_key(mrpc_rows, get_task(name), tokenizer, 128) for name in ("mrpc", "rte", "wnli")}
    assert len(keys) == 3  # label names differ, so the keys do


def test_tokenizer_fingerprint_ignores_call_state_and_path(tokenizer, minilm_path, tmp_path):
    from transformers import AutoTokenizer

    before = tokenizer_fingerprint(tokenizer)
    tokenizer(["some text"], truncation=True, max_length=7)  # rewrites the backend's truncation settings
    assert tokenizer_fingerprint(tokenizer) == before
    copy = AutoTokenizer.from_pretrained(minilm_path)
    copy.save_pretrained(tmp_path / "copy")
    assert tokenizer_fingerprint(AutoTokenizer.from_pretrained(tmp_path / "copy")) == before
    cased = AutoTokenizer.from_pretrained(minilm_path, do_lower_case=False)
    assert tokenizer_fingerprint(cased) != before


def test_default_cache_dir_comes_from_the_environment(tokenizer, monkeypatch, tmp_path):
    monkeypatch.setenv("AUTOPELT_CACHE_DIR", str(tmp_path / "env-cache"))
    tokenize([{"sentence": "hello", "label": 0}], "sst2", tokenizer, 8)
    assert len(entries(tmp_path / "env-cache")) == 1
    monkeypatch.delenv("AUTOPELT_CACHE_DIR")
    assert cache.default_cache_dir() == cache.Path.home() / ".cache" / "autopelt"


def test_entries_are_npz_without_pickle(tokenizer, rte_rows, tmp_path):
    tokenize(rte_rows, "rte", tokenizer, 128, cache_dir=tmp_path)
    (path,) = entries(tmp_path)
    assert path.suffix == ".npz" and zipfile.is_zipfile(path)
    with np.load(path, allow_pickle=False) as stored:
        assert set(stored.files) == {"ids", "offsets", "token_type_ids", "labels", "pad_id", "regression"}
        assert all(stored[name].dtype != object for name in stored.files)


def test_a_failed_write_leaves_no_entry_and_no_temporary_file(tokenizer, rte_rows, tmp_path, monkeypatch):
    real_savez = np.savez

    def dies_half_way(file, **arrays):
        file.write(b"PK\x03\x04 half an archive")
        raise KeyboardInterrupt  # as if the process were stopped mid-write

    counting = CountingTokenizer(tokenizer)
    monkeypatch.setattr(cache.np, "savez", dies_half_way)
    with pytest.raises(KeyboardInterrupt):
        tokenize(rte_rows, "rte", counting, 128, cache_dir=tmp_path)
    assert list((tmp_path / "features").iterdir()) == []
    monkeypatch.setattr(cache.np, "savez", real_savez)
    tokenize(rte_rows, "rte", counting, 128, cache_dir=tmp_path)
    tokenize(rte_rows, "rte", counting, 128, cache_dir=tmp_path)
    assert counting.calls == 2 and len(entries(tmp_path)) == 1  # written once, then hit


def test_the_entry_appears_only_by_rename(tokenizer, rte_rows, tmp_path, monkeypatch):
    seen = []

    def watching_replace(source, target):
        seen.append((sorted(p.name for p in (tmp_path / "features").iterdir()), str(source), str(target)))
        return real_replace(source, target)

    real_replace = cache.os.replace
    monkeypatch.setattr(cache.os, "replace", watching_replace)
    tokenize(rte_rows, "rte", tokenizer, 128, cache_dir=tmp_path)
    ((before, source, target),) = seen
    assert before == [cache.Path(source).name] and source.endswith(".tmp") and target.endswith(".npz")
    assert cache.load_arrays(cache.Path(target)) is not None


def test_a_damaged_entry_is_recomputed(tokenizer, rte_rows, tmp_path):
    counting = CountingTokenizer(tokenizer)
    tokenize(rte_rows, "rte", counting, 128, cache_dir=tmp_path)
    (path,) = entries(tmp_path)
    path.write_bytes(path.read_bytes()[:100])
    assert cache.load_arrays(path) is None
    again = tokenize(rte_rows, "rte", counting, 128, cache_dir=tmp_path)
    assert counting.calls == 2 and len(again) == 200
    assert entries(tmp_path) == [path] and cache.load_arrays(path) is not None


def test_use_cache_false_writes_nothing(tokenizer, rte_rows, tmp_path):
    tokenize(rte_rows, "rte", tokenizer, 128, cache_dir=tmp_path, use_cache=False)
    assert not (tmp_path / "features").exists()


def test_max_length_is_clipped_to_the_model_and_checked(tokenizer, rte_rows, tmp_path):
    assert features.effective_max_length(tokenizer, 10_000) == 512
    with pytest.raises(UserError, match="max length"):
        tokenize(rte_rows, "rte", tokenizer, 0, cache_dir=tmp_path)


def test_encode_in_chunks_equals_one_call(tokenizer, rte_rows, monkeypatch):
    whole = encode(rte_rows, get_task("rte"), tokenizer, 64)
    monkeypatch.setattr(features, "CHUNK_ROWS", 7)
    chunked = encode(rte_rows, get_task("rte"), tokenizer, 64)
    for name, array in whole.to_arrays().items():
        np.testing.assert_array_equal(chunked.to_arrays()[name], array)


def test_select_of_no_rows_is_empty(tokenizer, rte_rows):
    none = encode(list(rte_rows), get_task("rte"), tokenizer, 64).select([])
    assert len(none) == 0 and none.offsets.tolist() == [0] and len(none.ids) == len(none.labels) == 0


@pytest.mark.parametrize("picked", [[5, 0, 199, 5], [7], list(range(200))[::-1]])
def test_select_equals_tokenising_those_rows(tokenizer, rte_rows, picked):
    whole = encode(list(rte_rows), get_task("rte"), tokenizer, 64)
    direct = encode([rte_rows[i] for i in picked], get_task("rte"), tokenizer, 64)
    chosen = whole.select(picked)
    for name in ("ids", "offsets", "token_type_ids", "labels"):
        np.testing.assert_array_equal(getattr(chosen, name), getattr(direct, name))

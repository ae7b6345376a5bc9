"""run_trial end to end on a tiny random BERT: the result contract, every GLUE schema, protocols,
reproducibility, and a saved delta that reloads to the same predictions."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from tinymodels import (  # noqa: F401  (fixtures)
    make_settings, make_tiny_model_folder, sst2_dir, tiny_model_dir, trial_cache, trial_settings, write_glue_like,
    write_task,
)

import autopelt.train.trial_data as train_data
from autopelt import delta
from autopelt.data import get_task
from autopelt.models import load_model, load_tokenizer
from autopelt.train import TrialSettings, run_trial
from autopelt.train.trial_data import prepare_data
from autopelt.errors import UserError
from autopelt.train.classify import evaluate
from autopelt.train.saved import score_saved

# Every top-level field of the result JSON in docs/design.md.
DESIGN_FIELDS = (
    "status", "reason", "spec", "task", "model", "seed", "protocol", "metric", "dev", "test", "extra_tests",
    "dev_metric", "params", "train_seconds", "eval_seconds", "overhead_seconds", "examples_per_second", "peak_memory_mb",
    "epochs_run", "best_epoch", "history", "gates", "delta_dir", "settings",
)
PARAM_FIELDS = {"trainable", "stored", "base", "trainable_pct", "stored_pct"}
TINY_UNIPELT = {"methods": [  # unipelt_apl's shape at tiny sizes
    {"method": "pfeiffer", "bottleneck": 8, "gate": True},
    {"method": "prefix", "length": 3, "reparam_hidden": 16, "gate": True},
    {"method": "lora", "rank": 4, "gate": True}]}


def delta_tensors(result: dict) -> dict[str, torch.Tensor]:
    return load_file(f"{result['delta_dir']}/delta.safetensors")


def delta_header(result: dict) -> dict:
    return json.loads(open(f"{result['delta_dir']}/delta.json").read())


def assert_ok(result: dict) -> None:
    assert result["status"] == "ok", result.get("reason")
    assert result["reason"] is None


# ---------------------------------------------------------------------------------------------- learning


def test_tiny_model_learns_the_synthetic_task(make_settings, tmp_path):
    """"good" -> 1: LoRA on the tiny model goes from chance to (near) perfect; the numbers move for real."""
    data = write_glue_like(tmp_path, "sst2", train=200, test=64)
    result = run_trial(make_settings(data_dir=data, epochs=3))
    assert_ok(result)
    print(f"tiny sst2: dev {[h['dev_metric'] for h in result['history']]} test {result['test']}")
    assert result["test"]["accuracy"] >= 0.9
    assert result["history"][0]["dev_metric"] < result["dev_metric"]  # it improved while training


# ---------------------------------------------------------------------------------------------- result contract


def test_result_has_every_design_field_and_honest_numbers(make_settings, tiny_model_dir, tmp_path):
    settings = make_settings(spec=TINY_UNIPELT, epochs=2, out_dir=str(tmp_path / "out"))
    result = run_trial(settings)
    assert_ok(result)
    assert set(DESIGN_FIELDS) <= set(result), f"missing: {set(DESIGN_FIELDS) - set(result)}"
    assert set(result["params"]) >= PARAM_FIELDS

    # written to out_dir/result.json, the same record as returned
    on_disk = json.loads((tmp_path / "out" / "result.json").read_text())
    assert on_disk == json.loads(json.dumps(result, default=str))

    assert result["task"] == "sst2" and result["seed"] == 0 and result["metric"] == "accuracy"
    assert result["model"] == str(tiny_model_dir)
    assert result["spec"] == delta.parse_spec(TINY_UNIPELT).to_dict()
    assert result["settings"] == settings.to_dict()
    assert TrialSettings.from_dict(result["settings"]) == settings
    assert result["protocol"]["name"] == "full"
    assert (result["protocol"]["train_size"], result["protocol"]["dev_size"], result["protocol"]["test_size"]) == (
        58, 6, 32)

    # the numbers: epochs, history, best, timings
    assert result["epochs_run"] == 2 and len(result["history"]) == 2
    assert [h["epoch"] for h in result["history"]] == [1, 2]
    assert result["dev_metric"] == max(h["dev_metric"] for h in result["history"])
    best = next(h for h in result["history"] if h["dev_metric"] == result["dev_metric"])
    assert result["best_epoch"] == best["epoch"] and result["dev"] == best["dev"]
    assert result["train_seconds"] > 0 and result["eval_seconds"] > 0 and result["overhead_seconds"] >= 0
    examples_seen = result["epochs_run"] * result["protocol"]["train_size"]
    assert result["examples_per_second"] * result["train_seconds"] == pytest.approx(examples_seen)
    assert result["peak_memory_mb"] > 0

    # params: trainable == what a built model trains; stored == what was saved; base == the model alone
    model = load_model(str(tiny_model_dir), 2, seed=0)
    base = sum(p.numel() for p in model.parameters())
    delta.apply_delta(model, TINY_UNIPELT, seed=0)
    params = result["params"]
    assert params["trainable"] == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert params["stored"] == sum(t.numel() for t in delta_tensors(result).values())
    assert params["stored"] < params["trainable"]  # the prefix MLP is not stored
    assert params["base"] == base
    assert params["trainable_pct"] == pytest.approx(100 * params["trainable"] / base)
    assert params["stored_pct"] == pytest.approx(100 * params["stored"] / base)

    # gates: every gated method, every layer, a sigmoid's value
    assert set(result["gates"]) == {"adapter", "prefix", "lora"}
    for kind, layers in result["gates"].items():
        assert set(layers) == {"0", "1"}, kind
        assert all(0 < value < 1 for value in layers.values()), (kind, layers)
    assert result["delta_dir"] == str(tmp_path / "out" / "delta")


def test_ungated_result_without_out_dir_still_has_gates_and_delta_dir_as_null(make_settings):
    """docs/design.md: `"gates": null`, `"delta_dir": "path or null"` — present, not missing."""
    result = run_trial(make_settings(epochs=1))
    assert_ok(result)
    assert "gates" in result and result["gates"] is None
    assert "delta_dir" in result and result["delta_dir"] is None


def test_failed_result_has_every_design_field(make_settings, tmp_path):
    """A failed trial is a result of the same shape: readers never need to guess which keys exist."""
    result = run_trial(make_settings(data_dir=tmp_path / "nowhere", out_dir=str(tmp_path / "out")))
    assert result["status"] == "failed"
    assert set(DESIGN_FIELDS) <= set(result), f"missing: {sorted(set(DESIGN_FIELDS) - set(result))}"


# ---------------------------------------------------------------------------------------------- every GLUE schema

GLUE_CASES = {  # task: (main metric, every metric key, num_labels)
    "cola": ("matthews_correlation", {"matthews_correlation"}, 2),
    "sst2": ("accuracy", {"accuracy"}, 2),
    "mrpc": ("accuracy", {"accuracy", "f1", "combined_score"}, 2),
    "qqp": ("accuracy", {"accuracy", "f1", "combined_score"}, 2),
    "stsb": ("pearson", {"pearson", "spearman", "combined_score"}, 1),
    "mnli": ("accuracy", {"accuracy"}, 3),
    "mnli-mm": ("accuracy", {"accuracy"}, 3),
    "qnli": ("accuracy", {"accuracy"}, 2),
    "rte": ("accuracy", {"accuracy"}, 2),
    "wnli": ("accuracy", {"accuracy"}, 2),
}


@pytest.fixture(scope="module")
def glue_like_dir(tmp_path_factory):
    """Every GLUE task in its schema; MNLI's matched (24 rows) and mismatched (20 rows) sets differ in size."""
    folder = tmp_path_factory.mktemp("glue-like")
    for task in GLUE_CASES:
        if task not in ("mnli", "mnli-mm"):
            write_glue_like(folder, task, train=40, test=24)
    write_task(folder, "mnli", {"train": 40, "validation_matched": 24, "validation_mismatched": 20})
    return folder


@pytest.mark.parametrize("task", list(GLUE_CASES))
def test_every_glue_schema_runs_end_to_end(task, make_settings, glue_like_dir, tmp_path):
    metric, keys, num_labels = GLUE_CASES[task]
    result = run_trial(make_settings(task=task, data_dir=glue_like_dir, epochs=1, out_dir=str(tmp_path)))
    assert_ok(result)
    assert result["metric"] == metric
    assert set(result["dev"]) == keys and set(result["test"]) == keys
    assert all(math.isfinite(v) for v in [*result["dev"].values(), *result["test"].values()]), result
    assert result["dev_metric"] == result["dev"][metric]
    assert result["protocol"]["test_size"] == (20 if task == "mnli-mm" else 24)
    if task == "mnli":  # the same trained delta scored on matched (test) and mismatched
        assert set(result["extra_tests"]) == {"validation_mismatched"}
        assert set(result["extra_tests"]["validation_mismatched"]) == keys
        assert result["protocol"]["validation_mismatched_size"] == 20
    else:
        assert result["extra_tests"] == {}
    header = delta_header(result)
    assert header["num_labels"] == num_labels
    assert header["problem_type"] == ("regression" if task == "stsb" else "single_label_classification")
    assert delta_tensors(result)["classifier.weight"].shape == (num_labels, 32)


def test_a_regression_trains_from_the_mean_of_its_training_labels(make_settings, glue_like_dir, tmp_path):
    settings = make_settings(task="stsb", data_dir=glue_like_dir, epochs=1, learning_rate=1e-9, out_dir=str(tmp_path))
    result = run_trial(settings)
    assert_ok(result)
    assert result["head_centered"] is True
    train = prepare_data(settings, load_tokenizer(settings.model)).train
    # at a rate that moves nothing, the saved head's bias is where training started: the labels' mean, not zero
    bias = float(delta_tensors(result)["classifier.bias"][0])
    assert abs(float(np.mean(train.labels))) > 0.5 and bias == pytest.approx(float(np.mean(train.labels)), abs=1e-4)


# ---------------------------------------------------------------------------------------------- K-shot protocol


@pytest.fixture
def spy_splits(monkeypatch):
    """Record the splits every trial's data preparation made."""
    seen = []
    real = train_data.make_splits

    def recording(*args, **kwargs):
        splits = real(*args, **kwargs)
        seen.append(splits)
        return splits

    monkeypatch.setattr(train_data, "make_splits", recording)
    return seen


def test_k_shot_protocol_sizes(make_settings, tmp_path):
    small = write_glue_like(tmp_path / "small", "sst2", train=64, test=32)
    big = write_glue_like(tmp_path / "big", "sst2", train=1100, test=32)
    result = run_trial(make_settings(data_dir=small, protocol=16, epochs=1))
    assert_ok(result)
    protocol = result["protocol"]
    assert (protocol["name"], protocol["k"], protocol["train_size"], protocol["dev_size"], protocol["test_size"]) == (
        "k-shot", 16, 16, 48, 32)  # dev: all of the remaining 48 rows
    result = run_trial(make_settings(data_dir=big, protocol=16, epochs=1))
    assert_ok(result)
    protocol = result["protocol"]
    assert (protocol["train_size"], protocol["dev_size"], protocol["test_size"]) == (16, 1000, 32)  # dev capped


def test_k_shot_rows_follow_data_seed_not_seed(make_settings, spy_splits):
    def rows_of(**overrides):
        result = run_trial(make_settings(protocol=16, epochs=1, **overrides))
        assert_ok(result)
        splits = spy_splits[-1]
        return splits.train, splits.dev, splits.test

    first = rows_of(seed=0, data_seed=5)
    same_data_seed = rows_of(seed=1, data_seed=5)
    other_data_seed = rows_of(seed=0, data_seed=6)
    seed_as_data_seed = rows_of(seed=5)
    assert len(first[0]) == 16 and len(first[1]) == 48
    assert first == same_data_seed == seed_as_data_seed
    assert first[0] != other_data_seed[0] and first[2] == other_data_seed[2]


def test_other_seeds_and_k_reuse_the_tokenised_splits(make_settings, tiny_model_dir):
    """Whole splits are tokenised once; a protocol picks its rows from them (no new cache entries)."""
    from pathlib import Path

    from autopelt.models import load_tokenizer

    tokenizer = load_tokenizer(str(tiny_model_dir))
    settings = make_settings(protocol=16, data_seed=0)
    first = prepare_data(settings, tokenizer)
    entries = sorted((Path(settings.cache_dir) / "features").glob("*"))
    other = prepare_data(make_settings(protocol=8, data_seed=1, max_train_examples=4), tokenizer)
    assert sorted((Path(settings.cache_dir) / "features").glob("*")) == entries
    assert (len(first.train), len(other.train), len(first.test)) == (16, 4, 32)
    assert not np.array_equal(first.train.ids, other.train.ids)


def test_max_train_examples_subsamples_train_only(make_settings):
    result = run_trial(make_settings(max_train_examples=20, epochs=1))
    assert_ok(result)
    assert (result["protocol"]["train_size"], result["protocol"]["dev_size"]) == (20, 6)
    assert result["steps"] == 2  # ceil(20 / 16)


# ---------------------------------------------------------------------------------------------- reproducibility

NOISY_LORA = {"methods": [{"method": "lora", "rank": 4, "dropout": 0.2}]}  # dropout: the global RNG matters


def test_same_settings_give_identical_results_and_deltas(make_settings, glue_like_dir, tmp_path):
    """Twice the same settings, with another seed's trial in between: identical metrics and tensors."""
    def run(seed: int, name: str) -> dict:
        settings = make_settings(task="stsb", data_dir=glue_like_dir, spec=NOISY_LORA, seed=seed, epochs=2,
                                 out_dir=str(tmp_path / name))
        result = run_trial(settings)
        assert_ok(result)
        return result

    first, other, again = run(0, "first"), run(1, "other"), run(0, "again")
    assert again["dev"] == first["dev"] and again["test"] == first["test"]
    assert [h["dev"] for h in again["history"]] == [h["dev"] for h in first["history"]]
    a, b, c = delta_tensors(first), delta_tensors(again), delta_tensors(other)
    assert set(a) == set(b) == set(c)
    assert all(torch.equal(a[name], b[name]) for name in a)
    different = [name for name in a if not torch.equal(a[name], c[name])]
    assert set(different) == set(a), f"tensors the seed did not change: {set(a) - set(different)}"
    assert other["test"] != first["test"]


# ---------------------------------------------------------------------------------------------- saved delta reloads

RELOAD_SPECS = {
    "lora": {"methods": [{"method": "lora", "rank": 4, "targets": ["query", "value", "output"]}]},
    "adamix_adapter": {"methods": [{"method": "adamix", "experts": 3,
                                    "delta": {"method": "adapter", "bottleneck": 8}}]},
    "unipelt": TINY_UNIPELT,
}


@pytest.mark.parametrize("name", list(RELOAD_SPECS))
def test_saved_delta_reloads_to_the_same_test_metric(name, make_settings, tiny_model_dir, glue_like_dir, tmp_path):
    """STS-B's Pearson is a continuous function of every prediction: equal values mean equal outputs. In fp32 on
    both sides: `auto` is bf16 on a CPU that computes it natively, and the evaluation below is fp32."""
    settings = make_settings(task="stsb", data_dir=glue_like_dir, spec=RELOAD_SPECS[name], epochs=2,
                             out_dir=str(tmp_path), precision="fp32")
    result = run_trial(settings)
    assert_ok(result)
    task = get_task("stsb")
    data = prepare_data(settings, load_tokenizer(str(tiny_model_dir)), task)

    def test_metrics(model) -> dict:
        metrics, _ = evaluate(model, data.test, task, settings, torch.device("cpu"))
        return metrics

    fresh = load_model(str(tiny_model_dir), 1, task.problem_type, seed=99)  # another head init: it must be loaded
    without_delta = test_metrics(fresh)
    reloaded = test_metrics(delta.load_delta(fresh, result["delta_dir"]).eval())
    assert reloaded == pytest.approx(result["test"], rel=1e-5, abs=1e-6)
    assert without_delta["pearson"] != pytest.approx(result["test"]["pearson"], rel=1e-3)


@pytest.mark.parametrize("precision", ["fp32", "auto"])
def test_a_trial_trained_without_test_is_scored_later_to_the_same_numbers(precision, make_settings, glue_like_dir,
                                                                          tmp_path):
    """A search trial trains with score_test off (no test scores, no test time); `score_saved` then scores its
    saved delta to what scoring as it trained gives: the same continuous Pearson, in the trial's precision."""
    def settings(folder: str, score_test: bool):
        return make_settings(task="stsb", data_dir=glue_like_dir, spec=TINY_UNIPELT, epochs=2, precision=precision,
                             out_dir=str(tmp_path / folder), score_test=score_test)

    scored = run_trial(settings("scored", True))
    unscored = run_trial(settings("unscored", False))
    assert_ok(scored), assert_ok(unscored)
    assert unscored["test"] is None and scored["test"]
    assert unscored["dev"] == scored["dev"]  # the same training: test is never read during it
    later, extra = score_saved(unscored)
    assert later == pytest.approx(scored["test"], rel=1e-6, abs=1e-7) and extra == {}


def test_scoring_a_trial_that_kept_no_delta_is_one_line(make_settings):
    result = run_trial(make_settings(max_steps=2, epochs=1, score_test=False))
    with pytest.raises(UserError, match="kept no delta"):
        score_saved(result)


def test_a_checkpoint_with_its_own_head_gets_a_fresh_seeded_head(tmp_path, minilm_path, trial_cache, glue_like_dir):
    """A fine-tuned checkpoint (2-label head) as the base: any task runs, and the head is the trial's own."""
    folder = make_tiny_model_folder(tmp_path / "finetuned", minilm_path, head_labels=2)
    checkpoint_head = load_file(str(folder / "model.safetensors"))["classifier.weight"]

    def run(task: str, seed: int = 0) -> dict:
        # lr 1e-12: the saved head is its initialisation, to float32 precision
        settings = trial_settings(folder, glue_like_dir, trial_cache, task=task, seed=seed, epochs=1,
                                  learning_rate=1e-12, out_dir=str(tmp_path / f"{task}-{seed}"))
        result = run_trial(settings)
        assert_ok(result)
        return result

    assert delta_tensors(run("stsb"))["classifier.weight"].shape == (1, 32)
    heads = [delta_tensors(run("sst2", seed))["classifier.weight"] for seed in (0, 1)]
    assert not torch.equal(heads[0], checkpoint_head), "the checkpoint's head was reused, not initialised"
    assert not torch.equal(heads[0], heads[1]), "the head's initialisation does not follow the seed"


def test_peak_memory_is_this_trials_not_the_process_maximum():
    """A reused Ray worker runs many trials: the second one must not report the first one's peak."""
    import time

    from autopelt.train.device import PeakMemory

    cpu = torch.device("cpu")
    with PeakMemory(cpu, every=0.01) as first:
        big = torch.ones(64 * 2**20)  # 256 MiB, touched
        time.sleep(0.1)
        del big
    with PeakMemory(cpu, every=0.01) as second:
        time.sleep(0.05)
    assert first.mb - second.mb > 200

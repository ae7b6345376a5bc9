"""Warm workers (autopelt/train/warm.py): a trial on a held model and held rows is bit-identical to the same trial
loaded cold, whatever trials ran before it; another key loads anew; AUTOPELT_WARM=0 turns holding off."""

from __future__ import annotations

import pytest
import torch
from generationdata import make_tiny_lm_folder, write_e2e_like
from safetensors.torch import load_file
from tinymodels import make_tiny_model_folder, tiny_model_dir, trial_cache, trial_settings, write_glue_like  # noqa: F401

from autopelt.train import TrialSettings, run_trial, warm

SPECS = {
    "lora": {"methods": [{"method": "lora", "rank": 4}]},
    "bitfit": {"methods": [{"method": "bitfit"}]},
    "ia3": {"methods": [{"method": "ia3"}]},
    "pfeiffer": {"methods": [{"method": "pfeiffer", "bottleneck": 8}]},
    "prefix": {"methods": [{"method": "prefix", "length": 3, "reparam_hidden": 16}]},
    "prompt": {"methods": [{"method": "prompt", "length": 4}]},
    "vera": {"methods": [{"method": "vera", "rank": 16}]},
    "adamix": {"methods": [{"method": "adamix", "experts": 2, "delta": {"method": "adapter", "placement": "ffn",
                                                                         "bottleneck": 8}}]},
    "unipelt": {"methods": [{"method": "pfeiffer", "bottleneck": 8, "gate": True},  # gated UniPELT, tiny
                            {"method": "prefix", "length": 3, "reparam_hidden": 16, "gate": True},
                            {"method": "lora", "rank": 4, "gate": True}], "pooling": "mean"},
}
COMPARED = ("status", "reason", "dev", "test", "dev_metric", "history", "best_epoch", "steps", "params", "gates",
            "learning_rate")


@pytest.fixture
def settings(tiny_model_dir, trial_cache, glue_dir, tmp_path):
    """Real SST-2 rows (K=48, dev 32, test the 872 validation rows), one epoch at a given rate."""
    made = iter(range(1000))

    def make(method: str, **overrides):
        values = dict(spec=SPECS[method], protocol=48, dev_size=32, epochs=1, batch_size=8, max_length=48,
                      backbone_dropout="model", out_dir=str(tmp_path / f"trial-{next(made)}"))
        values.update(overrides)
        return trial_settings(tiny_model_dir, values.pop("data_dir", glue_dir), trial_cache, **values)

    return make


@pytest.fixture(autouse=True)
def holding(monkeypatch):
    """Holding on (the other tests' trials load cold: tests/conftest.py), nothing held yet."""
    monkeypatch.setenv(warm.WARM_ENV, "1")
    warm.forget()
    yield
    warm.forget()


def cold(settings, monkeypatch) -> dict:
    monkeypatch.setenv(warm.WARM_ENV, "0")
    result = run_trial(settings)
    monkeypatch.setenv(warm.WARM_ENV, "1")
    assert result["warm"] == {"model": False, "data": False}
    return result


def assert_same_trial(one: dict, other: dict) -> None:
    assert one["status"] == "ok", one["reason"]
    assert {k: one[k] for k in COMPARED} == {k: other[k] for k in COMPARED}
    mine, theirs = (load_file(f"{r['delta_dir']}/delta.safetensors") for r in (one, other))
    assert mine.keys() == theirs.keys() and mine
    assert all(torch.equal(mine[name], theirs[name]) for name in mine)


@pytest.mark.parametrize("before, method", [("bitfit", "lora"), ("ia3", "pfeiffer"), ("lora", "unipelt"),
                                            ("prompt", "prefix"), ("adamix", "bitfit")])
def test_a_warm_trial_is_the_cold_trial(before, method, settings, monkeypatch):
    expected = cold(settings(method), monkeypatch)
    loads = []
    real_load = warm.load_model
    monkeypatch.setattr(warm, "load_model", lambda *args, **kwargs: loads.append(args) or real_load(*args, **kwargs))
    first = run_trial(settings(before))
    assert first["warm"] == {"model": False, "data": False} and first["status"] == "ok"
    again = run_trial(settings(method))
    assert again["warm"] == {"model": True, "data": True}
    assert_same_trial(again, expected)
    assert len(loads) == 1  # the second trial read no weights: it copied the held model


def test_every_method_leaves_the_held_model_as_loaded(settings, monkeypatch):
    """A trial of each method on the held model, then LoRA: still the cold LoRA trial (a tensor any of them had
    changed in the held model would move its numbers)."""
    expected = cold(settings("lora"), monkeypatch)
    for method in SPECS:
        assert run_trial(settings(method))["status"] == "ok", method
    assert_same_trial(run_trial(settings("lora")), expected)


def test_another_seed_draws_as_a_cold_load(settings, monkeypatch):
    """The load's draws from the global generator are replayed for a seed the held model was not loaded with: the
    head, the delta and the dropout masks are the cold trial's."""
    expected = cold(settings("lora", seed=3, data_seed=0), monkeypatch)
    run_trial(settings("bitfit", seed=0, data_seed=0))
    again = run_trial(settings("lora", seed=3, data_seed=0))
    assert again["warm"]["model"]
    assert_same_trial(again, expected)


def test_dropout_masks_are_the_cold_trials(settings, monkeypatch):
    """The tiny model has no dropout of its own, so only a delta's dropout reads the global random state a held
    model hands out: with LoRA's dropout on, a warm trial (another seed than the load's, after a trial that drew
    from the generator) is still the cold trial only where that state is the one a cold load leaves."""
    dropout = {"methods": [{"method": "lora", "rank": 4, "dropout": 0.3}]}
    expected = cold(settings("lora", spec=dropout, seed=3, data_seed=0), monkeypatch)
    assert run_trial(settings("lora", spec=dropout, seed=0, data_seed=0))["status"] == "ok"
    again = run_trial(settings("lora", spec=dropout, seed=3, data_seed=0))
    assert again["warm"] == {"model": True, "data": True}
    assert_same_trial(again, expected)


def test_a_regression_head_is_fresh_and_centred_each_trial(settings, tmp_path, monkeypatch):
    data = write_glue_like(tmp_path / "data", "stsb", train=80, test=24)
    expected = cold(settings("bitfit", task="stsb", data_dir=str(data), protocol="full", dev_size=16), monkeypatch)
    run_trial(settings("lora", task="stsb", data_dir=str(data), protocol="full", dev_size=16))
    again = run_trial(settings("bitfit", task="stsb", data_dir=str(data), protocol="full", dev_size=16))
    assert again["warm"] == {"model": True, "data": True} and again["head_centered"]
    assert_same_trial(again, expected)


def test_a_different_key_loads_anew(settings, tmp_path):
    run_trial(settings("lora"))
    assert run_trial(settings("lora", max_length=40))["warm"] == {"model": True, "data": False}
    other = make_tiny_model_folder(tmp_path / "other-model", settings("lora").model, seed=1)
    assert run_trial(settings("lora", model=str(other), max_length=40))["warm"] == {"model": False, "data": False}
    back = run_trial(settings("lora", max_length=40))  # one model is held: the first was let go
    assert back["warm"] == {"model": False, "data": False}
    assert run_trial(settings("lora", max_length=40, precision="bf16"))["warm"]["model"] is False


def test_a_model_whose_load_draws_from_the_seed_is_held_for_that_seed(settings, tmp_path, monkeypatch,
                                                                       minilm_path):
    """A checkpoint without BERT's pooler: its load initialises the pooler from the seed, so the held model
    serves that seed alone, and a trial of another seed loads (and is the cold trial)."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    folder = tmp_path / "no-pooler"
    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64), add_pooling_layer=False).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    expected = cold(settings("lora", model=str(folder), seed=1, data_seed=0), monkeypatch)
    run_trial(settings("lora", model=str(folder), seed=0, data_seed=0))
    assert run_trial(settings("bitfit", model=str(folder), seed=0, data_seed=0))["warm"]["model"]
    again = run_trial(settings("lora", model=str(folder), seed=1, data_seed=0))
    assert again["warm"]["model"] is False
    assert_same_trial(again, expected)


def test_warm_off_loads_every_trial(settings, monkeypatch):
    monkeypatch.setenv(warm.WARM_ENV, "off")
    run_trial(settings("lora"))
    assert run_trial(settings("lora"))["warm"] == {"model": False, "data": False}


def test_a_warm_generation_trial_is_the_cold_trial(tmp_path, monkeypatch):
    """A generation trial's language model (tied embeddings, no task head) is held as a classifier's is."""
    pytest.importorskip("sacrebleu")
    model, data = make_tiny_lm_folder(tmp_path / "lm"), write_e2e_like(tmp_path / "gen")

    def settings(method: str, name: str) -> TrialSettings:
        return TrialSettings(task="e2e", spec=SPECS[method], model=str(model), data_dir=str(data),
                             custom_task={"input_column": "mr", "target_column": "ref"}, epochs=1, batch_size=8,
                             learning_rate=1e-2, threads=1, max_new_tokens=4, out_dir=str(tmp_path / name))

    expected = cold(settings("lora", "cold"), monkeypatch)
    assert run_trial(settings("prompt", "first"))["warm"]["model"] is False
    again = run_trial(settings("lora", "again"))
    assert again["warm"]["model"]
    assert_same_trial(again, expected)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="a CUDA GPU: a 4-bit base loads its head onto the GPU"))])
def test_a_fresh_head_is_the_same_draw_wherever_the_head_lives(tiny_model_dir, device):
    """`fresh_head` draws on the CPU and copies: a head already on a GPU (a 4-bit base's) is drawn, not refused
    ("Expected a 'cuda' device type for generator"), and equals the CPU's draw."""
    from autopelt.delta.families import architecture_of
    from autopelt.models import fresh_head, load_model

    on_cpu = load_model(str(tiny_model_dir), 2, seed=5)
    there = load_model(str(tiny_model_dir), 2, seed=0).to(device)
    fresh_head(there, 5)
    for part in architecture_of(on_cpu.config).head_parts:
        for (name, want), got in zip(on_cpu.get_submodule(part).state_dict().items(),
                                     there.get_submodule(part).state_dict().values()):
            assert torch.equal(want, got.cpu()), name

"""Precision as a setting: `auto` follows the device's native bf16 where it is faster, fp32 is unchanged, bf16 keeps
what trains in fp32."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from autopelt import delta
from autopelt.errors import UserError
from autopelt.models import load_model
from autopelt.dtypes import cast_frozen_weights
from autopelt.train import device as devices
from autopelt.train import run_trial
from autopelt.train.command import summary
from autopelt.train.settings import TrialSettings
from tinymodels import TINY_LORA, make_settings, sst2_dir, tiny_model_dir, trial_cache  # noqa: F401  (fixtures)

GOLDEN = Path(__file__).parent / "fixtures" / "fp32_trial.json"
UNIPELT_TINY = {"methods": [{"method": "adapter", "bottleneck": 8, "gate": True},
                            {"method": "prefix", "length": 3, "reparam_hidden": 16, "gate": True},
                            {"method": "lora", "rank": 4, "gate": True}]}
CPU = torch.device("cpu")


@pytest.fixture
def fresh_probe():
    """The CPU's flags and bf16 speedup asked anew in the test, and forgotten after it (both are cached)."""
    caches = (devices.cpu_bf16_speedup, devices.cpu_has_native_bf16)
    for cache in caches:
        cache.cache_clear()
    yield
    for cache in caches:
        cache.cache_clear()


# -- which precision ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("pays, expected", [(True, "bf16"), (False, "fp32")])
def test_auto_is_bf16_exactly_where_the_cpu_computes_it_faster(monkeypatch, pays, expected):
    monkeypatch.setattr(devices, "cpu_bf16_pays", lambda: pays)
    assert devices.resolve_precision("auto", CPU) == expected
    for asked in ("fp32", "bf16", "fp16"):  # what is asked is what runs
        assert devices.resolve_precision(asked, CPU) == asked


@pytest.mark.parametrize("native, speedup, expected", [
    (True, 2.0, True),    # AMD EPYC with AVX512-BF16: a step in half the time
    (True, 0.5, False),   # an Intel Xeon VM with AVX512-BF16 and no AMX: bf16 twice as slow
    (True, 1.1, False),   # not enough faster to change how a trial computes
    (True, devices.BF16_SPEEDUP, True),  # just enough
    (True, 0.0, False),   # no bf16 kernel in this torch
    (False, None, False),  # no native bf16: nothing is timed
])
def test_native_bf16_is_used_only_where_it_measures_faster(monkeypatch, fresh_probe, native, speedup, expected):
    monkeypatch.delenv(devices.SPEEDUP_ENV, raising=False)  # the tests' own setting (conftest) aside
    timed = []
    monkeypatch.setattr(devices, "cpu_has_native_bf16", lambda: native)
    monkeypatch.setattr(devices, "bf16_matmul_speedup", lambda: timed.append(1) or speedup)
    assert devices.cpu_bf16_pays() is expected
    assert devices.cpu_bf16_pays() is expected
    assert len(timed) == (1 if native else 0)  # timed once per process
    assert ("auto = bf16" in devices.cpu_precision_note()) is expected


@pytest.mark.parametrize("given, speedup, expected", [("2.0", 2.0, "bf16"), ("0.55", 0.55, "fp32"),
                                                     ("none", None, "fp32")])
def test_a_speedup_measured_by_the_search_is_taken_as_it_is(monkeypatch, fresh_probe, given, speedup, expected):
    monkeypatch.setenv(devices.SPEEDUP_ENV, given)
    monkeypatch.setattr(devices, "bf16_matmul_speedup", lambda: pytest.fail("measured again"))
    assert devices.cpu_bf16_speedup() == speedup
    assert devices.resolve_precision("auto", CPU) == expected


def test_a_search_measures_once_and_hands_the_speedup_to_its_workers(monkeypatch, fresh_probe):
    monkeypatch.delenv(devices.SPEEDUP_ENV, raising=False)
    monkeypatch.setattr(devices, "cpu_has_native_bf16", lambda: True)
    monkeypatch.setattr(devices, "bf16_matmul_speedup", lambda: 0.5432)
    devices.share_cpu_bf16_speedup()
    assert os.environ[devices.SPEEDUP_ENV] == "0.543"  # what a worker process started now inherits
    monkeypatch.setenv(devices.SPEEDUP_ENV, "1.5")  # set by the user: kept
    devices.share_cpu_bf16_speedup()
    assert os.environ[devices.SPEEDUP_ENV] == "1.5"


def test_a_speedup_that_is_no_number_is_a_one_line_error(monkeypatch, fresh_probe):
    monkeypatch.setenv(devices.SPEEDUP_ENV, "fast")
    with pytest.raises(UserError, match="AUTOPELT_CPU_BF16_SPEEDUP must be a number or 'none', not 'fast'"):
        devices.resolve_precision("auto", CPU)


def test_the_bf16_probe_times_both_precisions_without_touching_the_global_rng():
    state = torch.get_rng_state()
    speedup = devices.bf16_matmul_speedup(rows=64, width=32, out=48, rounds=2)
    assert 0 < speedup < float("inf")
    assert torch.equal(torch.get_rng_state(), state)


@pytest.mark.parametrize("flags, expected", [
    ({"_is_avx512_bf16_supported": True, "_is_amx_tile_supported": False}, True),
    ({"_is_avx512_bf16_supported": False, "_is_amx_tile_supported": True}, True),
    ({"_is_avx512_bf16_supported": False, "_is_amx_tile_supported": False}, False),
])
def test_cpu_detection_asks_torch_for_avx512_bf16_or_amx(monkeypatch, fresh_probe, flags, expected):
    for name, value in flags.items():
        monkeypatch.setattr(torch.cpu, name, lambda value=value: value, raising=False)
    assert devices.cpu_has_native_bf16() is expected


@pytest.mark.parametrize("flags, expected", [("fpu avx2 avx512_bf16", True), ("fpu amx_bf16 amx_tile", True),
                                             ("fpu sse avx2 avx512f", False)])
def test_without_torch_probes_linux_cpu_flags_decide(monkeypatch, fresh_probe, flags, expected):
    monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported", raising=False)
    monkeypatch.setattr(devices, "_cpuinfo_flags", lambda: set(flags.split()))
    assert devices.cpu_has_native_bf16() is expected


def test_a_bad_precision_is_a_one_line_error():
    from autopelt.errors import UserError

    with pytest.raises(UserError, match="precision must be one of auto, fp32, bf16, fp16"):
        TrialSettings(task="sst2", spec=TINY_LORA, precision="fp8")


def test_settings_written_with_autocast_still_load():
    """Before `precision`, autocast false meant fp32 everywhere; true meant mixed precision on CUDA (`auto`)."""
    old = TrialSettings(task="sst2", spec=TINY_LORA).to_dict()
    del old["precision"]
    assert TrialSettings.from_dict({**old, "autocast": False}).precision == "fp32"
    assert TrialSettings.from_dict({**old, "autocast": True}).precision == "auto"


# -- what runs in which precision ---------------------------------------------------------------------------


def _golden_record(result: dict, model_dir: Path) -> dict:
    weights = delta.load_delta(load_model(str(model_dir), 2, seed=0), result["delta_dir"])
    trained = {name: p.detach().double().sum().item() for name, p in weights.named_parameters() if p.requires_grad}
    return {"dev": result["dev"], "test": result["test"], "history": [h["dev"] for h in result["history"]],
            "trained_sums": trained}


def golden_settings(make_settings, out_dir: str, **extra):
    return make_settings(spec=UNIPELT_TINY, epochs=2, seed=3, out_dir=out_dir, **extra)


def test_fp32_trials_are_bit_identical_to_before_precision_existed(make_settings, tiny_model_dir, tmp_path):
    """The fixture was written by the code before this setting existed (commit b759325, fp32 only), on the CPU
    it names; on that CPU kind the numbers must match to the last bit, elsewhere to float rounding."""
    golden = json.loads(GOLDEN.read_text())
    result = run_trial(golden_settings(make_settings, str(tmp_path), precision="fp32"))
    assert result["status"] == "ok", result["reason"]
    assert result["precision"] == "fp32"
    now = _golden_record(result, tiny_model_dir)
    if golden["cpu"] == torch.backends.cpu.get_cpu_capability() and golden["torch"] == torch.__version__:
        assert now == golden["record"]
    else:
        assert now["history"] == golden["record"]["history"]
        # two epochs carry other kernels' rounding into the weights: on an AVX-512 CPU against the AVX2 fixture the
        # dev history matched exactly and one prefix sum of 47 moved by 3.8e-5 (relative)
        assert now["trained_sums"] == pytest.approx(golden["record"]["trained_sums"], rel=1e-4, abs=1e-6)


def test_a_bf16_trial_trains_fp32_parameters_with_fp32_optimizer_state(monkeypatch, make_settings):
    optimizers = []
    real = torch.optim.AdamW

    def spy(*args, **kwargs):
        optimizers.append(real(*args, **kwargs))
        return optimizers[-1]

    monkeypatch.setattr(torch.optim, "AdamW", spy)
    result = run_trial(make_settings(spec=UNIPELT_TINY, epochs=1, precision="bf16"))
    assert result["status"] == "ok", result["reason"]
    assert result["precision"] == "bf16"
    (optimizer,) = optimizers
    states = [optimizer.state[p] for group in optimizer.param_groups for p in group["params"]]
    assert states and all(s["exp_avg"].dtype == s["exp_avg_sq"].dtype == torch.float32 for s in states)
    assert all(p.dtype == torch.float32 for group in optimizer.param_groups for p in group["params"])


def test_casting_the_frozen_backbone_once_changes_no_logit(tiny_model_dir):
    """Under autocast every frozen linear weight would be cast to bf16 at each call anyway."""
    model = delta.apply_delta(load_model(str(tiny_model_dir), 2, seed=0), UNIPELT_TINY, seed=0).eval()
    ids = torch.randint(5, 1000, (4, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[2:, 8:] = 0

    def logits():
        with torch.inference_mode(), devices.autocast(CPU, torch.bfloat16):
            return model(input_ids=ids, attention_mask=mask).logits.float()

    before = logits()
    trainable = {n: p.dtype for n, p in model.named_parameters() if p.requires_grad}
    assert cast_frozen_weights(model, torch.bfloat16) > 0
    assert torch.equal(logits(), before)
    assert {n: p.dtype for n, p in model.named_parameters() if p.requires_grad} == trainable  # all fp32
    frozen = [p for m in model.modules() if type(m) is torch.nn.Linear for p in m.parameters() if not p.requires_grad]
    assert frozen and all(p.dtype == torch.bfloat16 for p in frozen)
    assert cast_frozen_weights(model, None) == 0  # fp32: nothing to cast


def test_bf16_logits_follow_fp32_logits(tiny_model_dir):
    model = delta.apply_delta(load_model(str(tiny_model_dir), 2, seed=0), UNIPELT_TINY, seed=0).eval()
    ids = torch.randint(5, 1000, (4, 12), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        fp32 = model(input_ids=ids).logits
        cast_frozen_weights(model, torch.bfloat16)
        with devices.autocast(CPU, torch.bfloat16):
            bf16 = model(input_ids=ids).logits.float()
    assert bf16.dtype == torch.float32
    assert torch.allclose(bf16, fp32, atol=0.05)


def test_precision_shows_in_the_result_and_its_summary(make_settings):
    result = run_trial(make_settings(epochs=1, precision="fp32"))
    assert result["precision"] == "fp32" and result["settings"]["precision"] == "fp32"
    assert "precision fp32" in summary(result)


def test_gate_values_come_from_the_kept_evaluation_without_another_pass(monkeypatch, make_settings):
    """A gated trial's gate values are those of the dev evaluation whose state it kept: recording them there
    gives what a separate pass over dev after restoring that state gives, without that pass."""
    from autopelt.train import classify

    calls = []
    real = classify.evaluate

    def counted(model, features, *args, **kwargs):
        metrics, gates = real(model, features, *args, **kwargs)
        calls.append((features, kwargs.get("gates", False), gates))
        return metrics, gates

    monkeypatch.setattr(classify, "evaluate", counted)
    monkeypatch.setattr("autopelt.train.trial.evaluate", counted)
    result = run_trial(make_settings(spec=UNIPELT_TINY, epochs=3, precision="fp32"))
    assert result["status"] == "ok", result["reason"]
    dev_passes = [c for c in calls if c[1]]
    assert len(dev_passes) == 3 and len(calls) == 4  # three dev evaluations (with gates) and the test set
    kept = dev_passes[result["best_epoch"] - 1][2]
    assert result["gates"] == kept and set(kept) == {"adapter", "prefix", "lora"}

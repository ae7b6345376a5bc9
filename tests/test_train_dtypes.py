"""Precision that holds: a checkpoint stored in fp32, bf16 or fp16 trains at fp32, bf16 and fp16, classification
and generation alike; the frozen linear weights are read straight into the dtype the trial computes in, while
what trains (the delta, the head, BitFit's biases) stays fp32 with fp32 optimiser state; fp16 trains under a loss
scale for both kinds of task; every trial records its peak memory."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from generationdata import make_tiny_lm_folder, write_e2e_like
from tinymodels import make_settings, make_tiny_model_folder, sst2_dir, tiny_model_dir, trial_cache  # noqa: F401

from autopelt import delta
from autopelt.dtypes import settle_dtypes
from autopelt.models import load_language_model, load_model
from autopelt.train import run_trial
from autopelt.train.settings import TrialSettings

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
PRECISIONS = ("fp32", "bf16", "fp16")
LORA_BITFIT = {"methods": [{"method": "lora", "rank": 4}, {"method": "bitfit"}]}
LORA = {"methods": [{"method": "lora", "rank": 4}]}


def _resaved(folder: Path, out: Path, dtype: torch.dtype, lm: bool) -> Path:
    """`folder`'s checkpoint stored again in `dtype`, beside its tokenizer."""
    from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

    model = (AutoModelForCausalLM if lm else AutoModel).from_pretrained(folder, dtype=torch.float32)
    model.to(dtype).save_pretrained(out)
    AutoTokenizer.from_pretrained(folder).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def bert_checkpoints(tmp_path_factory, minilm_path) -> dict[str, Path]:
    base = make_tiny_model_folder(tmp_path_factory.mktemp("bert-fp32"), minilm_path)
    return {name: _resaved(base, tmp_path_factory.mktemp(f"bert-{name}"), dtype, lm=False)
            for name, dtype in DTYPES.items()}


@pytest.fixture(scope="module")
def llama_checkpoints(tmp_path_factory) -> dict[str, Path]:
    base = make_tiny_lm_folder(tmp_path_factory.mktemp("llama-fp32"))
    return {name: _resaved(base, tmp_path_factory.mktemp(f"llama-{name}"), dtype, lm=True)
            for name, dtype in DTYPES.items()}


@pytest.fixture(scope="module")
def tied_llama(tmp_path_factory) -> Path:
    from decodermodels import tiny_decoder

    folder = tmp_path_factory.mktemp("llama-tied")
    tiny_decoder("llama", lm=True).save_pretrained(folder)  # its config ties the LM head to the embedding
    return folder


@pytest.fixture(scope="module")
def gen_dir(tmp_path_factory) -> Path:
    return write_e2e_like(tmp_path_factory.mktemp("gen"))


@pytest.fixture
def optimisers(monkeypatch):
    """Every AdamW a trial builds, with its parameters' values when it was built."""
    built = []
    real = torch.optim.AdamW

    def spy(params, *args, **kwargs):
        params = list(params)
        optimiser = real(params, *args, **kwargs)
        flat = [p for group in optimiser.param_groups for p in group["params"]]
        built.append((optimiser, [p.detach().clone() for p in flat]))
        return optimiser

    monkeypatch.setattr(torch.optim, "AdamW", spy)
    return built


def _assert_trained_in_fp32(result: dict, optimisers: list) -> None:
    assert result["status"] == "ok", result["reason"]
    assert all(math.isfinite(entry["dev_loss"]) for entry in result["history"])
    (optimiser, initial), = optimisers
    params = [p for group in optimiser.param_groups for p in group["params"]]
    assert params and all(p.dtype == torch.float32 for p in params)  # master weights
    states = [optimiser.state[p] for p in params if p in optimiser.state]
    assert states and all(s["exp_avg"].dtype == s["exp_avg_sq"].dtype == torch.float32 for s in states)
    assert any(not torch.equal(p.detach(), before) for p, before in zip(params, initial)), "the delta did not train"


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("stored", DTYPES)
def test_a_classification_trial_trains_at_any_precision_from_a_checkpoint_in_any_dtype(
        stored, precision, bert_checkpoints, make_settings, optimisers):
    settings = make_settings(model=str(bert_checkpoints[stored]), spec=LORA_BITFIT, precision=precision,
                             max_steps=3, epochs=1)
    result = run_trial(settings)
    _assert_trained_in_fp32(result, optimisers)
    assert result["precision"] == precision and math.isfinite(result["dev_metric"])


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("stored", DTYPES)
def test_a_generation_trial_trains_at_any_precision_from_a_checkpoint_in_any_dtype(
        stored, precision, llama_checkpoints, gen_dir, trial_cache, optimisers):
    settings = TrialSettings(task="e2e", spec=LORA, model=str(llama_checkpoints[stored]), data_dir=str(gen_dir),
                             custom_task={"input_column": "mr", "target_column": "ref"}, epochs=1, max_steps=3,
                             batch_size=8, learning_rate=1e-2, precision=precision, max_new_tokens=2, threads=1,
                             cache_dir=str(trial_cache))
    result = run_trial(settings)
    _assert_trained_in_fp32(result, optimisers)
    assert result["precision"] == precision and set(result["test"]) == {"bleu", "rouge_l"}


@pytest.mark.parametrize("stored", DTYPES)
def test_frozen_linears_are_read_straight_into_the_compute_dtype_and_the_rest_in_fp32(stored, bert_checkpoints,
                                                                                     llama_checkpoints, tied_llama,
                                                                                     monkeypatch):
    """No fp32 copy first: from_pretrained is asked for bf16 itself; the fresh head, norms and embeddings (which
    autocast reads in fp32) are fp32, the tied LM head and its embedding stay with the linears."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    asked = []
    for auto in (AutoModelForSequenceClassification, AutoModelForCausalLM):
        real = auto.from_pretrained.__func__
        monkeypatch.setattr(auto, "from_pretrained", classmethod(
            lambda cls, *args, real=real, **kwargs: asked.append(kwargs.get("dtype")) or real(cls, *args, **kwargs)))
    classifier = load_model(str(bert_checkpoints[stored]), 2, seed=0, dtype=torch.bfloat16)
    language = load_language_model(str(llama_checkpoints[stored]), dtype=torch.bfloat16)
    assert asked == [torch.bfloat16, torch.bfloat16]
    for model, head in ((classifier, classifier.classifier), (language, None)):
        head_params = {id(p) for p in head.parameters()} if head is not None else set()
        linears = {id(p) for m in model.modules() if type(m) is torch.nn.Linear for p in m.parameters()}
        for name, param in model.named_parameters():
            low = id(param) in linears and id(param) not in head_params
            assert param.dtype == (torch.bfloat16 if low else torch.float32), name
    assert language.get_input_embeddings().weight.dtype == torch.float32  # untied: an embedding as any other
    tied = load_language_model(str(tied_llama), dtype=torch.bfloat16)
    assert tied.get_output_embeddings().weight is tied.get_input_embeddings().weight  # still tied, with the linear
    assert tied.get_input_embeddings().weight.dtype == torch.bfloat16
    # the head is drawn in fp32 from the trial's seed: the same head whatever the trial computes in
    assert torch.equal(classifier.classifier.weight, load_model(str(bert_checkpoints[stored]), 2, seed=0)
                       .classifier.weight)


def test_after_the_delta_what_trains_is_fp32_and_the_frozen_linears_are_in_the_compute_dtype(tiny_model_dir):
    model = delta.apply_delta(load_model(str(tiny_model_dir), 2, seed=0, dtype=torch.bfloat16), LORA_BITFIT, seed=0)
    biases = [m.bias for m in model.modules() if type(m) is torch.nn.Linear and m.bias is not None]
    assert any(b.requires_grad and b.dtype == torch.bfloat16 for b in biases)  # BitFit's, as loaded
    settle_dtypes(model, torch.bfloat16)
    assert all(p.dtype == torch.float32 for p in model.parameters() if p.requires_grad)
    frozen = [p for m in model.modules() if type(m) is torch.nn.Linear for p in m.parameters() if not p.requires_grad]
    assert frozen and all(p.dtype == torch.bfloat16 for p in frozen)
    assert settle_dtypes(model, torch.bfloat16) == 0  # settled: nothing more to change
    settle_dtypes(model, None)  # fp32: everything
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_fp16_trains_under_a_loss_scale_in_a_generation_trial_too(llama_checkpoints, gen_dir, trial_cache,
                                                                   monkeypatch):
    scaled = []
    real = torch.amp.GradScaler.scale
    monkeypatch.setattr(torch.amp.GradScaler, "scale", lambda self, loss: scaled.append(self.is_enabled()) or
                        real(self, loss))
    for precision, expected in (("fp16", True), ("bf16", False)):
        settings = TrialSettings(task="e2e", spec=LORA, model=str(llama_checkpoints["fp32"]), data_dir=str(gen_dir),
                                 custom_task={"input_column": "mr", "target_column": "ref"}, epochs=1, max_steps=2,
                                 batch_size=8, learning_rate=1e-2, precision=precision, max_new_tokens=2,
                                 threads=1, cache_dir=str(trial_cache), score_test=False)
        result = run_trial(settings)
        assert result["status"] == "ok", result["reason"]
        assert scaled == [expected] * 2  # each step's loss through the scaler, enabled at fp16 only
        scaled.clear()


def test_the_generation_scaler_skips_a_step_whose_gradients_overflow(llama_checkpoints, gen_dir):
    from autopelt.models import load_tokenizer
    from autopelt.train.generate import Generation, encode, generation_task
    from autopelt.train.loop import Training

    settings = TrialSettings(task="e2e", spec=LORA, custom_task={"input_column": "mr", "target_column": "ref"},
                             epochs=1, max_steps=1, batch_size=4, precision="fp16", learning_rate=1e-2)
    folder = str(llama_checkpoints["fp32"])
    tokenizer = load_tokenizer(folder)
    model = delta.apply_delta(load_language_model(folder, dtype=torch.float16), LORA, seed=0)
    settle_dtypes(model, torch.float16)
    rows = [{"mr": f"name[{n}]", "ref": f"{n} is a place ."} for n in ("Aromi", "Cotto", "Zizzi", "Strada")]
    examples = [encode(tokenizer, generation_task(settings), r, 32, False) for r in rows]
    cpu = torch.device("cpu")
    run = Training(Generation(model, examples, examples, tokenizer.pad_token_id, cpu, torch.float16), settings)
    assert run.scaler.is_enabled()
    before = [p.detach().clone() for p in run.params]
    scale = run.scaler.get_scale()
    hooks = [p.register_hook(lambda g: g * float("inf")) for p in run.params]  # an overflow in fp16
    run.run()
    for hook in hooks:
        hook.remove()
    assert all(torch.equal(p, b) for p, b in zip(run.params, before))  # the step was skipped
    assert run.scaler.get_scale() < scale  # and the scale backed off


@pytest.mark.parametrize("kind", ["classification", "generation"])
def test_every_trial_records_its_peak_host_memory(kind, make_settings, llama_checkpoints, gen_dir, trial_cache,
                                                   tmp_path):
    if kind == "classification":
        settings = make_settings(max_steps=2, epochs=1, out_dir=str(tmp_path))
    else:
        settings = TrialSettings(task="e2e", spec=LORA, model=str(llama_checkpoints["fp32"]), data_dir=str(gen_dir),
                                 custom_task={"input_column": "mr", "target_column": "ref"}, epochs=1, max_steps=2,
                                 batch_size=8, learning_rate=1e-2, max_new_tokens=2, threads=1,
                                 cache_dir=str(trial_cache), out_dir=str(tmp_path))
    run_trial(settings)
    written = json.loads((tmp_path / "result.json").read_text())
    assert written["status"] == "ok", written["reason"]
    assert written["peak_host_memory_mb"] > 50 and written["peak_host_memory_by"] in ("ru_maxrss", "sampled")
    assert written["peak_device_memory_mb"] is None  # no CUDA here
    assert written["peak_memory_mb"] == written["peak_host_memory_mb"]


_HOST_PEAK_PROBE = """
import json, time, torch
from autopelt.train import device as devices
cpu = torch.device("cpu")
high = max(devices.max_resident_bytes(), devices.resident_bytes())
with devices.PeakMemory(cpu, every=10.0) as raised:  # no sample in time: only ru_maxrss can see the spike
    big = torch.ones((high - devices.resident_bytes() + 2**28) // 4)  # 256 MiB above the maximum, touched
    del big
with devices.PeakMemory(cpu, every=0.01) as quiet:
    time.sleep(0.05)
print(json.dumps({"high": high, "raised": [raised.host_by, raised.host_mb], "quiet": [quiet.host_by, quiet.host_mb]}))
"""


def test_the_host_peak_is_the_process_maximum_where_the_trial_raised_it():
    """ru_maxrss is exact where the trial set the process's maximum; otherwise the sampled resident memory.
    In a fresh process: the suite's own earlier peaks must not decide what this one can raise."""
    import subprocess
    import sys

    probe = subprocess.run([sys.executable, "-c", _HOST_PEAK_PROBE], capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr
    seen = json.loads(probe.stdout.strip().splitlines()[-1])
    (raised_by, raised_mb), (quiet_by, quiet_mb) = seen["raised"], seen["quiet"]
    assert raised_by == "ru_maxrss" and raised_mb * 2**20 >= seen["high"]
    assert quiet_by == "sampled" and quiet_mb < raised_mb

"""A decoder as a sequence classifier through `autopelt train` and `predict`: the head reads the last real token, as
LlamaForSequenceClassification, or on T5 the decoder's state at the last <eos>; a method the family cannot take is
one line and exit 2."""

from __future__ import annotations

import json
import math

import pytest
from tinymodels import sst2_dir, tiny_model_dir  # noqa: F401  (fixtures)

from autopelt import cli


@pytest.fixture(scope="module")
def tiny_llama_dir(tmp_path_factory, minilm_path):
    """A random tiny Llama language model (as a pretrained decoder is saved) with MiniLM's tokenizer."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=256,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tiny_t5_dir(tmp_path_factory, minilm_path):
    """A random tiny T5 (v1.1's gated FFN) with MiniLM's tokenizer, whose [SEP] ends every row as T5's </s> does."""
    import torch
    from transformers import AutoTokenizer, T5Config, T5ForConditionalGeneration

    folder = tmp_path_factory.mktemp("tiny-t5")
    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    config = T5Config(vocab_size=len(tokenizer), d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
                      num_heads=4, dropout_rate=0.0, feed_forward_proj="gated-gelu",
                      pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.sep_token_id,
                      decoder_start_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    T5ForConditionalGeneration(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tiny_gpt2_dir(tmp_path_factory, minilm_path):
    """A random tiny GPT-2 language model with MiniLM's tokenizer."""
    import torch
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    folder = tmp_path_factory.mktemp("tiny-gpt2")
    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    config = GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=4, n_positions=256,
                        pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    GPT2LMHeadModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def train(folder, data_dir, out, *method):
    return cli.main(["train", "--task", "sst2", "--model", str(folder), "--data-dir", str(data_dir), "--out", str(out),
                     "--epochs", "3", "--batch-size", "16", "--lr", "0.01", "--threads", "1", *method])


@pytest.mark.parametrize("family, method", [
    ("llama", ("--method", "lora", "--rank", "4")), ("llama", ("--method", "prompt", "--length", "4")),
    ("llama", ("--preset", "unipelt_apl")), ("t5", ("--method", "lora", "--rank", "4")),
    ("t5", ("--method", "prefix", "--length", "4")), ("t5", ("--preset", "unipelt_apl"))])
def test_a_decoder_classifier_trains_and_predicts(family, method, request, sst2_dir, tmp_path, capsys):
    folder = request.getfixturevalue(f"tiny_{family}_dir")
    code = train(folder, sst2_dir, tmp_path / "out", *method)
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert code == 0, result["reason"]
    if method[1] == "lora":  # a random tiny decoder learns "good"/"bad" through LoRA in 12 steps; a 4-token prompt
        assert result["test"]["accuracy"] > 0.6  # alone does not, so the others only have to run
    assert result["spec"].get("pooling", "cls") == "cls"
    capsys.readouterr()
    assert cli.main(["predict", "--delta", str(tmp_path / "out" / "delta"), "--text", "a good film"]) == 0
    assert json.loads(capsys.readouterr().out.strip())["label"] in (0, 1)


@pytest.mark.parametrize("family", ["t5", "llama", "gpt2", "model"])  # "model": the tiny BERT
def test_the_default_attention_choice_times_every_family_and_trains(family, request, sst2_dir, tmp_path,
                                                                    monkeypatch):
    """`--attention auto` as a CPU user gets it: timed (not taken from the tests' environment), then trained."""
    monkeypatch.delenv("AUTOPELT_ATTENTION", raising=False)
    monkeypatch.setenv("AUTOPELT_CACHE_DIR", str(tmp_path / "cache"))  # no attention.json from another test
    folder = request.getfixturevalue(f"tiny_{family}_dir")
    code = cli.main(["train", "--task", "sst2", "--model", str(folder), "--data-dir", str(sst2_dir),
                     "--out", str(tmp_path / "out"), "--method", "lora", "--epochs", "1", "--threads", "1"])
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert code == 0, result["reason"]
    assert result["attention_choice"]["by"] == "measured"
    assert result["attention"] in ("sdpa", "eager")
    assert all(math.isfinite(s) and s > 0 for s in result["attention_choice"]["seconds"].values())
    scores = [result["test"]["accuracy"], result["dev"]["accuracy"], result["history"][-1]["dev_loss"]]
    assert all(math.isfinite(score) for score in scores)


def test_bitfit_on_llama_is_refused_in_one_line_before_the_trial(tiny_llama_dir, sst2_dir, tmp_path, capsys):
    assert train(tiny_llama_dir, sst2_dir, tmp_path / "out", "--method", "bitfit") == 2
    assert "autopelt: error: bitfit cannot apply to llama: it has no bias terms" in capsys.readouterr().err
    assert not (tmp_path / "out" / "result.json").exists()


def test_a_gpu_share_measures_a_t5_classifier_whose_eos_is_among_the_random_ids(tiny_t5_dir):
    """The measured batch ends every row with one </s> (here MiniLM's [SEP], 102, inside the ids drawn)."""
    from autopelt.search import gpu_share

    assert gpu_share.measure_trial_bytes(str(tiny_t5_dir), 2, False, 8, 32, "fp32", device="cpu") > 2**20


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llama", "t5"])
def test_a_decoder_search_runs_the_shipped_portfolio_calibrated_and_no_trial_fails(family, request, sst2_dir,
                                                                                   tmp_path, monkeypatch, capsys):
    """A search with the shipped portfolio on another family than its own, rates calibrated: LoRA's sweep first,
    then the portfolio's first member reading the one token the family's classifier reads, at its calibrated rate."""
    import optuna
    from support import serial_cli

    from autopelt.portfolio.portfolio import SHIPPED, load
    from autopelt.study.record import read_all

    serial_cli.serial(monkeypatch)
    monkeypatch.chdir(tmp_path)
    folder = request.getfixturevalue(f"tiny_{family}_dir")
    storage = f"sqlite:///{tmp_path}/s.db"
    code = cli.main(["search", "--task", "sst2", "--model", str(folder), "--data-dir", str(sst2_dir), "--budget",
                     "3", "--epochs", "1", "--finalists", "0", "--rates", "calibrated", "--storage", storage, "--study-name", "d",
                     "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert code == 0 and "rates: calibrated" in out and "portfolio on this model: its members read the last" in out
    assert "configuration(s) queued once the lora baseline's rate is known" in out
    records = read_all(optuna.load_study(study_name="d", storage=storage))
    assert not [r.fail_reason for r in records if r.state.name == "FAIL"]
    lora = next(r for r in records if r.baseline == "lora")
    member = next(r for r in records if r.portfolio)
    assert member.spec.get("pooling", "cls") == "cls" and member.lr_from["how"] == "calibrated"
    first = next(m for m in load(SHIPPED).members if m.name == member.portfolio["name"])
    assert math.isclose(member.learning_rate, first.learning_rate * lora.learning_rate / member.lr_from["reference"])


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_decoder_regression_starts_at_the_labels_mean_and_its_head_bias_is_kept(family, request, tmp_path):
    """Llama's and GPT-2's `score` has no bias: a regression's is added at the labels' mean, saved with the delta,
    given back at load, and peft (whose copy of the head has none) is refused in one line, nothing written."""
    from safetensors.torch import load_file
    from tinymodels import write_glue_like

    from autopelt.export.export import _maybe_peft
    from autopelt.export.predict import load_delta_model

    folder = request.getfixturevalue(f"tiny_{family}_dir")
    data = write_glue_like(tmp_path / "data", "stsb")  # scores 0, 5/3, 10/3, 5 in equal numbers: mean 2.5
    out = tmp_path / "out"
    code = cli.main(["train", "--task", "stsb", "--model", str(folder), "--data-dir", str(data), "--out", str(out),
                     "--epochs", "1", "--batch-size", "16", "--lr", "1e-9", "--threads", "1", "--method", "lora",
                     "--rank", "4"])
    result = json.loads((out / "result.json").read_text())
    assert code == 0, result["reason"]
    assert result["head_centered"] is True
    bias = float(load_file(str(out / "delta" / "delta.safetensors"))["score.bias"][0])
    assert bias == pytest.approx(2.5, abs=0.4)  # the train split's mean, unmoved at this rate
    model, _ = load_delta_model(out / "delta", str(folder))
    assert float(model.score.bias.detach()[0]) == bias
    reason = _maybe_peft(out / "delta", {"model": str(folder)})
    assert "score.bias" in reason and "\n" not in reason and not (out / "delta" / "peft").exists()

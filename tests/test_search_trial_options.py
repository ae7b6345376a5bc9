"""What a search gives every trial (--batch-size, --max-length, --quantize): checked up front in one line, carried into
each trial's settings, recorded by the study so that a resumed run keeps them; and QLoRA's refusals (`--quantize
4bit` where it cannot run: an encoder, a method outside LoRA, no CUDA, no bitsandbytes), said before any trial, in
`train` and in `search`. The CUDA path itself runs in bench/gpu_check.py on a GPU."""

from __future__ import annotations

import optuna
import pytest
from conftest import GLUE_DIR
from support import fakes
from test_search_preflight import refused
from test_train_decoders import tiny_llama_dir  # noqa: F401  (fixture)
from tinymodels import sst2_dir, tiny_model_dir  # noqa: F401  (fixtures)

from autopelt import cli, quantize
from autopelt.errors import UserError
from autopelt.export.export import _metrics, model_card
from autopelt.search.hardware import Gpu, Hardware
from autopelt.search.options import SearchOptions
from autopelt.search.plan import prepare
from autopelt.search.resume import check_existing, open_study
from autopelt.train import TrialSettings

optuna.logging.set_verbosity(optuna.logging.WARNING)
CPU_ONLY = Hardware(2)


def asked(tmp_path, **given) -> SearchOptions:
    base = {"task": "rte", "storage": f"sqlite:///{tmp_path}/study.db", "out": str(tmp_path / "out"),
            "space": str(fakes.SPACE), "data_dir": str(GLUE_DIR), "baselines": False, "portfolio": "none",
            "cpus_per_trial": 1}
    return SearchOptions(**{**base, **given})


def test_every_trial_gets_the_batch_size_and_length_asked_for_over_what_it_drew(tmp_path):
    plan = prepare(asked(tmp_path, batch_size=8, max_length=64), CPU_ONLY)
    settings = plan.trial_settings({"methods": []}, {"batch_size": 32, "weight_decay": 0.1}, tmp_path)
    assert (settings.batch_size, settings.max_length, settings.weight_decay) == (8, 64, 0.1)
    drawn = prepare(asked(tmp_path), CPU_ONLY).trial_settings({"methods": []}, {"batch_size": 32}, tmp_path)
    assert (drawn.batch_size, drawn.max_length) == (32, TrialSettings.max_length)


@pytest.mark.parametrize("flags, line", [
    (["--batch-size", "0"], "--batch-size must be a whole number, at least 1, not 0"),
    (["--max-length", "-3"], "--max-length must be a whole number, at least 1, not -3"),
    (["--max-length", "4096"], "--max-length 4096 is more than the model's 512 positions; give --max-length 512 or "
                               "less"),
    (["--workers", "0"], "--workers must be at least 1, not 0"),
])
def test_a_bad_trial_option_is_one_line_before_any_study(flags, line, tmp_path, monkeypatch, capsys, sst2_dir,
                                                         tiny_model_dir):
    err = refused(["--task", "sst2", "--model", str(tiny_model_dir), "--data-dir", str(sst2_dir), *flags],
                  tmp_path, monkeypatch, capsys)
    assert err == f"autopelt: error: {line}"


def test_a_resumed_study_keeps_its_trial_options_and_refuses_others(tmp_path):
    first = prepare(asked(tmp_path, batch_size=8, max_length=64), CPU_ONLY)
    open_study(first)
    again, records = check_existing(prepare(asked(tmp_path), CPU_ONLY))  # the same command without the flags
    assert (again.options.batch_size, again.options.max_length, records) == (8, 64, [])
    assert again.trial_settings({"methods": []}, {}, tmp_path).batch_size == 8
    with pytest.raises(UserError, match=r"was made for --batch-size 8 \(now 16\); pick another --study-name"):
        check_existing(prepare(asked(tmp_path, batch_size=16), CPU_ONLY))
    with pytest.raises(UserError, match=r"--batch-size as each trial draws it \(now 16\)"):
        other = prepare(asked(tmp_path, study_name="drawn"), CPU_ONLY)
        open_study(other)
        check_existing(prepare(asked(tmp_path, study_name="drawn", batch_size=16), CPU_ONLY))


def test_quantize_refuses_an_encoder_a_method_outside_lora_and_a_machine_without_cuda(tiny_llama_dir,
                                                                                      tiny_model_dir):
    from autopelt.models import load_config

    lora = {"methods": [{"method": "lora", "rank": 8}]}
    encoder, decoder = load_config(str(tiny_model_dir), 2), load_config(str(tiny_llama_dir), 2)
    assert quantize.refusal(encoder, lora, cuda=True).startswith("--quantize 4bit is for decoders (QLoRA), and this "
                                                                 "bert model is not one")
    assert quantize.refusal(decoder, {"methods": [{"method": "lora"}, {"method": "adapter"}]}, cuda=True) == (
        "--quantize 4bit trains LoRA alone over the 4-bit base, not adapter; use --method lora (or --space lora in "
        "a search)")
    assert "cannot train DoRA" in quantize.refusal(decoder, {"methods": [{"method": "lora", "dora": True}]}, True)
    assert quantize.refusal(decoder, lora, cuda=False) == ("--quantize 4bit needs a CUDA GPU (bitsandbytes' NF4 "
                                                           "kernels), and this machine has none")
    with pytest.raises(UserError, match="quantize must be 4bit or none, not '8bit'"):
        TrialSettings(task="sst2", spec=lora, quantize="8bit")


def test_train_with_quantize_says_why_not_before_loading(tiny_llama_dir, tiny_model_dir, sst2_dir, capsys):
    common = ["train", "--task", "sst2", "--data-dir", str(sst2_dir), "--quantize", "4bit", "--device", "cpu"]
    assert cli.main([*common, "--model", str(tiny_llama_dir), "--method", "adapter"]) == 2
    assert "trains LoRA alone over the 4-bit base, not adapter" in capsys.readouterr().err
    assert cli.main([*common, "--model", str(tiny_llama_dir), "--method", "lora"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["autopelt: error: --quantize 4bit needs a CUDA GPU (bitsandbytes' NF4 kernels), and this machine "
                   "has none"]


def test_search_with_quantize_says_why_not_before_any_study(tiny_llama_dir, tiny_model_dir, sst2_dir, tmp_path,
                                                           monkeypatch, capsys):
    common = ["--task", "sst2", "--data-dir", str(sst2_dir), "--quantize", "4bit"]

    def line(*flags) -> str:
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        folder.mkdir()
        return refused([*common, *flags], folder, monkeypatch, capsys)

    assert "is for decoders (QLoRA), and this bert model is not one" in line("--model", str(tiny_model_dir))
    assert line("--model", str(tiny_llama_dir)).endswith(
        "--quantize 4bit trains LoRA alone, and space default also draws adamix, adapter, ia3, prefix, vera; give "
        "--space lora")  # Llama takes no BitFit: the space for the model draws none
    assert line("--model", str(tiny_llama_dir), "--space", "lora").endswith(
        "needs a CUDA GPU (bitsandbytes' NF4 kernels), and this machine has none")


def test_a_quantized_search_trains_lora_alone_on_its_4bit_base(tiny_llama_dir, sst2_dir, tmp_path, monkeypatch):
    """On a machine described with a GPU and bitsandbytes: no portfolio, the LoRA baseline alone, every trial
    quantized (the study records it)."""
    monkeypatch.setattr(quantize, "machine_refusal", lambda cuda: None)  # the machine's half runs on a GPU
    from autopelt.search import gpu_share

    monkeypatch.setattr(gpu_share, "measure_trial_bytes", lambda *a, **k: 2**30)
    plan = prepare(SearchOptions(task="sst2", model=str(tiny_llama_dir), data_dir=str(sst2_dir), space="lora",
                                 quantize="4bit", storage=f"sqlite:///{tmp_path}/s.db", out=str(tmp_path / "out")),
                   Hardware(4, (Gpu("NVIDIA H200", 140 * 2**30, 139 * 2**30),)))
    assert plan.portfolio is None and plan.baselines == ["lora"]
    assert plan.trial_settings({"methods": [{"method": "lora"}]}, {}, tmp_path).quantize == "4bit"


def test_an_export_says_its_delta_trained_on_a_4bit_base():
    result = {"settings": {"quantize": "4bit"}, "summary": "lora r8", "task": "sst2", "model": "m", "params": {}}
    metrics = _metrics(result)
    assert metrics["quantized_base"] == "4-bit NF4, double quantisation, bf16 compute (QLoRA)"
    assert "- **trained on a 4-bit quantised base** (4-bit NF4" in model_card(result, metrics, None)
    plain = {**result, "settings": {}}
    assert "quantized_base" not in _metrics(plain) and "4-bit" not in model_card(plain, _metrics(plain), None)


def test_the_study_records_the_batch_size_a_trial_trains_with_not_the_one_it_drew(tmp_path):
    from autopelt.search.controller import Controller
    from autopelt.study.record import read

    fakes.script(tmp_path / "out")
    plan = prepare(asked(tmp_path, batch_size=8, max_length=64), CPU_ONLY)
    study = open_study(plan)
    control = Controller(study, plan)
    control.start()
    ticket = control.next_trial()
    hparams = read(study.get_trials(deepcopy=False)[ticket.number]).hparams
    assert ticket.settings.batch_size == hparams["batch_size"] == 8 and hparams["max_length"] == 64


def test_a_given_batch_size_and_length_are_not_drawn(tmp_path):
    """--batch-size pins the space's `batch_size: {choice: [16, 32]}`: the sampler spends no trials on it."""
    pinned = prepare(asked(tmp_path, space="default", batch_size=8), CPU_ONLY).space
    drawn = prepare(asked(tmp_path, space="default"), CPU_ONLY).space
    assert "batch_size" in drawn.param_names and "batch_size" not in pinned.param_names
    trial = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)).ask()
    _, hparams = pinned.sample(trial, 6)
    assert hparams["batch_size"] == 8 and "batch_size" not in trial.params
    assert pinned.fingerprint == drawn.fingerprint  # the file's: a resumed study is the same space

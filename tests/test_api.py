"""The Python API (autopelt/api.py): apply/save/load round trips, Trainer, train_delta, bad input, lazy import."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from tinymodels import make_settings, sst2_dir, tiny_model_dir, trial_cache  # noqa: F401  (fixtures)

import autopelt
from autopelt.errors import UserError

MIXED = {"methods": [{"method": "lora", "rank": 2}, {"method": "prefix", "length": 2, "gate": True},
                     {"method": "compacter", "bottleneck": 4, "n": 2}, {"method": "prompt", "length": 2}]}


def base(model_dir, num_labels: int = 2):
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification.from_pretrained(str(model_dir), num_labels=num_labels)


@pytest.fixture
def batch(tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    return tokenizer(["a good story", "it was bad and long"], padding=True, return_tensors="pt")


def test_import_autopelt_loads_neither_torch_nor_transformers():
    code = ("import sys, autopelt; api = (autopelt.apply, autopelt.load, autopelt.save, autopelt.train_delta, "
            "autopelt.search_delta, autopelt.export_delta); "
            "print(sorted(m for m in ('torch', 'transformers', 'optuna', 'ray', 'datasets') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_api_names_are_exported():
    assert set(autopelt.__all__) >= {"apply", "load", "save", "train_delta", "search_delta", "export_delta"}
    assert "load" in dir(autopelt)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        autopelt.nope  # noqa: B018


def test_trainer_changes_only_the_delta_and_the_reload_gives_the_same_logits(tiny_model_dir, batch, tmp_path):
    from transformers import AutoTokenizer, DataCollatorWithPadding, Trainer, TrainingArguments

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    model = autopelt.apply(base(tiny_model_dir), MIXED, seed=3)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    texts = ["good film", "bad film", "a good night", "the bad plot", "good good", "so bad"] * 2
    train = [{**tokenizer(t), "labels": int("good" in t)} for t in texts]
    args = TrainingArguments(str(tmp_path / "runs"), max_steps=4, per_device_train_batch_size=4, learning_rate=1e-2,
                             save_strategy="no", report_to="none", logging_strategy="no", disable_tqdm=True,
                             use_cpu=True, dataloader_pin_memory=False)
    Trainer(model=model, args=args, train_dataset=train, data_collator=DataCollatorWithPadding(tokenizer)).train()

    changed = {name for name, p in model.named_parameters() if not torch.equal(p, before[name])}
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert changed <= trainable  # nothing frozen moved: the base is bit for bit what it was
    # the delta trained (a zero-initialised adapter behind a ReLU can sit still for a few steps)
    assert len(trainable) > 10 and len(changed) >= 0.75 * len(trainable)
    assert len(before) - len(trainable) > 30  # the frozen base weights that must not (and did not) move

    autopelt.save(model, tmp_path / "delta")
    reloaded = autopelt.load(str(tiny_model_dir), tmp_path / "delta")
    with torch.no_grad():
        assert torch.equal(model.eval()(**batch).logits, reloaded(**batch).logits)
    trainable_again = autopelt.load(base(tiny_model_dir), tmp_path / "delta", is_trainable=True)
    from safetensors.torch import load_file

    saved = set(load_file(str(tmp_path / "delta" / "delta.safetensors")))  # the inference form: prefix without MLP
    assert {n for n, p in trainable_again.named_parameters() if p.requires_grad} == saved
    assert not any(p.requires_grad for p in reloaded.parameters()) and not reloaded.training


def test_apply_is_the_delta_library_and_a_preset_name_works(tiny_model_dir, batch):
    from autopelt import delta
    from autopelt.delta.presets import PRESETS

    ours = autopelt.apply(base(tiny_model_dir), "lora", seed=1)
    library = delta.apply_delta(base(tiny_model_dir), PRESETS["lora"], seed=1)
    library.classifier.load_state_dict(ours.classifier.state_dict())  # the head is from_pretrained's draw
    with torch.no_grad():
        assert torch.equal(ours.eval()(**batch).logits, library.eval()(**batch).logits)
    assert ours.autopelt_delta["spec"] == delta.parse_spec(PRESETS["lora"]).to_dict()


def test_save_keeps_the_task_so_predict_needs_nothing_else(tiny_model_dir, tmp_path, capsys):
    from autopelt.cli import main

    model = autopelt.apply(base(tiny_model_dir, num_labels=3), "bitfit")
    autopelt.save(model, tmp_path / "d", text_columns=["review"], label_names=["bad", "ok", "good"])
    header = json.loads((tmp_path / "d" / "delta.json").read_text())
    assert header["base_model"] == str(tiny_model_dir) and header["num_labels"] == 3
    (tmp_path / "rows.jsonl").write_text(json.dumps({"review": "a good one"}) + "\n")
    capsys.readouterr()
    assert main(["predict", "--delta", str(tmp_path / "d"), "--input", str(tmp_path / "rows.jsonl")]) == 0
    assert json.loads(capsys.readouterr().out)["label_name"] in ("bad", "ok", "good")


def test_train_delta_returns_the_result_and_its_delta_loads(make_settings, tiny_model_dir, sst2_dir, tmp_path):
    settings = make_settings()
    result = autopelt.train_delta("sst2", {"methods": [{"method": "lora", "rank": 4}]}, progress=False,
                                  model=settings.model, data_dir=settings.data_dir, cache_dir=settings.cache_dir,
                                  epochs=1, batch_size=16, learning_rate=1e-2, max_length=32, threads=1,
                                  out_dir=str(tmp_path / "run"))
    assert result["status"] == "ok" and result["delta_dir"] == str(tmp_path / "run" / "delta")
    model = autopelt.load(None, result["delta_dir"])
    from autopelt.train import TrialSettings
    from autopelt.train.trial_data import prepare_data
    from autopelt.models import load_tokenizer
    from autopelt.train.classify import evaluate

    trial = TrialSettings(**{**settings.to_dict(), "max_length": 32})
    data = prepare_data(trial, load_tokenizer(str(tiny_model_dir)))
    test, _ = evaluate(model, data.test, data.task, trial, torch.device("cpu"))
    assert test == result["test"]  # the loaded delta scores the test split exactly as the trial did


def test_a_failed_trial_raises_with_its_result(make_settings):
    settings = make_settings()
    with pytest.raises(autopelt.TrialFailed, match="the loss became nan") as raised:
        autopelt.train_delta("sst2", "lora", progress=False, model=settings.model, data_dir=settings.data_dir,
                             cache_dir=settings.cache_dir, learning_rate=1e30, epochs=1, max_length=32, threads=1)
    assert raised.value.result["status"] == "failed"


BAD = {
    "apply twice": (lambda m, d: autopelt.apply(autopelt.apply(m, "lora"), "lora"),
                    "already carries an autopelt delta"),
    "unknown preset or file": (lambda m, d: autopelt.apply(m, "lorra"), "cannot read delta spec lorra"),
    "save without a delta": (lambda m, d: autopelt.save(m, d / "x"), "carries no autopelt delta"),
    "unknown save field": (lambda m, d: autopelt.save(autopelt.apply(m, "lora"), d / "x", labels=[1]),
                           "unknown save metadata 'labels'"),
    "not a delta folder": (lambda m, d: autopelt.load(m, d), "is not an autopelt delta folder"),
    "not a model": (lambda m, d: autopelt.apply(object(), "lora"), "expected a transformers model, not object"),
    "unknown train setting": (lambda m, d: autopelt.train_delta("sst2", "lora", epoch=3),
                              "unknown trial setting 'epoch'"),
    "unknown search option": (lambda m, d: autopelt.search_delta("rte", budgett=3), "unknown search option 'budgett'"),
    "export what": (lambda m, d: autopelt.export_delta(3, d / "x"), "export_delta takes a search outcome"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_a_one_line_user_error_and_writes_nothing(case, tiny_model_dir, tmp_path):
    call, message = BAD[case]
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(UserError) as raised:
        call(base(tiny_model_dir), work)
    assert message in str(raised.value) and "\n" not in str(raised.value)
    assert list(work.iterdir()) == []


def test_a_delta_for_another_head_size_is_refused(tiny_model_dir, tmp_path):
    autopelt.save(autopelt.apply(base(tiny_model_dir, num_labels=3), "lora"), tmp_path / "d")
    with pytest.raises(UserError, match="head of 3 labels and this model one of 2; load the base with num_labels=3"):
        autopelt.load(base(tiny_model_dir), tmp_path / "d")
    with pytest.raises(UserError, match="delta is merged"):
        autopelt.save(autopelt.load(None, tmp_path / "d", merge=True), tmp_path / "e")
    assert not (tmp_path / "e").exists()


def test_a_delta_of_another_format_is_one_line_naming_the_format(tmp_path):
    import json

    from autopelt.delta.io import read_delta_header

    (tmp_path / "delta.json").write_text(json.dumps({"format": "autopelt-delta/1", "spec": {"methods": []}}))
    with pytest.raises(UserError, match=r"is not an autopelt delta \(format 'autopelt-delta/1', expected "
                                        r"autopelt-delta/2\)$"):
        read_delta_header(tmp_path)

"""A GPU used fully, tested with mocks (no GPU here): fp16 trains under a GradScaler, a trial that does not fit
fails with one line that says what to change, and a worker gives back its memory after every trial."""

from __future__ import annotations

import pytest
import torch

import autopelt.train.trial as trial_module
from autopelt.search import ray_backend
from autopelt.train import device as devices
from autopelt.train import run_trial
from autopelt.train.loop import Training
from autopelt.train.trial_data import prepare_data, resolve_task
from autopelt.models import load_model, load_tokenizer, resolve_model
from autopelt import delta
from tinymodels import TINY_LORA, make_settings, sst2_dir, tiny_model_dir, trial_cache  # noqa: F401  (fixtures)


def test_fp16_trains_under_a_loss_scale_and_bf16_without(make_settings, monkeypatch):
    scaled = []
    real = torch.amp.GradScaler.scale
    monkeypatch.setattr(torch.amp.GradScaler, "scale", lambda self, loss: scaled.append(self.is_enabled()) or
                        real(self, loss))
    for precision, expected in (("fp16", True), ("bf16", False)):
        settings = make_settings(precision=precision, max_steps=2, epochs=1)
        result = run_trial(settings)
        assert result["status"] == "ok" and result["precision"] == precision, result["reason"]
        assert scaled and set(scaled) == {expected}  # every step's loss went through an enabled scaler in fp16
        scaled.clear()


def test_fp16_scaler_skips_a_step_whose_gradients_overflow(make_settings):
    settings = make_settings(precision="fp16", max_steps=1, epochs=1)
    task = resolve_task(settings)
    model_name = resolve_model(settings.model)
    data = prepare_data(settings, load_tokenizer(model_name), task)
    model = delta.apply_delta(load_model(model_name, task.num_labels, seed=0), TINY_LORA, seed=0)
    training = Training(model, data, settings, torch.device("cpu"))
    assert training.scaler.is_enabled()
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    scale = training.scaler.get_scale()
    hook = [p.register_hook(lambda g: g * float("inf")) for p in training.params]  # an overflow in fp16
    training.run()
    for h in hook:
        h.remove()
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters() if p.requires_grad)  # step skipped
    assert training.scaler.get_scale() < scale  # and the scale backed off


def test_a_trial_that_does_not_fit_fails_with_one_line_that_says_what_to_change(make_settings, monkeypatch):
    def too_big(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail")

    monkeypatch.setattr(trial_module, "train_at_chosen_rate", too_big)
    result = run_trial(make_settings(device="cpu"))
    assert result["status"] == "failed" and "\n" not in result["reason"]
    assert result["reason"].startswith("out of memory: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert "lower --batch-size" in result["reason"]
    on_gpu = devices.out_of_memory_reason(torch.OutOfMemoryError("CUDA out of memory."), torch.device("cuda"))
    assert on_gpu == ("out of memory: CUDA out of memory. (lower --batch-size, or raise --gpus-per-trial so that "
                      "fewer trials share a GPU)")


def test_memory_goes_back_to_the_gpu_after_every_trial_on_a_worker(monkeypatch):
    emptied = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))

    class Settings:
        spec = TINY_LORA

    def fails(settings, report):
        raise RuntimeError("broken worker")

    assert ray_backend._call(lambda s, r: {"status": "ok"}, Settings(), None) == {"status": "ok"}
    assert ray_backend._call(fails, Settings(), None)["status"] == "failed"
    assert emptied == [True, True]  # after a good trial and after a broken one


def test_a_search_trial_can_leave_the_test_split_unscored(make_settings):
    scored = run_trial(make_settings(max_steps=2, epochs=1))
    unscored = run_trial(make_settings(max_steps=2, epochs=1, score_test=False))
    assert scored["test"] and unscored["test"] is None and unscored["extra_tests"] == {}
    assert unscored["dev"] == scored["dev"]  # the same training and dev evaluation

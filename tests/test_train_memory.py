"""A GPU used fully, tested with mocks (no GPU here): fp16 trains under a GradScaler, a trial that does not fit
fails with one line that says what to change, and a worker gives back its memory after every trial."""

from __future__ import annotations

import pytest
import torch
from generationdata import make_tiny_lm_folder, write_e2e_like

import autopelt.train.generation_trial as generation_trial
import autopelt.train.trial as trial_module
from autopelt.search import ray_backend
from autopelt.train import device as devices
from autopelt.train import run_trial
from autopelt.train.classify import Classification
from autopelt.train.generate import Generation
from autopelt.train.loop import Training
from autopelt.train.settings import TrialSettings
from autopelt.train.trial_data import prepare_data, resolve_task
from autopelt.models import load_language_model, load_model, load_tokenizer, resolve_model
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
    training = Training(Classification(model, data, torch.device("cpu"), torch.float16), settings)
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
    assert on_gpu == ("out of memory: CUDA out of memory. (lower --batch-size or --max-length, or raise --gpus-per-trial "
                      "so that fewer trials share a GPU)")


GPU_REMEDY = " (lower --batch-size or --max-length, or raise --gpus-per-trial so that fewer trials share a GPU)"


@pytest.mark.parametrize("as_torch_says, reason", [
    ("CUDA out of memory. Tried to allocate 1.21 GiB. GPU 0 has a total capacity of 79.18 GiB of which 802.19 MiB is "
     "free. Including non-PyTorch memory, this process has 78.39 GiB memory in use. If reserved but unallocated "
     "memory is large try setting PYTORCH_CUDA_ALLOC_CONF=... (https://...)",
     "CUDA out of memory. Tried to allocate 1.21 GiB. GPU 0 has a total capacity of 79.18 GiB of which 802.19 MiB is "
     "free."),
    ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.18 GiB of which 40.10 GiB is "
     "free. Process 1234 has 7.50 GiB memory in use. Process 1240 has 16.10 GiB memory in use. 16.22 GiB allowed; Of "
     "the allocated memory 14.90 GiB is allocated by PyTorch, and 1.10 GiB is reserved",
     "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.18 GiB of which 40.10 GiB is "
     "free. This trial may use 16.22 GiB."),
    ("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 7.79 GiB of which 3.06 MiB is "
     "free. Of the allocated memory 7.20 GiB is allocated by PyTorch",
     "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 7.79 GiB of which 3.06 MiB is "
     "free."),
], ids=["own-process", "shared-and-limited", "no-process-line"])
def test_the_out_of_memory_line_keeps_what_ran_out_and_drops_the_accounting(as_torch_says, reason):
    error = torch.OutOfMemoryError(as_torch_says)
    assert devices.out_of_memory_reason(error, torch.device("cuda")) == f"out of memory: {reason}{GPU_REMEDY}"


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


GIB = 2**30


@pytest.mark.parametrize("gpu_ids, share, limited", [([0], 0.25, 0.25 * 0.85 - 600 / 80 / 1024),
                                                     ([0], 1.0, None), ([], 0.0, None)])
def test_a_trial_given_part_of_a_gpu_holds_only_its_part_of_the_memory(gpu_ids, share, limited, monkeypatch):
    """Its share of the headroom the trials fill together, less its own CUDA context (on an 80 GiB GPU)."""
    class Context:
        def get_trial_resources(self):
            return type("Resources", (), {"required_resources": {"CPU": torch.get_num_threads(), "GPU": share}})()

    fractions = []
    monkeypatch.setattr(ray_backend.tune, "get_context", Context)
    monkeypatch.setattr(ray_backend.ray, "get_gpu_ids", lambda: gpu_ids)
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda fraction: fractions.append(fraction))
    monkeypatch.setattr(devices, "gpu_memory_bytes", lambda: 80 * GIB)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("MKL_NUM_THREADS", "1")
    placement = ray_backend._placement()
    assert placement["device"] == ("cuda" if gpu_ids else "cpu")
    assert fractions == ([pytest.approx(limited)] if limited else [])


def test_a_small_share_keeps_at_least_half_of_itself():
    from autopelt.search.gpu_share import memory_fraction

    assert memory_fraction(0.01, 8 * GIB) == pytest.approx(0.005)  # 0.85% of 8 GiB is less than a context
    assert memory_fraction(0.5, 80 * GIB) == pytest.approx(0.5 * 0.85 - 600 / 80 / 1024)


def test_an_exiting_worker_waits_for_its_stopped_trial_to_unwind_but_not_for_ever(monkeypatch):
    import threading
    import time

    release = threading.Event()
    unwinding = threading.Thread(target=lambda: release.wait(0.3), daemon=True)  # a trial ending its SystemExit
    stuck = threading.Thread(target=lambda: release.wait(30), daemon=True)
    monkeypatch.setattr(ray_backend, "_RUNNING_TRIALS", {unwinding})
    unwinding.start()
    ray_backend._let_trials_unwind(timeout=10)
    assert not unwinding.is_alive()

    monkeypatch.setattr(ray_backend, "_RUNNING_TRIALS", {stuck})
    stuck.start()
    started = time.monotonic()
    ray_backend._let_trials_unwind(timeout=0.2)
    assert stuck.is_alive() and time.monotonic() - started < 5
    release.set()


def test_a_worker_process_lets_its_trial_thread_unwind_before_python_finalises(tmp_path):
    """The real exit order: a daemon thread still running when the main thread ends runs to its end (its finally
    writes a file) only because the exit waits for it."""
    import subprocess
    import sys

    script = """
import sys, threading, time
from autopelt.search import ray_backend

def trial():
    try:
        time.sleep(1.0)
    finally:
        open(sys.argv[1], "w").write("unwound")

thread = threading.Thread(target=trial, daemon=True)
thread.start()
if sys.argv[2] == "wait":
    ray_backend._RUNNING_TRIALS.add(thread)
    ray_backend._wait_for_trials_at_exit()
"""
    for mode, unwound in (("wait", True), ("no-wait", False)):
        marker = tmp_path / mode
        subprocess.run([sys.executable, "-c", script, str(marker), mode], check=True, timeout=120)
        assert marker.exists() == unwound, mode


def test_a_search_trial_can_leave_the_test_split_unscored(make_settings):
    scored = run_trial(make_settings(max_steps=2, epochs=1))
    unscored = run_trial(make_settings(max_steps=2, epochs=1, score_test=False))
    assert scored["test"] and unscored["test"] is None and unscored["extra_tests"] == {}
    assert unscored["dev"] == scored["dev"]  # the same training and dev evaluation


def test_a_step_in_micro_batches_is_the_step_of_the_whole_batch(make_settings):
    """Gradients accumulated over micro-batches of 3, 3 and 2 rows, each loss weighted by its rows, give the step
    one batch of 8 gives (to float rounding: each micro-batch is padded to its own longest row)."""
    states = []
    for micro in (None, 3):
        settings = make_settings(max_steps=2, epochs=1, batch_size=8, micro_batch_size=micro, learning_rate=1e-2,
                                 precision="fp32")
        task = resolve_task(settings)
        model_name = resolve_model(settings.model)
        data = prepare_data(settings, load_tokenizer(model_name), task)
        model = delta.apply_delta(load_model(model_name, task.num_labels, seed=0), TINY_LORA, seed=0)
        before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
        Training(Classification(model, data, torch.device("cpu")), settings).run()
        states.append({n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad})
    assert any(not torch.equal(states[0][n], before[n]) for n in before)  # it trained
    for name in states[0]:
        torch.testing.assert_close(states[1][name], states[0][name], rtol=1e-4, atol=1e-6)


def test_a_trial_that_runs_out_of_memory_retries_at_half_the_micro_batch(make_settings, monkeypatch):
    """Out of memory at 32 and 16 rows a step: the trial runs again at 8 with the same step, and records it."""
    real = trial_module.train_at_chosen_rate

    def fits_at_eight(objective, settings, *args, **kwargs):
        if (settings.micro_batch_size or settings.batch_size) > 8:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(objective, settings, *args, **kwargs)

    monkeypatch.setattr(trial_module, "train_at_chosen_rate", fits_at_eight)
    result = run_trial(make_settings(device="cpu", batch_size=32, learning_rate=1e-3, epochs=1))
    assert result["status"] == "ok", result["reason"]
    assert result["memory_retries"] == [32, 16] and result["settings"]["micro_batch_size"] == 8
    assert result["settings"]["batch_size"] == 32  # the same step: its rows accumulated

    def never_fits(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(trial_module, "train_at_chosen_rate", never_fits)
    failed = run_trial(make_settings(device="cpu", batch_size=4, learning_rate=1e-3, epochs=1))
    assert failed["status"] == "failed" and failed["memory_retries"] == [4, 2]
    assert failed["reason"].endswith("it did not fit at micro-batches of 4, 2 rows") and "\n" not in failed["reason"]


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory):
    return make_tiny_lm_folder(tmp_path_factory.mktemp("tiny-llama"))


def _lm_rows() -> list[dict]:
    """Four rows of one target token and four of nine: micro-batches that hold different shares of the targets."""
    short = {"input_ids": [5, 6, 7, 8], "labels": [-100, -100, -100, 8]}
    long = {"input_ids": list(range(5, 15)), "labels": [-100, *range(6, 15)]}
    return [short, long] * 4


def test_a_generation_step_in_micro_batches_is_the_step_of_the_whole_batch(lm_dir):
    """The loss of a generation step is the mean over its target tokens: micro-batches of 3, 3 and 2 rows, each
    weighted by its target tokens, give the step one batch of 8 gives (to float rounding)."""
    states = []
    for micro in (None, 3):
        settings = TrialSettings(task="e2e", spec=TINY_LORA, epochs=1, max_steps=2, batch_size=8,
                                 micro_batch_size=micro, learning_rate=1e-2)
        model = delta.apply_delta(load_language_model(str(lm_dir)), TINY_LORA, seed=0)
        before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
        Training(Generation(model, _lm_rows(), _lm_rows(), 0, torch.device("cpu")), settings).run()
        states.append({n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad})
    assert any(not torch.equal(states[0][n], before[n]) for n in before)  # it trained
    for name in states[0]:
        torch.testing.assert_close(states[1][name], states[0][name], rtol=1e-4, atol=1e-6)


def test_a_generation_trial_that_runs_out_of_memory_retries_at_half_the_micro_batch(lm_dir, tmp_path, trial_cache,
                                                                                     monkeypatch):
    """Out of memory at the end of training at 8 and 4 rows a step: the trial runs again at 2, and records only that
    run."""
    real = generation_trial.train_at_chosen_rate

    def fits_at_two(objective, settings, *args, **kwargs):
        trained = real(objective, settings, *args, **kwargs)
        if (settings.micro_batch_size or settings.batch_size) > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return trained

    monkeypatch.setattr(generation_trial, "train_at_chosen_rate", fits_at_two)
    settings = TrialSettings(task="e2e", spec=TINY_LORA, model=str(lm_dir), data_dir=str(write_e2e_like(tmp_path)),
                             custom_task={"input_column": "mr", "target_column": "ref"}, epochs=1, max_steps=2,
                             batch_size=8, learning_rate=1e-2, threads=1, cache_dir=str(trial_cache),
                             score_test=False, device="cpu")
    result = run_trial(settings)
    assert result["status"] == "ok", result["reason"]
    assert result["memory_retries"] == [8, 4] and result["settings"]["micro_batch_size"] == 2
    assert result["steps"] == 2 and len(result["history"]) == 1  # what the runs that did not fit recorded went

"""The training loop through run_trial: early stopping, evaluation cadence, the report hook, best-state
restore, AdaMix routing, and every failure as a result (never an exception)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from tinymodels import make_settings, sst2_dir, tiny_model_dir, trial_cache  # noqa: F401  (fixtures)

import autopelt.train.classify as classify
import autopelt.train.loop as loop
from autopelt import delta
from autopelt.delta.modules.mixture import MixtureLinear
from autopelt.models import load_model
from autopelt.train import run_trial

# the synthetic SST-2 of `sst2_dir`, full protocol: 58 train rows; batch 8 -> 8 steps per epoch
STEPS_PER_EPOCH = 8


def assert_ok(result: dict) -> None:
    assert result["status"] == "ok", result.get("reason")


# ---------------------------------------------------------------------------------------------- early stopping


@pytest.mark.parametrize("patience", [1, 2])
def test_patience_stops_when_dev_cannot_improve(patience, make_settings):
    """lr 1e-12 leaves the model as it was: the first evaluation stays the best, and patience runs out."""
    result = run_trial(make_settings(learning_rate=1e-12, epochs=6, patience=patience))
    assert_ok(result)
    history = result["history"]
    assert len(history) == patience + 1
    assert len({h["dev_metric"] for h in history}) == 1  # no improvement was possible
    assert result["stopped_by"] == "patience"
    assert result["epochs_run"] == patience + 1 < 6
    assert result["best_epoch"] == 1


def test_without_patience_every_epoch_runs(make_settings):
    result = run_trial(make_settings(learning_rate=1e-12, epochs=3))
    assert_ok(result)
    assert result["stopped_by"] is None and result["epochs_run"] == 3 and len(result["history"]) == 3


@pytest.mark.parametrize(("every", "steps"), [(3, [3, 6, 9, 12, 15, 16]), (4, [4, 8, 12, 16])])
def test_eval_every_n_steps(every, steps, make_settings):
    """Every N steps, plus the last step when it is not a multiple of N."""
    result = run_trial(make_settings(epochs=2, batch_size=8, eval_every=every))
    assert_ok(result)
    assert result["steps"] == 2 * STEPS_PER_EPOCH
    assert [h["step"] for h in result["history"]] == steps
    assert [h["fidelity"] for h in result["history"]] == [round(s / STEPS_PER_EPOCH, 4) for s in steps]
    assert [h["epoch"] for h in result["history"]] == [(s - 1) // STEPS_PER_EPOCH + 1 for s in steps]


@pytest.mark.parametrize("steps", [5, 3 * STEPS_PER_EPOCH + 2])
def test_max_steps_decides_the_length_of_training_not_epochs(make_settings, steps):
    result = run_trial(make_settings(epochs=1, batch_size=8, max_steps=steps))
    assert_ok(result)
    assert result["steps"] == steps and result["epochs_run"] == round(steps / STEPS_PER_EPOCH, 4)


def test_report_hook_gets_every_evaluation_and_can_stop_the_trial(make_settings):
    entries = []

    def report(entry: dict):
        entries.append(entry)
        return len(entries) == 2  # a scheduler's early stop at the second report

    result = run_trial(make_settings(epochs=5), report=report)
    assert_ok(result)
    assert result["stopped_by"] == "scheduler"
    assert len(entries) == 2 and result["history"] == entries
    assert result["epochs_run"] == 2
    for number, entry in enumerate(entries, 1):
        assert set(entry) == {"epoch", "step", "fidelity", "dev", "dev_metric", "dev_loss"}
        assert entry["dev_loss"] > 0 and "loss" not in entry["dev"]  # the loss beside the metrics, not among them
        assert entry["epoch"] == number and entry["fidelity"] == number
        assert entry["dev_metric"] == entry["dev"]["accuracy"]


def test_a_falsy_report_never_stops(make_settings):
    result = run_trial(make_settings(epochs=3), report=lambda entry: None)
    assert_ok(result)
    assert result["stopped_by"] is None and len(result["history"]) == 3


def test_best_state_is_restored_and_saved(monkeypatch, make_settings, tiny_model_dir, tmp_path):
    """Dev scores 0.5, 0.9, 0.6: the trial keeps the weights it had at the second evaluation."""
    real_evaluate = classify.evaluate
    scores = iter([0.5, 0.9, 0.6])
    snapshots = []

    def scripted(model, features, task, settings, device, dtype=None, **kwargs):
        real_evaluate(model, features, task, settings, device, dtype, **kwargs)
        snapshots.append({n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad})
        return {"accuracy": next(scores)}, None

    monkeypatch.setattr(classify, "evaluate", scripted)
    result = run_trial(make_settings(epochs=3, out_dir=str(tmp_path)))
    assert_ok(result)
    assert [h["dev_metric"] for h in result["history"]] == [0.5, 0.9, 0.6]
    assert result["dev_metric"] == 0.9 == max(h["dev_metric"] for h in result["history"])
    assert result["best_epoch"] == 2 and result["dev"] == {"accuracy": 0.9}

    best, last = snapshots[1], snapshots[2]
    assert any(not torch.equal(best[name], last[name]) for name in best)  # training moved on after the best
    model = delta.load_delta(load_model(str(tiny_model_dir), 2, seed=5), result["delta_dir"])
    params = dict(model.named_parameters())
    for name, value in best.items():
        assert torch.equal(params[name], value), name


# ---------------------------------------------------------------------------------------------- AdaMix

ADAMIX = {"methods": [{"method": "adamix", "experts": 3, "consistency": 1.0,
                       "delta": {"method": "houlsby", "bottleneck": 8}}]}


@pytest.fixture
def routing_log(monkeypatch):
    """Each call of the classification loss's `route_all`: the expert every mixture drew; and the model (last seen)."""
    log = {"routes": [], "model": None, "initial": None, "consistency_calls": 0}
    real_route, real_consistency = classify.route_all, classify.consistency_loss

    def route(model, generator):
        if log["initial"] is None:
            log["initial"] = {n: m.weight.detach().clone() for n, m in model.named_modules()
                              if isinstance(m, MixtureLinear)}
        real_route(model, generator)
        log["model"] = model
        log["routes"].append(tuple(m.active for m in model.modules() if isinstance(m, MixtureLinear)))

    def consistency(a, b):
        log["consistency_calls"] += 1
        return real_consistency(a, b)

    monkeypatch.setattr(classify, "route_all", route)
    monkeypatch.setattr(classify, "consistency_loss", consistency)
    return log


def test_adamix_trial_routes_experts_and_adds_consistency(routing_log, make_settings):
    """One epoch of 8 steps (so the final state is the trained one): the experts that trained are exactly
    the experts the router drew."""
    result = run_trial(make_settings(spec=ADAMIX, epochs=1, batch_size=8))
    assert_ok(result)
    steps = result["steps"]
    assert steps == STEPS_PER_EPOCH
    routes = routing_log["routes"]
    assert len(routes) == 2 * steps  # two stochastic passes per step; none while evaluating
    assert routing_log["consistency_calls"] == steps
    assert result["params"]["stored"] < result["params"]["trainable"]  # experts merged when stored

    mixtures = [(n, m) for n, m in routing_log["model"].named_modules() if isinstance(m, MixtureLinear)]
    assert len(mixtures) == len(routes[0]) == 4  # a down-projection per Houlsby adapter; the up is shared
    for index, (name, module) in enumerate(mixtures):
        initial = routing_log["initial"][name]
        moved = {e for e in range(module.experts) if not torch.equal(module.weight[e], initial[e])}
        # the shared up-projection starts at zero, so the down-projections get no gradient at step 1
        drawn = {route[index] for route in routes[2:]}
        assert moved == drawn, (name, moved, drawn)
    assert max(len({route[i] for route in routes}) for i in range(len(mixtures))) > 1


def test_adamix_without_consistency_makes_one_pass_per_step(routing_log, make_settings):
    spec = {"methods": [{**ADAMIX["methods"][0], "consistency": 0.0}]}
    result = run_trial(make_settings(spec=spec, epochs=1))
    assert_ok(result)
    assert len(routing_log["routes"]) == result["steps"] and routing_log["consistency_calls"] == 0


def test_adamix_routing_follows_the_seed(routing_log, make_settings, tmp_path):
    def run(seed: int):
        routing_log["routes"].clear()
        result = run_trial(make_settings(spec=ADAMIX, epochs=1, seed=seed, out_dir=str(tmp_path / str(seed))))
        assert_ok(result)
        return list(routing_log["routes"]), load_file(f"{result['delta_dir']}/delta.safetensors")

    routes_0, tensors_0 = run(0)
    routes_0_again, tensors_0_again = run(0)
    routes_1, tensors_1 = run(1)
    assert routes_0 == routes_0_again and routes_0 != routes_1
    assert all(torch.equal(tensors_0[k], tensors_0_again[k]) for k in tensors_0)
    assert all(not torch.equal(tensors_0[k], tensors_1[k]) for k in tensors_0)


# ---------------------------------------------------------------------------------------------- failures


def assert_failed(result: dict) -> str:
    assert result["status"] == "failed"
    reason = result["reason"]
    assert isinstance(reason, str) and reason and "\n" not in reason
    return reason


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_non_finite_loss_fails_the_trial(value, monkeypatch, make_settings, tmp_path):
    monkeypatch.setattr(classify, "supervised_loss", lambda logits, labels: logits.sum() * 0 + value)
    result = run_trial(make_settings(out_dir=str(tmp_path)))
    reason = assert_failed(result)
    assert reason == f"the loss became {value} at step 1"
    assert result["history"] == [] and result["steps"] == 0
    assert (tmp_path / "result.json").is_file() and not (tmp_path / "delta").exists()


def nan_from(call: int, monkeypatch) -> list:
    """Training losses (not the dev evaluation's) are nan from the `call`-th on; the calls, as they come."""
    real, calls = classify.supervised_loss, []

    def turning(logits, labels):
        loss = real(logits, labels)
        if not torch.is_grad_enabled():
            return loss
        calls.append(len(calls) + 1)
        return loss * float("nan") if len(calls) >= call else loss

    monkeypatch.setattr(classify, "supervised_loss", turning)
    return calls


@pytest.mark.parametrize("micro_batch", [None, 4])
def test_a_loss_checked_at_the_evaluation_fails_the_trial_at_its_own_step(micro_batch, monkeypatch, make_settings):
    """The losses are checked at each evaluation (and every CHECK_EVERY steps), not at every step (a host sync on
    CUDA): a loss that turns nan at step 5 (in its second micro-batch) still fails the trial at step 5, with the
    evaluation of step 3 in its history and its counts as they stood before step 5."""
    nan_from(10 if micro_batch else 5, monkeypatch)
    result = run_trial(make_settings(batch_size=8, micro_batch_size=micro_batch, eval_every=3, epochs=1,
                                     max_train_examples=48))  # six steps of two micro-batches each
    assert assert_failed(result) == "the loss became nan at step 5"
    assert [entry["step"] for entry in result["history"]] == [3]
    assert result["steps"] == 4 and result["epochs_run"] == round(4 / 6, 4)


def test_the_losses_are_checked_every_few_steps(monkeypatch, make_settings):
    """Between evaluations a check comes every CHECK_EVERY steps: a nan at step 3 stops the run at the check after
    step 4, not at the end of the epoch."""
    monkeypatch.setattr(loop, "CHECK_EVERY", 2)
    calls = nan_from(3, monkeypatch)
    result = run_trial(make_settings(batch_size=8, epochs=1))
    assert assert_failed(result) == "the loss became nan at step 3"
    assert result["history"] == [] and result["steps"] == 2
    assert len(calls) == 4 < STEPS_PER_EPOCH


def test_a_cpu_trial_keeps_fp32_matmuls_in_fp32(make_settings):
    """TF32 is for CUDA cards that have it: a CPU trial in fp32 leaves torch's float32 matmul precision alone."""
    from autopelt.train import device as devices

    assert devices.allow_tf32(torch.device("cpu"), None) is False
    assert_ok(run_trial(make_settings(precision="fp32", max_steps=1, epochs=1)))
    assert torch.get_float32_matmul_precision() == "highest"


def test_a_huge_learning_rate_fails_on_a_non_finite_loss(make_settings):
    """No monkeypatching: a real divergence (lr 1e30 without clipping) is caught by the loss check."""
    result = run_trial(make_settings(learning_rate=1e30, grad_clip=float("inf"), warmup_ratio=0.0, epochs=3))
    reason = assert_failed(result)
    assert reason.startswith("the loss became") and ("nan" in reason or "inf" in reason)


def _raise(error: BaseException):
    def fail(*args, **kwargs):
        raise error
    return fail


@pytest.mark.parametrize("error", [
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"),
    MemoryError(),
], ids=["cuda", "memoryerror"])
def test_out_of_memory_fails_the_trial(error, monkeypatch, make_settings):
    monkeypatch.setattr(classify, "training_loss", _raise(error))
    reason = assert_failed(run_trial(make_settings()))
    assert reason.startswith("out of memory"), reason


def test_cpu_out_of_memory_fails_as_out_of_memory(monkeypatch, make_settings):
    """torch's CPU allocator says "DefaultCPUAllocator: can't allocate memory" in a plain RuntimeError."""
    def allocate_too_much(*args, **kwargs):
        return torch.empty(2**50)  # 4 PiB: refused at once, nothing is allocated

    monkeypatch.setattr(classify, "training_loss", allocate_too_much)
    reason = assert_failed(run_trial(make_settings()))
    assert reason.startswith("out of memory"), reason


def test_an_unexpected_error_fails_the_trial_with_its_type(monkeypatch, make_settings):
    monkeypatch.setattr(classify, "training_loss", _raise(ValueError("shapes do not match\nsecond line")))
    result = run_trial(make_settings())
    assert assert_failed(result) == "ValueError: shapes do not match"
    assert "ValueError" in result["traceback"]


def test_an_unknown_method_fails_with_the_one_line_message(make_settings):
    reason = assert_failed(run_trial(make_settings(spec={"methods": [{"method": "nope"}]})))
    assert reason.startswith("unknown method 'nope'; known methods: ") and "lora" in reason


def test_a_bad_field_fails_with_the_one_line_message(make_settings):
    reason = assert_failed(run_trial(make_settings(spec={"methods": [{"method": "lora", "rank": 0}]})))
    assert reason.startswith("lora.rank = 0 is invalid")


def test_a_missing_data_dir_fails_naming_data_dir(make_settings, tmp_path):
    missing = tmp_path / "no-such-dir"
    reason = assert_failed(run_trial(make_settings(data_dir=missing)))
    assert "--data-dir" in reason and str(missing) in reason, reason


def test_a_missing_model_folder_fails_the_trial(make_settings, tmp_path):
    reason = assert_failed(run_trial(make_settings(model=str(tmp_path / "no" / "model"))))
    assert "does not exist" in reason

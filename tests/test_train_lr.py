"""Learning rates that learn: a trial given none sweeps a few to its first evaluation, continues the best, records how."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from autopelt.train import classify, loop, lr_sweep, run_trial
from tinymodels import make_settings, sst2_dir, tiny_model_dir, trial_cache  # noqa: F401  (fixtures)

MEASURED_MARGIN = lr_sweep.learned_margin  # the real one, before a test replaces it
DROPOUT_LORA = {"methods": [{"method": "lora", "rank": 4, "dropout": 0.1}]}  # dropout: the global RNG matters


def test_a_trial_without_a_learning_rate_sweeps_and_records_how(make_settings):
    result = run_trial(make_settings(learning_rate=None, epochs=2))
    assert result["status"] == "ok", result["reason"]
    choice = result["lr_choice"]
    assert choice["how"] == "sweep" and result["learning_rate"] == choice["rate"]
    tried = {float(rate): first for rate, first in choice["candidates"].items()}
    assert set(lr_sweep.START) <= set(tried) and len(tried) <= lr_sweep.MAX_CANDIDATES
    ranked = {float(rate): e for rate, e in choice.get("second", {}).items()} or tried  # (none learned: a 2nd round)
    best = min(ranked, key=lambda r: (ranked[r]["dev_loss"], -ranked[r]["dev_metric"]))
    assert choice["rate"] == best
    assert result["history"][0]["dev_metric"] == tried[best]["dev_metric"]  # the winner's own first evaluation
    assert choice["steps"] == result["history"][0]["step"] and choice["seconds"] > 0
    assert result["overhead_seconds"] < result["total_seconds"] - choice["seconds"]  # the sweep is not "overhead"


def test_the_chosen_rate_trains_exactly_as_if_it_had_been_given(make_settings, tmp_path):
    """Every candidate starts from the same weights, batches and random state, and the winner goes on from
    where it stood: its whole trial is bit-identical to a trial given that rate from the start."""
    auto = run_trial(make_settings(spec=DROPOUT_LORA, learning_rate=None, epochs=3, out_dir=str(tmp_path / "auto")))
    given = run_trial(make_settings(spec=DROPOUT_LORA, learning_rate=auto["learning_rate"], epochs=3,
                                    out_dir=str(tmp_path / "given")))
    assert auto["status"] == given["status"] == "ok"
    assert auto["history"] == given["history"] and auto["test"] == given["test"]
    saved_auto = load_file(f"{auto['delta_dir']}/delta.safetensors")
    saved_given = load_file(f"{given['delta_dir']}/delta.safetensors")
    assert saved_auto.keys() == saved_given.keys()
    assert all(torch.equal(saved_auto[k], saved_given[k]) for k in saved_auto)


def _scripted_dev(monkeypatch, table, rows: int = 1000):
    """Each run's evaluations say what `table(rate)` gives: (dev metric above predicting one class, dev loss),
    judged as on `rows` dev rows (the measurements' own: K=1000 keeps 1,000), not the tiny task's few."""
    real = classify.evaluate
    monkeypatch.setattr(lr_sweep, "learned_margin", lambda floor, _: MEASURED_MARGIN(floor, rows))

    def scripted(model, features, task, settings, *args, **kwargs):
        metrics, gates = real(model, features, task, settings, *args, **kwargs)
        above, loss = table(settings.learning_rate)
        floor = lr_sweep.one_class_metric(SimpleNamespace(task=task, dev=features))
        return {**metrics, task.metric: floor + above, "loss": loss}, gates

    monkeypatch.setattr(classify, "evaluate", scripted)


def _valley(best_rate: float):
    """Every rate learns; the loss grows with the distance (in decades) from `best_rate`."""
    def table(rate):
        distance = abs(math.log10(rate) - math.log10(best_rate))
        return 0.3 - 0.1 * distance, 0.3 + 0.1 * distance
    return table


@pytest.mark.parametrize("best, tried", [(3e-4, {1e-4, 3e-4, 1e-3, 3e-3, 1e-2}), (3e-3, {1e-3, 3e-3, 1e-2}),
                                         (3e-2, {1e-3, 3e-3, 1e-2, 3e-2, 1e-1})])
def test_the_sweep_walks_the_ladder_while_the_best_rate_is_at_an_edge(monkeypatch, make_settings, best, tried):
    _scripted_dev(monkeypatch, _valley(best))
    result = run_trial(make_settings(learning_rate=None, epochs=2))
    assert result["status"] == "ok", result["reason"]
    assert {float(r) for r in result["lr_choice"]["candidates"]} == tried
    assert result["learning_rate"] == best and "backed_off_from" not in result["lr_choice"]


def test_when_no_rate_has_learned_the_sweep_walks_down(monkeypatch, make_settings):
    """Prefix-tuning on SST-2 after one epoch: 1e-3, 3e-3 and 1e-2 predict one class, the loss is lowest at 3e-3
    (inside), and only 3e-4 has begun to learn (the measured dev losses). The midpoints around 3e-3 are tried first
    and learn nothing either (assumed here: 1e-3 to 1e-2 all predict one class)."""
    measured = {1e-4: (0.0, 0.685), 3e-4: (0.05, 0.664), 1e-3: (0.0, 0.688), 3e-3: (0.0, 0.679), 1e-2: (0.0, 0.680)}
    _scripted_dev(monkeypatch, lambda rate: measured.get(rate, (0.0, 0.685)))
    result = run_trial(make_settings(learning_rate=None, epochs=2))
    assert result["status"] == "ok", result["reason"]
    tried = sorted(float(r) for r in result["lr_choice"]["candidates"])
    assert tried == [3e-4, 1e-3, 1.7e-3, 3e-3, 5.5e-3, 1e-2]  # the midpoints, to two digits
    assert result["learning_rate"] == 3e-4


def test_when_no_rate_has_learned_the_sweep_tries_between_the_rungs_first(monkeypatch, make_settings):
    """LoRA on SNLI after one epoch: 1e-3, 3e-3 and 1e-2 predict one class (dev losses 1.0967, 1.0966, 1.0986,
    measured), while a narrow band between 3e-3 and 1e-2 learns (a full run at 5.55e-3: 0.453 on dev after one
    epoch, one class 0.35). The midpoint above the best finds it, and the sweep stops there."""
    upper = 5.5e-3  # the geometric midpoint, to two digits
    measured = {1e-3: (-0.004, 1.0967), 3e-3: (0.0, 1.0966), 1e-2: (-0.005, 1.0986), upper: (0.10, 1.08)}
    _scripted_dev(monkeypatch, measured.__getitem__)
    result = run_trial(make_settings(learning_rate=None, epochs=2))
    assert result["status"] == "ok", result["reason"]
    assert {float(r) for r in result["lr_choice"]["candidates"]} == set(measured)
    assert result["learning_rate"] == upper and "backed_off_from" not in result["lr_choice"]


def test_a_rate_that_beats_one_class_by_less_than_the_noise_of_dev_has_not_learned(monkeypatch, make_settings):
    """LoRA on SNLI in bf16 after one epoch (measured; one class 0.337 on 1,000 dev rows): 1e-2 beats one class by
    3.6 points, 2.4 standard errors, and has the lowest loss; continued, it ended at 0.413 on dev. Not learned yet,
    so the midpoints around it are tried: 5.5e-3 had 0.458 after one epoch and ended at 0.581."""
    measured = {1e-3: (0.010, 1.097), 3e-3: (0.012, 1.096), 1e-2: (0.036, 1.084), 3e-2: (0.0, 1.110),
                1.7e-2: (0.0, 1.099), 5.5e-3: (0.121, 1.060)}
    _scripted_dev(monkeypatch, measured.__getitem__)
    result = run_trial(make_settings(learning_rate=None, epochs=2))
    assert result["status"] == "ok", result["reason"]
    assert {float(r) for r in result["lr_choice"]["candidates"]} == set(measured)
    assert result["learning_rate"] == 5.5e-3

    # as many dev rows: 3.6 points is not noise
    _scripted_dev(monkeypatch, measured.__getitem__, rows=100_000)
    result = run_trial(make_settings(learning_rate=None, epochs=2))
    assert {float(r) for r in result["lr_choice"]["candidates"]} == {1e-3, 3e-3, 1e-2, 3e-2}
    assert result["learning_rate"] == 1e-2


def test_the_learned_margin_is_three_standard_errors_of_dev_and_never_below_a_point():
    assert lr_sweep.learned_margin(0.5, 1000) == pytest.approx(3 * 0.5 / math.sqrt(1000))
    assert lr_sweep.learned_margin(0.337, 1000) == pytest.approx(0.0448, abs=1e-4)
    assert lr_sweep.learned_margin(0.0, 100) == pytest.approx(0.15)  # a correlation's floor: as at one half
    assert lr_sweep.learned_margin(0.5, 10**9) == lr_sweep.LEARNED_MARGIN


def test_the_sweep_backs_off_from_a_rate_next_to_one_that_collapsed(monkeypatch, make_settings):
    """The adapter on SST-2 after one epoch: 1e-2 has the lowest loss, but 3e-2 collapsed to one class; 3e-3 is
    continued, and its trial is the one a run given 3e-3 makes."""
    measured = {1e-3: (0.036, 0.567), 3e-3: (0.189, 0.457), 1e-2: (0.222, 0.398), 3e-2: (0.0, 0.680)}
    _scripted_dev(monkeypatch, measured.__getitem__)
    result = run_trial(make_settings(learning_rate=None, epochs=2))
    assert result["status"] == "ok", result["reason"]
    assert {float(r) for r in result["lr_choice"]["candidates"]} == set(measured)
    assert result["learning_rate"] == 3e-3 and result["lr_choice"]["backed_off_from"] == 1e-2
    assert result["history"][0]["dev_loss"] == 0.457

    measured[3e-2] = (0.1, 0.5)  # the rung above learned: nothing to back off from
    result = run_trial(make_settings(learning_rate=None, epochs=2))
    assert result["learning_rate"] == 1e-2 and "backed_off_from" not in result["lr_choice"]


def test_the_sweep_keeps_the_best_rate_when_the_one_below_has_dropped_its_loss_much_less(monkeypatch, make_settings):
    """BitFit on SST-2 with seed 0 after one epoch (measured; one class 0.581): 3e-2 collapsed, 1e-2 leads, and 3e-3
    has 87% of its gain over one class but 46% of its drop in dev loss from 3e-2. Trained on, 1e-2 tested 76.1 and
    3e-3 75.0 (over five seeds 76.3 against 74.5): the sweep keeps 1e-2."""
    measured = {1e-3: (0.0, 0.6675), 3e-3: (0.202, 0.5715), 1e-2: (0.233, 0.4419), 3e-2: (0.0, 0.6800)}
    _scripted_dev(monkeypatch, measured.__getitem__)
    result = run_trial(make_settings(learning_rate=None, epochs=2))
    assert result["status"] == "ok", result["reason"]
    assert {float(r) for r in result["lr_choice"]["candidates"]} == set(measured)
    assert result["learning_rate"] == 1e-2 and "backed_off_from" not in result["lr_choice"]

    measured[3e-3] = (0.202, 0.5)  # 76% of the drop: nearly as much, so back off
    result = run_trial(make_settings(learning_rate=None, epochs=2))
    assert result["learning_rate"] == 3e-3 and result["lr_choice"]["backed_off_from"] == 1e-2

    measured[3e-2] = (0.0, 0.43)  # the rung above predicts one class but its loss is below the best's: slow, kept
    result = run_trial(make_settings(learning_rate=None, epochs=2))
    assert result["learning_rate"] == 1e-2 and "backed_off_from" not in result["lr_choice"]


def test_the_sweep_keeps_the_best_rate_when_the_one_below_has_learned_much_less(monkeypatch, make_settings):
    """LoRA on SNLI with seed 2 after one epoch: 1e-2 has not learned yet, 3e-3 leads by 12.7 points over one
    class, 1e-3 has 6.0 of them (47%): backing off would cost more than the risk it avoids."""
    measured = {1e-3: (0.060, 1.096), 3e-3: (0.127, 1.048), 1e-2: (0.0, 1.098)}
    _scripted_dev(monkeypatch, measured.__getitem__)
    result = run_trial(make_settings(learning_rate=None, epochs=2))
    assert result["status"] == "ok", result["reason"]
    assert {float(r) for r in result["lr_choice"]["candidates"]} == set(measured)
    assert result["learning_rate"] == 3e-3 and "backed_off_from" not in result["lr_choice"]


def _by_evaluation(first: dict, second: dict):
    """A table whose rates say `first[rate]` at their first evaluation and `second.get(rate, first[rate])` after."""
    seen: dict[float, int] = {}

    def table(rate):
        seen[rate] = seen.get(rate, 0) + 1
        return first[rate] if seen[rate] == 1 else second.get(rate, first[rate])
    return table


def test_when_nothing_has_learned_the_two_likeliest_rates_are_ranked_at_the_second_evaluation(monkeypatch,
                                                                                              make_settings):
    """Prompt-tuning on SST-2 with seed 1 (measured; one class 0.589): after one epoch nothing has learned, 3e-3
    leads on the metric by less than the margin, and 1e-2 moved furthest from one class (0.451). Both train on to
    the second evaluation, where 1e-2 has learned (0.750; it tested 68.6). (5.5e-3, a midpoint, is assumed.)"""
    first = {3e-4: (0.0, 0.6847), 1e-3: (0.0, 0.6787), 1.7e-3: (0.0, 0.6800), 5.5e-3: (0.0, 0.6890),
             3e-3: (0.027, 0.6873), 1e-2: (-0.138, 0.6907)}
    second = {3e-3: (0.02, 0.686), 1e-2: (0.161, 0.645)}
    _scripted_dev(monkeypatch, _by_evaluation(first, second))
    result = run_trial(make_settings(learning_rate=None, epochs=3))
    assert result["status"] == "ok", result["reason"]
    choice = result["lr_choice"]
    assert {float(r) for r in choice["candidates"]} == set(first)
    assert {float(r) for r in choice["second"]} == {3e-3, 1e-2}
    assert result["learning_rate"] == 1e-2 and "backed_off_from" not in choice
    assert [round(e["dev_loss"], 4) for e in result["history"][:2]] == [0.6907, 0.645]  # its own two evaluations
    assert choice["steps"] == result["history"][0]["step"]


def test_when_nothing_has_moved_the_two_lowest_losses_go_on_and_the_second_evaluation_decides(monkeypatch,
                                                                                              make_settings):
    """UniPELT(APL) on SNLI in fp32 (measured; one class 0.344): after one epoch all six rates sit within 1.4
    points of one class, and 3e-3 leads 1e-3 by 0.0016 in loss. Which goes on is decided one evaluation later
    (assumed here: 1e-3 learns by then, 3e-3 does not)."""
    first = {3e-4: (-0.010, 1.0986), 1e-3: (-0.007, 1.0961), 1.7e-3: (-0.007, 1.0985), 3e-3: (0.004, 1.0945),
             5.5e-3: (-0.007, 1.0987), 1e-2: (-0.007, 1.0983)}
    second = {1e-3: (0.10, 1.02), 3e-3: (0.0, 1.09)}
    _scripted_dev(monkeypatch, _by_evaluation(first, second))
    result = run_trial(make_settings(learning_rate=None, epochs=3))
    assert result["status"] == "ok", result["reason"]
    assert {float(r) for r in result["lr_choice"]["second"]} == {3e-3, 1e-3}
    assert result["learning_rate"] == 1e-3

    _scripted_dev(monkeypatch, _by_evaluation(first, {1e-3: (0.0, 1.097), 3e-3: (0.0, 1.093)}))
    result = run_trial(make_settings(learning_rate=None, epochs=3))  # neither learned: the lower loss again
    assert result["learning_rate"] == 3e-3 and len(result["lr_choice"]["second"]) == 2


def test_a_rate_that_diverges_in_the_second_round_drops_out_of_it(monkeypatch, make_settings):
    """Nothing learned by epoch 1; 3e-3 leads in loss, but its loss becomes non-finite in epoch 2: the other of the
    two, 1e-3, goes on, and the trial trains to the end."""
    first = {3e-4: (-0.010, 1.0986), 1e-3: (-0.007, 1.0961), 1.7e-3: (-0.007, 1.0985), 3e-3: (0.004, 1.0945),
             5.5e-3: (-0.007, 1.0987), 1e-2: (-0.007, 1.0983)}
    _scripted_dev(monkeypatch, first.__getitem__)
    real_step = loop.Training._step

    def step(self, indices):
        if self.settings.learning_rate == 3e-3 and self.outcome.steps >= self.steps_per_epoch:
            raise loop.NonFiniteLoss(f"the loss became nan at step {self.outcome.steps + 1}")
        real_step(self, indices)

    monkeypatch.setattr(loop.Training, "_step", step)
    result = run_trial(make_settings(learning_rate=None, epochs=3))
    assert result["status"] == "ok", result["reason"]
    assert result["learning_rate"] == 1e-3 and list(result["lr_choice"]["second"]) == ["0.001"]
    assert len(result["history"]) == 3


def test_a_sweep_that_has_learned_something_or_ends_at_its_first_evaluation_trains_nothing_on(monkeypatch,
                                                                                             make_settings):
    first = {1e-3: (0.0, 0.68), 3e-3: (0.0, 0.67), 1e-2: (0.0, 0.69), 1.7e-3: (0.0, 0.68), 5.5e-3: (0.0, 0.675),
             3e-4: (0.0, 0.685)}
    _scripted_dev(monkeypatch, first.__getitem__)
    result = run_trial(make_settings(learning_rate=None, epochs=1))  # no second evaluation to rank by
    assert result["status"] == "ok", result["reason"]
    assert result["learning_rate"] == 3e-3 and "second" not in result["lr_choice"]

    first[5.5e-3] = (0.1, 0.6)
    result = run_trial(make_settings(learning_rate=None, epochs=3))
    assert result["learning_rate"] == 5.5e-3 and "second" not in result["lr_choice"]


def test_a_rate_chosen_at_the_second_evaluation_trains_exactly_as_if_it_had_been_given(monkeypatch, make_settings,
                                                                                       tmp_path):
    """With nothing counted as learned, two candidates train on to the second evaluation from their saved states;
    the winner's whole trial is still the one a run given its rate makes."""
    monkeypatch.setattr(lr_sweep, "learned_margin", lambda floor, rows: 10.0)  # nothing ever learns
    auto = run_trial(make_settings(spec=DROPOUT_LORA, learning_rate=None, epochs=3, out_dir=str(tmp_path / "a")))
    assert auto["status"] == "ok", auto["reason"]
    assert len(auto["lr_choice"]["second"]) == 2 and f"{auto['learning_rate']:g}" in auto["lr_choice"]["second"]
    given = run_trial(make_settings(spec=DROPOUT_LORA, learning_rate=auto["learning_rate"], epochs=3,
                                    out_dir=str(tmp_path / "given")))
    assert auto["history"] == given["history"] and auto["test"] == given["test"]
    second = auto["lr_choice"]["second"][f"{auto['learning_rate']:g}"]
    assert second["dev_metric"] == auto["history"][1]["dev_metric"]


def test_a_rate_whose_loss_diverges_loses_and_every_rate_diverging_fails_the_trial(monkeypatch, make_settings):
    real_step = loop.Training._step

    def step(self, indices, limit):
        if self.settings.learning_rate >= limit:
            raise loop.NonFiniteLoss(f"the loss became nan at step {self.outcome.steps + 1}")
        real_step(self, indices)

    monkeypatch.setattr(loop.Training, "_step", lambda self, indices: step(self, indices, 1e-2))
    result = run_trial(make_settings(learning_rate=None, epochs=2))
    assert result["status"] == "ok" and result["learning_rate"] < 1e-2
    assert result["lr_choice"]["candidates"]["0.01"]["dev_metric"] is None

    monkeypatch.setattr(loop.Training, "_step", lambda self, indices: step(self, indices, 0.0))
    result = run_trial(make_settings(learning_rate=None, epochs=2))
    assert result["status"] == "failed"
    assert result["reason"] == ("the loss became non-finite at every learning rate tried "
                                "(3e-05, 0.0001, 0.0003, 0.001, 0.003, 0.01)")  # walked down: lower rates diverge less


def test_a_given_learning_rate_is_used_as_it_is(monkeypatch, make_settings):
    monkeypatch.setattr(lr_sweep, "_Sweep", lambda *a, **k: pytest.fail("no sweep for a given rate"))
    result = run_trial(make_settings(learning_rate=3e-3, epochs=1))
    assert result["learning_rate"] == 3e-3 and result["lr_choice"] == {"rate": 3e-3, "how": "given", "seconds": 0.0}


def test_a_scheduler_sees_the_winners_first_evaluation_once(make_settings):
    seen = []
    result = run_trial(make_settings(learning_rate=None, epochs=3), report=lambda entry: seen.append(entry) and None)
    assert result["status"] == "ok", result["reason"]
    assert [e["epoch"] for e in seen] == [1, 2, 3] and seen == result["history"]

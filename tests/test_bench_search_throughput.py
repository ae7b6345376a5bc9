"""bench/search_throughput.py: a trial's seconds split into phases that add up, and the search's own time."""

from __future__ import annotations

import pytest
from support import benches


def load_bench():
    return benches.load_bench("search_throughput")


def result(total, train, evaluation, lr=0.0, **phases):
    return {"status": "ok", "total_seconds": total, "train_seconds": train, "eval_seconds": evaluation,
            "lr_choice": {"seconds": lr}, "phase_seconds": phases}


def test_phases_add_up_to_the_trial_and_the_rest_is_the_search_itself():
    bench = load_bench()
    trial = result(100.0, 60.0, 20.0, lr=5.0, data=4.0, model=2.0, attention=1.0, delta=0.5, save=0.5)
    phases = bench.trial_phases(trial)
    assert sum(phases.values()) == pytest.approx(100.0) and phases["rest of the trial"] == pytest.approx(7.0)
    summary = bench.summarise([trial, result(50.0, 40.0, 5.0)], wall=200.0, workers=1)
    assert summary["trials_per_hour"] == pytest.approx(36.0)
    assert summary["outside_trials_seconds"] == pytest.approx(50.0)  # 200 s of one worker, 150 s in trials
    assert summary["overhead_share"] == pytest.approx((200 - 100 - 25 - 5) / 200)  # the sweep trains too
    assert "36.0 trials per hour" in bench.table(summary)
    rows = {row["where the time goes"]: row for row in bench.phase_rows(summary)}
    assert rows["training"]["seconds"] == pytest.approx(100.0) and rows["training"]["share_pct"] == pytest.approx(50.0)
    assert sum(row["share_pct"] for row in rows.values()) == pytest.approx(100.0, abs=0.5)


def test_a_trial_early_stopping_ended_counts_as_training_not_as_the_search_s_own_time():
    bench = load_bench()
    summary = bench.summarise([result(100.0, 80.0, 20.0)], wall=200.0, workers=1, stopped=[60.0])
    assert summary["trials"] == 2 and summary["stopped_early"] == 1
    assert summary["outside_trials_seconds"] == pytest.approx(40.0)  # 200 - 100 - 60
    assert summary["overhead_share"] == pytest.approx(40.0 / 200)


def test_a_running_study_s_overhead_leaves_out_the_first_trial_and_counts_the_hand_over():
    from types import SimpleNamespace

    bench = load_bench()
    results = {0: result(30.0, 10.0, 5.0, data=10.0), 1: result(20.0, 15.0, 4.0, data=0.5),
               2: result(10.0, 7.0, 2.0, model=0.5)}
    records = [SimpleNamespace(number=0, seconds=40.0), SimpleNamespace(number=1, seconds=20.5),
               SimpleNamespace(number=2, seconds=10.5), SimpleNamespace(number=3, seconds=12.0)]  # 3: stopped
    # trial 1: 0.5 s handed over + 0.5 data + 0.5 rest; trial 2: 0.5 + 0.5 model + 0.5 rest
    assert bench.running_overhead(records, results) == pytest.approx(3.0 / 31.0)


def test_the_hand_over_adds_the_phases_before_training_and_counts_the_warm_trials():
    bench = load_bench()
    cold = {**result(30.0, 20.0, 5.0, data=2.0, model=1.0, attention=0.5, delta=0.5), "warm": {"model": False}}
    warm = {**result(25.0, 20.0, 5.0, data=0.0, model=0.1, delta=0.1), "warm": {"model": True, "data": True}}
    summary = bench.summarise([cold, warm], wall=110.0, workers=1)
    handed = bench.hand_over([cold, warm], summary)
    assert handed["trials"] == 2 and handed["warm_trials"] == 1
    assert handed["hand_over_seconds"] == pytest.approx(4.2) and handed["per_trial_seconds"] == pytest.approx(2.1)
    assert handed["per_later_trial_seconds"] == pytest.approx(0.2)  # the worker's second trial, held
    assert handed["model_seconds"] == pytest.approx(1.1) and handed["share_pct"] == pytest.approx(100 * 4.2 / 110, abs=0.01)

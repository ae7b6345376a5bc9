"""bench/sweep_rules_loo.py: its replay of the learning-rate sweep makes the real sweep's choice from the real
sweep's own evaluations, and each rule switched off changes what it should."""

from __future__ import annotations

import types

from support.benches import load_bench
from tinymodels import make_settings, sst2_dir, tiny_model_dir, trial_cache  # noqa: F401  (fixtures)

from autopelt.models import load_tokenizer
from autopelt.train import lr_sweep, run_trial
from autopelt.train.trial_data import prepare_data

bench = load_bench("sweep_rules_loo")


def records_of(choice: dict) -> dict[float, dict]:
    """What the collector records of each candidate, from a sweep's own lr_choice: its first evaluation, and its
    second where the sweep trained it on."""
    second = choice.get("second", {})
    return {float(rate): {"status": "ok", "epochs": [{"dev": e["dev_metric"], "dev_loss": e["dev_loss"]}] + (
        [{"dev": second[rate]["dev_metric"], "dev_loss": second[rate]["dev_loss"]}] if rate in second else [])}
        for rate, e in choice["candidates"].items()}


def test_the_replay_chooses_what_the_real_sweep_chose_from_the_same_evaluations(make_settings, tiny_model_dir):
    settings = make_settings(learning_rate=None, epochs=2)
    result = run_trial(settings)
    assert result["status"] == "ok", result["reason"]
    data = prepare_data(settings, load_tokenizer(str(tiny_model_dir)))
    info = types.SimpleNamespace(floor=lr_sweep.one_class_metric(data), rows=len(data.dev.labels))
    rate, tried = bench.replay(records_of(result["lr_choice"]), info, lr_sweep.RULES)
    assert rate == result["learning_rate"] and tried == len(result["lr_choice"]["candidates"])


def ladder(table: dict[float, tuple[float, float]]) -> dict[float, dict]:
    return {rate: {"status": "ok", "epochs": [{"dev": dev, "dev_loss": loss}] * 3} for rate, (dev, loss) in
            table.items()}


def test_each_rule_switched_off_changes_the_choice_it_makes():
    """1e-2 leads on the edge of stability (3e-2 collapsed, 3e-3 nearly as good): all rules back off to 3e-3;
    without back_off the sweep goes on at 1e-2. A lead of one point over predicting one class has not learned
    with the margin, so the sweep walks down the ladder; without it, it has, and one rung below ends the walk."""
    info = types.SimpleNamespace(floor=0.5, rows=1000)  # margin 4.7 points
    edge = ladder({1e-3: (0.70, 0.60), 3e-3: (0.79, 0.50), 1e-2: (0.80, 0.48), 3e-2: (0.5, 0.70), 1e-4: (0.5, 0.69),
                   3e-4: (0.6, 0.65), 1e-1: (0.5, 0.9)})
    assert bench.replay(edge, info, lr_sweep.RULES)[0] == 3e-3
    assert bench.replay(edge, info, lr_sweep.RULES - {"back_off"})[0] == 1e-2
    flat = ladder({1e-3: (0.51, 0.690), 3e-3: (0.50, 0.689), 1e-2: (0.50, 0.695), 3e-4: (0.50, 0.691),
                   1e-4: (0.50, 0.692), 3e-5: (0.50, 0.693), 1.7e-3: (0.50, 0.690), 5.5e-4: (0.50, 0.690),
                   5.5e-3: (0.50, 0.690)})
    with_margin = bench.replay(flat, info, lr_sweep.RULES - {"second_round"})
    without = bench.replay(flat, info, lr_sweep.RULES - {"second_round", "learned_margin"})
    assert with_margin == (1e-3, 6)  # nothing learned: the best is the lowest rung tried, so down the ladder
    assert without == (1e-3, 4)  # 0.51 beats one class: learned, on the lowest rung tried; the rung below it


def test_a_ladder_rate_reads_back_from_its_configuration_name_hyphenated_exponents_too():
    for method in bench.METHODS:
        for rate in bench.GRID:
            assert bench.rate_of(bench.config_name(rate, method), method) == rate
    assert bench.config_name(3e-5, "prefix") == "sweep-prefix-l10-3e-05"  # the hyphen once read as rate 5

"""bench/rate_rules.py: each rule's rate, the ladder around them, and the summary's choice of the best rate by dev."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import rate_rules  # noqa: E402


def test_each_rule_gives_its_rate():
    rates = rate_rules.rule_rates(3e-3, 768, lora_rate=1e-3, reference=2e-3)
    assert rates["absolute"] == 3e-3
    assert rates["calibrated"] == pytest.approx(1.5e-3)
    assert rates["transfer"] == pytest.approx(3e-3 * 0.5 ** 0.781)
    assert "calibrated" not in rate_rules.rule_rates(3e-3, 768, lora_rate=None, reference=2e-3)


def test_the_ladder_holds_every_rules_thirds_and_triples_once():
    rungs = rate_rules.ladder({"a": 1e-3, "b": 1.02e-3})  # within 5%: one ladder
    assert rungs == [pytest.approx(1e-3 / 3, rel=1e-2), 1e-3, 3e-3]
    assert len(rate_rules.ladder({"a": 1e-3, "b": 1e-2})) == 6


def test_the_summary_picks_the_best_mean_dev_and_reports_each_rules_test():
    rules = {"absolute": 3e-3, "transfer": 1e-3}
    rows = [{"model": "m", "task": "t", "member": "x", "status": "ok", "rate": rate, "seed": seed, "rules": rules,
             "dev": dev, "test": test}
            for rate, seed, dev, test in [(1e-3, 0, 0.8, 0.7), (1e-3, 1, 0.9, 0.8), (3e-3, 0, 0.95, 0.9),
                                          (3e-3, 1, 0.6, 0.5), (9e-3, 0, 0.5, 0.5)]]
    [entry] = rate_rules.summarise(rows)
    assert entry["best_rate"] == 1e-3 and entry["best_dev"] == pytest.approx(0.85)  # mean dev, not one seed
    assert entry["transfer_off"] == 0 and entry["absolute_off"] == pytest.approx(round(math.log10(3), 2))
    assert entry["transfer_test"] == pytest.approx(0.75) and entry["absolute_test"] == pytest.approx(0.7)


def test_a_mean_row_averages_each_rule_over_the_members_where_it_ran():
    rules = {"absolute": 3e-3, "transfer": 1e-3}
    rows = [{"model": "m", "task": "t", "member": member, "status": "ok", "rate": rate, "seed": 0, "rules": rules,
             "dev": dev, "test": dev - 0.1}
            for member, rate, dev in [("x", 1e-3, 0.9), ("x", 3e-3, 0.8), ("y", 3e-3, 0.7), ("y", 9e-3, 0.6)]]
    *_, mean = rate_rules.summarise(rows)
    assert mean["member"] == "mean" and mean["absolute_members"] == 2 and mean["transfer_members"] == 1
    assert mean["absolute_test"] == pytest.approx((0.7 + 0.6) / 2) and mean["transfer_test"] == pytest.approx(0.8)
    assert mean["absolute_off"] == pytest.approx(round(math.log10(3), 2) / 2)  # x: 3x off, y: at its best


def _cell(model, task, member, off):
    return {"model": model, "task": task, "member": member,
            **{f"{rule}_off": value for rule, value in off.items()},
            **{f"{rule}_test": 0.8 for rule in off}}


def test_a_model_with_two_tasks_gets_a_mean_over_both():
    rules = {"absolute": 3e-3, "transfer": 1e-3}
    rows = [{"model": "m", "task": task, "member": member, "status": "ok", "rate": 1e-3, "seed": 0, "rules": rules,
             "dev": 0.9, "test": 0.8}
            for task in ("t", "u") for member in ("x", "y")]
    means = [e for e in rate_rules.summarise(rows) if e["member"] == "mean"]
    assert [e["task"] for e in means] == ["t", "u", "all"] and means[-1]["transfer_members"] == 4


def test_over_two_models_a_mean_over_the_cells_the_decision_reads():
    rules = {"absolute": 9e-3, "calibrated": 3e-3, "transfer": 1e-3}
    best = {("m", "x"): 1e-3, ("m", "y"): 1e-3, ("n", "x"): 3e-3}  # per cell, the rate with the best dev
    rows = [{"model": model, "task": "t", "member": member, "status": "ok", "rate": rate, "seed": 0, "rules": rules,
             "dev": 0.9 if rate == top else 0.7, "test": 0.8}
            for (model, member), top in best.items() for rate in rules.values()]
    rows.append({**rows[0], "model": "n", "member": "z", "rate": 9e-3})  # only absolute's rate ran: left out
    table = rate_rules.summarise(rows)
    [overall] = [e for e in table if e["model"] == "all"]
    assert overall["task"] == "all" and overall["absolute_members"] == 3
    assert overall["transfer_off"] == pytest.approx(round(round(math.log10(3), 2) / 3, 2))  # 0, 0, log10(3)
    nine, three = round(math.log10(9), 2), round(math.log10(3), 2)  # each cell's distance is rounded first
    assert overall["absolute_off"] == pytest.approx(round((2 * nine + three) / 3, 2))
    assert rate_rules.decide(table) == "transfer"  # the mean rows are not read as cells


def test_the_decision_moves_from_absolute_only_by_a_tenth_of_a_decade():
    near = [_cell("m", "t", "x", {"absolute": 0.3, "calibrated": 0.25, "transfer": 0.21})]
    assert rate_rules.decide(near) == "absolute"  # 0.09 nearer: not enough
    far = [_cell("m", "t", "x", {"absolute": 0.3, "calibrated": 0.25, "transfer": 0.2})]
    assert rate_rules.decide(far) == "transfer"
    missing = [{**far[0], "calibrated_test": None}]  # a rule's own rate has not run: the cell does not count
    assert rate_rules.decide(missing) == "absolute"


def test_the_rungs_left_run_nearest_their_members_best_so_far_first():
    from types import SimpleNamespace

    members = [SimpleNamespace(name="x", learning_rate=3e-3), SimpleNamespace(name="y", learning_rate=1e-3)]
    portfolio, config = SimpleNamespace(reference_rate=None), SimpleNamespace(hidden_size=384)  # one rule's rate
    rungs = [(member.name, rate) for _, member, _, rate in rate_rules._rungs(members, portfolio, config, None)]
    assert rungs[:2] == [("x", 3e-3), ("y", 1e-3)]  # each rule's own rate first
    assert rungs[2:] == [("x", 1e-3), ("x", 9e-3), ("y", pytest.approx(1e-3 / 3, rel=1e-2)), ("y", 3e-3)]
    done = {"m|t|k5|x|0.003|seed0": {"member": "x", "rate": 3e-3, "dev": 0.7},
            "m|t|k5|x|0.009|seed0": {"member": "x", "rate": 9e-3, "dev": 0.8},
            "m|t|k5|y|0.001|seed0": {"member": "y", "rate": 1e-3, "dev": 0.6},
            "m|t|k5|lora-sweep|seed0": {"member": "lora-sweep", "rate": None, "dev": 0.9},
            "m|u|k5|y|0.003|seed0": {"member": "y", "rate": 3e-3, "dev": 0.99}}  # another task: not read
    best = rate_rules._best_so_far(done, "m|t|k5")
    assert best == {"x": 9e-3, "y": 1e-3}
    rungs = [(member.name, rate) for _, member, _, rate in rate_rules._rungs(members, portfolio, config, None, best)]
    assert rungs[2:] == [("x", 9e-3), ("y", 3e-3), ("y", pytest.approx(1e-3 / 3, rel=1e-2)), ("x", 1e-3)]  # the
    #                    best itself (already run: skipped), y's both a factor 3 off (3e-3 by 0.000333's rounding)

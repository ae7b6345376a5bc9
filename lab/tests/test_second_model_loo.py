"""experiments/rate-calibration/second_model_loo.py on a small synthetic meta-dataset of a second model: the design, MiniLM's members at
absolute rates and their calibrated trials."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))  # results.py
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments" / "rate-calibration"))

import second_model_loo  # noqa: E402

from autopelt.portfolio.metafeatures import MetaFeatures  # noqa: E402
from metalearning import calibrated, simulate  # noqa: E402
from metalearning.design import DESIGN  # noqa: E402

FEATURES = {"classes": 2, "rows": 1000, "mean_tokens": 20.0, "pair": False, "regression": False, "imbalance": 0.0}


def _record(task, config, seed, level, rng):
    devs = [level - 0.1, level - 0.02, level]
    return {"task": task, "config": config, "seed": seed, "status": "ok",
            "epochs": [{"dev": d + rng.uniform(-0.005, 0.005), "dev_loss": 0.5, "test": d, "seconds": 10.0 * (e + 1)}
                       for e, d in enumerate(devs)]}


def test_the_arms_read_their_own_trials_and_a_seed_without_calibrated_trials_is_left_out(tmp_path, capsys):
    rng = random.Random(0)
    tasks = ("alpha", "beta", "gamma")  # no MiniLM task: its members are the shipped prior's
    members = [m.name for m in calibrated.minilm_portfolio("alpha", MetaFeatures.from_dict(FEATURES)).members[:4]]
    records = []
    for task in tasks:
        for seed in (0, 1):
            for config in DESIGN:  # the design: MiniLM's members at their MiniLM rates score 0.60, the rest 0.70
                level = 0.6 if config.name in members else 0.7
                records.append(_record(task, config.name, seed, level, rng))
            for member in members if seed == 0 else members[:2]:  # calibrated: 0.85; seed 1 lacks two
                name = calibrated.calibrated_name(member, 1.2345e-3)
                records.append(_record(task, name, seed, 0.85, rng))
    meta = tmp_path / "meta.json"
    meta.write_text(json.dumps({"format": "autopelt-meta-dataset", "model": "second", "records": records,
                                "features": {t: FEATURES for t in tasks}}))
    assert second_model_loo.main(["--meta", str(meta), "--members", "4", "--out", str(tmp_path)]) == 0
    result = json.loads(next(tmp_path.glob("second-model-loo-*.json")).read_text())
    rows = {row["task"]: row for row in result["rows"]}
    assert set(rows) == {*tasks, "mean"} and all(rows[t]["seeds"] == 1 for t in tasks)
    assert rows["mean"]["minilm-cal"] == 85.0 and rows["mean"]["minilm-abs"] == 60.0
    assert rows["mean"]["own"] == 70.0 and rows["mean"]["tuned-lora"] == 70.0  # lora-r8-qv is no member here
    assert result["settings"]["portfolios"]["alpha"]["minilm"] == members
    assert "minilm-cal +15.00 from own (target: at most 0.5 below it: met)" in capsys.readouterr().out
    assert simulate.REFERENCE not in members  # the unit of a budget is the design's own trial

"""The meta-dataset's collector on a tiny model: a trial's record per epoch, resuming, and the pool's errors."""

from __future__ import annotations

import json
import random

import pytest
from tinymodels import sentence, tiny_model_dir  # noqa: F401  (a fixture)

from autopelt.errors import UserError
from autopelt.portfolio import collect as collector
from autopelt.portfolio.tasks import MetaTask, build_pool, read_pool


@pytest.fixture
def pool(tmp_path):
    rng = random.Random(0)
    source = tmp_path / "data" / "tasks" / "toy"
    source.mkdir(parents=True)
    for split, rows in (("train", 2100), ("validation", 60)):
        labels = [rng.choice(["good", "bad"]) for _ in range(rows)]
        text = "".join(json.dumps({"text": sentence(rng, word), "label": word}) + "\n" for word in labels)
        (source / f"{split}.jsonl").write_text(text)
    manifest = build_pool(tmp_path / "data", tmp_path / "pool", tasks=(MetaTask("toy", "tasks/toy", ("text",)),))
    assert manifest["toy"] == {"text_columns": ["text"], "label_names": ["bad", "good"], "train_rows": 2000,
                               "test_rows": 60}
    return tmp_path / "pool"


def test_a_trial_records_every_epoch_and_a_second_run_resumes(pool, tiny_model_dir, tmp_path):  # noqa: F811
    results = tmp_path / "trials.jsonl"
    jobs = collector.plan(["toy"], ["lora-r8-qv@3e-3"], [0])
    kwargs = dict(pool=str(pool), model=str(tiny_model_dir), device="cpu", precision="fp32", threads=1,
                  cache_dir=str(tmp_path / "cache"))
    assert collector.collect(jobs, results, say=lambda line: None, **kwargs) == 1
    record = json.loads(results.read_text())
    assert record["status"] == "ok" and len(record["epochs"]) == collector.EPOCHS
    assert all(set(e) == {"dev", "dev_loss", "test", "seconds"} for e in record["epochs"])
    assert [e["seconds"] for e in record["epochs"]] == sorted(e["seconds"] for e in record["epochs"])
    assert record["params"] > 0 and record["precision"] == "fp32"
    assert collector.collect(jobs, results, say=lambda line: None, **kwargs) == 0  # nothing left to run
    assert len(results.read_text().splitlines()) == 1


def test_a_folder_without_pool_json_is_one_line(tmp_path):
    with pytest.raises(UserError, match="not a meta-dataset pool"):
        read_pool(tmp_path)


def test_finish_with_the_pool_records_each_tasks_one_class_dev_metric(pool, tmp_path):
    from autopelt.portfolio.metadata import load
    from autopelt.portfolio.tasks import dev_rows

    results = tmp_path / "trials.jsonl"
    results.write_text(json.dumps({"task": "toy", "config": "lora-r8-qv@3e-3", "seed": 0, "status": "ok",
                                   "epochs": [{"dev": 0.9, "dev_loss": 0.3, "test": 0.9, "seconds": 1.0}]}) + "\n")
    collector.finish(results, tmp_path / "meta.json", {"model": "tiny"}, pool=pool)
    task, labels = dev_rows(pool, "toy")
    assert len(labels) == 1000
    majority = max((labels == c).mean() for c in (0, 1))
    assert load(tmp_path / "meta.json").header["floors"] == {"toy": pytest.approx(majority, abs=1e-5)}
    collector.finish(results, tmp_path / "plain.json", {"model": "tiny"})
    assert "floors" not in load(tmp_path / "plain.json").header

"""The meta-dataset's collector on a tiny model: a trial's record per epoch, resuming, and the pool's errors."""

from __future__ import annotations

import dataclasses
import json
import random

import numpy as np
import pytest
from tinymodels import sentence, tiny_model_dir  # noqa: F401  (a fixture)

from autopelt.errors import UserError
from metalearning import collect as collector
from metalearning.tasks import MetaTask, build_pool, read_pool


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
                               "test_rows": 60, "dev_size": 1000}
    return tmp_path / "pool"


def test_a_trial_records_every_epoch_and_a_second_run_resumes(pool, tiny_model_dir, tmp_path):  # noqa: F811
    results = tmp_path / "trials.jsonl"
    jobs = collector.plan(["toy"], ["lora-r8-qv@3e-3"], [0])
    kwargs = dict(pool=str(pool), model=str(tiny_model_dir), device="cpu", precision="fp32", threads=1,
                  cache_dir=str(tmp_path / "cache"))
    predictions = tmp_path / "predictions"
    assert collector.collect(jobs, results, say=lambda line: None, predictions_dir=predictions, **kwargs) == 1
    record = json.loads(results.read_text())
    kept = load_predictions(predictions / "toy", collector.prediction_file(jobs[0]))
    assert kept["dev"].shape == (1000, 2) and kept["test"].shape == (60, 2) and kept["dev"].dtype == np.float16
    assert np.allclose(kept["dev"].astype(np.float32).sum(axis=1), 1.0, atol=2e-3)
    kept_epoch = max(record["epochs"], key=lambda e: e["dev"])  # the first of equal dev values, as training keeps
    accuracy = (kept["test"].argmax(axis=1) == kept["test_labels"]).mean()
    assert accuracy == pytest.approx(kept_epoch["test"], abs=1e-4)  # the kept state's predictions
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
    from metalearning.metadata import load
    from metalearning.tasks import dev_rows

    results = tmp_path / "trials.jsonl"
    results.write_text(json.dumps({"task": "toy", "config": "lora-r8-qv@3e-3", "seed": 0, "status": "ok",
                                   "epochs": [{"dev": 0.9, "dev_loss": 0.3, "test": 0.9, "seconds": 1.0}]}) + "\n")
    collector.finish(results, tmp_path / "meta.json", {"model": "tiny"}, pool=pool)
    task, labels = dev_rows(pool, "toy")
    assert len(labels) == 1000
    majority = max((labels == c).mean() for c in (0, 1))
    header = load(tmp_path / "meta.json").header
    assert header["floors"] == {"toy": pytest.approx(majority, abs=1e-5)}
    assert header["features"]["toy"]["classes"] == 2 and header["features"]["toy"]["rows"] == 1000
    collector.finish(results, tmp_path / "plain.json", {"model": "tiny"})
    assert "floors" not in load(tmp_path / "plain.json").header


def load_predictions(folder, name):
    with np.load(folder / name) as data:
        return {key: data[key] for key in data.files}


def test_a_regression_task_pools_numbers_and_a_small_train_split_shrinks_dev(tmp_path):
    rng = random.Random(0)
    source = tmp_path / "data" / "tasks" / "score"
    source.mkdir(parents=True)
    for split, rows in (("train", 1500), ("validation", 40)):
        text = "".join(json.dumps({"text": sentence(rng, None), "label": round(rng.uniform(1, 5), 2)}) + "\n"
                       for _ in range(rows))
        (source / f"{split}.jsonl").write_text(text)
    task = MetaTask("score", "tasks/score", ("text",), regression=True)
    manifest = build_pool(tmp_path / "data", tmp_path / "pool", tasks=(task,))
    assert manifest["score"] == {"text_columns": ["text"], "train_rows": 1500, "test_rows": 40, "dev_size": 500,
                                 "regression": True}
    row = json.loads((tmp_path / "pool" / "score" / "train.jsonl").read_text().splitlines()[0])
    assert isinstance(row["label"], float)


def test_the_pipeline_command_lists_the_design_and_refuses_a_missing_pool_in_one_line(tmp_path, capsys):
    from metalearning.__main__ import main
    from metalearning.design import DESIGN

    assert main(["design"]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()] == [c.name for c in DESIGN]
    assert main(["collect", "--pool", str(tmp_path), "--results", str(tmp_path / "t.jsonl")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a meta-dataset pool" in err[0]
    assert not (tmp_path / "t.jsonl").exists()


def test_a_decoder_collects_the_design_as_its_classifier_runs_it(pool, tiny_model_dir, tmp_path, capsys):  # noqa: F811
    """On a Llama the head reads the last token (the design's mean pooling is for encoders) and a configuration
    it cannot take (BitFit: Llama has no biases) is left out in one line, not trained to fail."""
    from generationdata import make_tiny_lm_folder

    from metalearning.__main__ import main

    model = make_tiny_lm_folder(tmp_path / "llama")
    results = tmp_path / "trials.jsonl"
    assert main(["collect", "--pool", str(pool), "--results", str(results), "--model", str(model),
                 "--configs", "lora-r8-qv@3e-3,bitfit@3e-3", "--device", "cpu", "--precision", "fp32",
                 "--threads", "1", "--predictions", str(tmp_path / "predictions")]) == 0
    said = capsys.readouterr().out
    assert "reads the llama classifier's one token" in said and "left out" in said and "bitfit@3e-3" in said
    records = [json.loads(line) for line in results.read_text().splitlines()]
    assert [(r["config"], r["status"]) for r in records] == [("lora-r8-qv@3e-3", "ok")], records
    kept = load_predictions(tmp_path / "predictions" / "toy", "lora-r8-qv@3e-3@s0.npz")
    assert kept["dev"].shape == (1000, 2)
    adapted, _ = collector.for_model(["lora-r8-qv@3e-3"], str(model))
    assert adapted["lora-r8-qv@3e-3"].pooling == "cls"
    on_encoder, said = collector.for_model(["lora-r8-qv@3e-3", "bitfit@3e-3"], str(tiny_model_dir))
    assert said == "" and on_encoder["lora-r8-qv@3e-3"].pooling == "mean" and "bitfit@3e-3" in on_encoder


def test_calibrated_members_train_at_their_rate_times_the_swept_lora_rate_over_the_reference(pool, tmp_path):
    """`--calibrated-members`: after a seed's design, the first members the shipped portfolio runs on the task, each
    at its recorded rate x the rate LoRA's sweep chooses on that task's ladder / the portfolio's reference rate, on a
    decoder as its classifier reads; a seed without a ladder gets none."""
    from generationdata import make_tiny_lm_folder

    from autopelt.models import load_tokenizer
    from autopelt.portfolio.portfolio import SHIPPED
    from autopelt.portfolio.portfolio import load as load_portfolio
    from metalearning import calibrated, prior
    from metalearning.__main__ import main

    model = make_tiny_lm_folder(tmp_path / "llama")
    results = tmp_path / "trials.jsonl"
    ladder = "lora-r8-qv@1e-3,lora-r8-qv@3e-3,lora-r8-qv@1e-2"
    assert main(["collect", "--pool", str(pool), "--results", str(results), "--model", str(model), "--configs",
                 ladder, "--calibrated-members", "1", "--device", "cpu", "--precision", "fp32", "--threads", "1"]) == 0
    records = [json.loads(line) for line in results.read_text().splitlines()]
    swept = calibrated.lora_rate(records, "toy", 0)
    assert swept in (1e-3, 3e-3, 1e-2)
    features = prior.task_features(pool, load_tokenizer(str(model)))["toy"]
    live = dataclasses.replace(load_portfolio(SHIPPED), calibrate=True).for_task(features)[0]  # --rates calibrated
    assert live.reference_rate != load_portfolio(SHIPPED).reference_rate  # over the members' tasks, not all 21
    first = live.members[0]  # toy is no MiniLM task: the prior without it is the shipped one
    assert [m.name for m in calibrated.minilm_portfolio("toy", features).members] == [m.name for m in live.members]
    expected = first.learning_rate * swept / live.reference_rate
    assert [r["config"] for r in records[3:]] == [calibrated.calibrated_name(first.name, expected)]
    assert records[3]["status"] == "ok" and calibrated.member_of(records[3]["config"]) == first.name
    jobs, configs, skipped = calibrated.jobs(results, pool, str(model), ["toy"], 0, 2)
    assert [j.config for j in jobs][:1] == [records[3]["config"]] and not skipped
    assert all(c.pooling == "cls" for c in configs.values())
    assert configs[records[3]["config"]].learning_rate == pytest.approx(expected)
    assert calibrated.jobs(results, pool, str(model), ["toy"], 1, 2)[2] == ["toy"]  # seed 1: no ladder yet

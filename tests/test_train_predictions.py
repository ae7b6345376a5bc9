"""A trial's kept predictions and its classifier head's rate scale."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from tinymodels import make_settings, sst2_dir, tiny_model_dir, trial_cache  # noqa: F401  (fixtures)

from autopelt.errors import UserError
from autopelt.train import run_trial
from autopelt.train import predictions as kept
from autopelt.train.loop import parameter_groups


def test_a_trial_keeps_its_dev_and_test_predictions_beside_its_result(make_settings, tmp_path):  # noqa: F811
    result = run_trial(make_settings(epochs=1, keep_predictions=True,
                                     out_dir=str(tmp_path / "trial")))
    assert result["status"] == "ok", result.get("reason")
    saved = kept.load(tmp_path / "trial")
    assert set(saved) == {"dev", "dev_labels", "test", "test_labels"}
    assert saved["dev"].dtype == np.float16 and saved["dev"].shape[1] == 2
    test_accuracy = (saved["test"].argmax(axis=1) == saved["test_labels"]).mean()
    assert test_accuracy == pytest.approx(result["test"]["accuracy"], abs=1e-6)
    assert "predictions" not in json.loads((tmp_path / "trial" / "result.json").read_text())
    assert "predictions" not in result  # on disk: a search worker sends no arrays back


def test_compact_keeps_the_top_classes_and_spreads_the_rest():
    rng = np.random.default_rng(0)
    probabilities = rng.dirichlet(np.ones(40), size=5).astype(np.float16)
    indices, values = kept.compact(probabilities, 4)
    dense = kept.expand(indices, values, 40)
    assert np.allclose(dense.sum(axis=1), 1.0, atol=1e-2)
    assert (dense.argmax(axis=1) == probabilities.astype(np.float32).argmax(axis=1)).all()
    stored = kept.compact_many({"dev": probabilities, "dev_labels": np.arange(5)}, max_classes=16, k=4)
    assert set(stored) == {"dev_indices", "dev_values", "dev_classes", "dev_labels"}
    assert np.array_equal(kept.dense(stored, "dev"), dense)


def test_a_missing_or_corrupt_predictions_file_is_one_line(tmp_path):
    with pytest.raises(UserError, match="kept no predictions"):
        kept.load(tmp_path)
    (tmp_path / kept.PREDICTIONS_FILE).write_bytes(b"not a zip")
    with pytest.raises(UserError, match="not a readable predictions file"):
        kept.load(tmp_path)


def test_the_head_trains_at_its_scaled_rate(make_settings, tiny_model_dir):  # noqa: F811
    from autopelt.models import load_model
    from autopelt import delta

    model = load_model(str(tiny_model_dir), 2, "single_label_classification", seed=0)
    delta.apply_delta(model, delta.parse_spec({"methods": [{"method": "lora", "rank": 4}]}), seed=0)
    groups = parameter_groups(model, make_settings(learning_rate=1e-3, head_lr_scale=10.0))
    assert len(groups) == 2 and groups[1]["lr"] == pytest.approx(1e-2) and "lr" not in groups[0]
    head = {id(p) for p in model.classifier.parameters()}
    assert {id(p) for p in groups[1]["params"]} == head and not head & {id(p) for p in groups[0]["params"]}
    plain = parameter_groups(model, make_settings(learning_rate=1e-3))
    assert len(plain) == 1 and len(plain[0]["params"]) == sum(len(g["params"]) for g in groups)
    with pytest.raises(UserError, match="head_lr_scale"):
        make_settings(head_lr_scale=0)
    assert torch.is_tensor(groups[1]["params"][0])


def test_kept_dev_predictions_are_the_kept_evaluations_outputs_with_no_extra_pass(make_settings, tmp_path,  # noqa: F811
                                                                                  monkeypatch):
    from autopelt.train import classify, trial

    passes = []
    real = classify.forward_split
    counting = lambda model, features, *a, **k: passes.append(len(features.labels)) or real(model, features, *a, **k)  # noqa: E731
    monkeypatch.setattr(classify, "forward_split", counting)
    monkeypatch.setattr(trial, "forward_split", counting)
    result = run_trial(make_settings(epochs=3, keep_predictions=True, out_dir=str(tmp_path / "trial")))
    assert result["status"] == "ok", result.get("reason")
    assert len(passes) == 3 + 1  # a dev evaluation an epoch, then test: no pass for the predictions
    saved = kept.load(tmp_path / "trial")
    dev_accuracy = (saved["dev"].argmax(axis=1) == saved["dev_labels"]).mean()
    assert dev_accuracy == pytest.approx(result["dev_metric"], abs=1e-6)  # the kept (best) evaluation's
    # and what the saved delta predicts on dev, loaded again
    import autopelt
    from autopelt.train import TrialSettings
    from autopelt.train.trial_data import prepare_data, resolve_task

    settings = TrialSettings.from_dict(result["settings"])
    task = resolve_task(settings)
    data = prepare_data(settings, autopelt.models.load_tokenizer(result["model"]), task)
    model = autopelt.load(result["model"], result["delta_dir"])
    fresh = kept.from_outputs(real(model, data.dev, settings, torch.device("cpu")), regression=False)
    np.testing.assert_allclose(saved["dev"].astype(np.float32), fresh.astype(np.float32), atol=2e-3)

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

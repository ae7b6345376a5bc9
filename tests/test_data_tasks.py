"""Every GLUE task's schema, the metrics against hand-computed numbers, custom tasks, task errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from autopelt.data.tasks import GLUE_TASKS, custom_task, get_task
from autopelt.errors import UserError

# name -> (text columns, num_labels, regression, main metric, test split, local folder)
EXPECTED = {
    "cola": (("sentence",), 2, False, "matthews_correlation", "validation", "cola"),
    "sst2": (("sentence",), 2, False, "accuracy", "validation", "sst2"),
    "mrpc": (("sentence1", "sentence2"), 2, False, "accuracy", "validation", "mrpc"),
    "qqp": (("question1", "question2"), 2, False, "accuracy", "validation", "qqp"),
    "stsb": (("sentence1", "sentence2"), 1, True, "pearson", "validation", "stsb"),
    "mnli": (("premise", "hypothesis"), 3, False, "accuracy", "validation_matched", "mnli"),
    "mnli-mm": (("premise", "hypothesis"), 3, False, "accuracy", "validation_mismatched", "mnli"),
    "qnli": (("question", "sentence"), 2, False, "accuracy", "validation", "qnli"),
    "rte": (("sentence1", "sentence2"), 2, False, "accuracy", "validation", "rte"),
    "wnli": (("sentence1", "sentence2"), 2, False, "accuracy", "validation", "wnli"),
}


def test_every_glue_task_is_declared():
    assert set(GLUE_TASKS) == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_task_schema(name):
    task = get_task(name)
    columns, num_labels, regression, metric, test_split, folder = EXPECTED[name]
    assert (task.text_columns, task.num_labels, task.regression) == (columns, num_labels, regression)
    assert (task.metric, task.test_split, task.dataset, task.train_split) == (metric, test_split, folder, "train")
    assert task.hub_path == "nyu-mll/glue"
    assert len(task.label_names) == (0 if regression else num_labels)
    assert task.problem_type == ("regression" if regression else "single_label_classification")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_main_metric_is_in_the_metrics_and_perfect_predictions_score_one(name):
    task = get_task(name)
    labels = np.array([0.5, 1.0, 2.5, 4.0]) if task.regression else np.arange(8) % task.num_labels
    scores = task.compute_metrics(labels, labels)
    assert scores[task.metric] == pytest.approx(1.0)


def test_label_names_follow_the_hub():
    assert get_task("rte").label_names == ("entailment", "not_entailment")
    assert get_task("mnli").label_names == ("entailment", "neutral", "contradiction")
    assert get_task("mrpc").label_names[1] == "equivalent"
    assert get_task("wnli").label_names == ("not_entailment", "entailment")


def test_accuracy_by_hand():
    # 3 of 4 right
    assert get_task("sst2").compute_metrics([0, 1, 1, 0], [0, 1, 0, 0]) == {"accuracy": 0.75}


def test_accuracy_from_logits():
    logits = torch.tensor([[2.0, 0.1, 0.0], [0.0, 0.0, 3.0], [0.0, 1.0, 0.0]])  # argmax 0, 2, 1
    assert get_task("mnli").compute_metrics(logits, torch.tensor([0, 2, 2]))["accuracy"] == pytest.approx(2 / 3)


@pytest.mark.parametrize("name", ["mrpc", "qqp"])
def test_accuracy_and_f1_by_hand(name):
    # TP=2 FP=1 FN=1 TN=1: precision = recall = 2/3 so F1 = 2/3; accuracy 3/5
    scores = get_task(name).compute_metrics([1, 1, 0, 0, 1], [1, 0, 0, 1, 1])
    assert scores["accuracy"] == pytest.approx(0.6)
    assert scores["f1"] == pytest.approx(2 / 3)
    assert scores["combined_score"] == pytest.approx((0.6 + 2 / 3) / 2)


def test_matthews_by_hand():
    # TP=1 FP=1 TN=2 FN=0: (1*2 - 1*0) / sqrt((1+1)(1+0)(2+1)(2+0)) = 2 / sqrt(12)
    scores = get_task("cola").compute_metrics([1, 1, 0, 0], [1, 0, 0, 0])
    assert scores["matthews_correlation"] == pytest.approx(2 / math.sqrt(12))


def test_pearson_and_spearman_by_hand():
    # deviations x: -1.5 -.5 .5 1.5, y: -1.75 -.75 .25 2.25 -> r = 6.5 / sqrt(5 * 8.75); ranks agree -> rho = 1
    scores = get_task("stsb").compute_metrics(torch.tensor([[1.0], [2.0], [3.0], [4.0]]), [1.0, 2.0, 3.0, 5.0])
    assert scores["pearson"] == pytest.approx(6.5 / math.sqrt(43.75))
    assert scores["spearman"] == pytest.approx(1.0)
    assert scores["combined_score"] == pytest.approx((6.5 / math.sqrt(43.75) + 1.0) / 2)


def test_constant_regression_scores_zero_not_nan():
    scores = get_task("stsb").compute_metrics([2.0, 2.0, 2.0], [1.0, 3.0, 5.0])
    assert scores == {"pearson": 0.0, "spearman": 0.0, "combined_score": 0.0}


@pytest.mark.parametrize("alias, name", [("SST-2", "sst2"), ("sts-b", "stsb"), ("mnli_mismatched", "mnli-mm"),
                                         ("MNLI-M", "mnli"), (" rte ", "rte")])
def test_aliases(alias, name):
    assert get_task(alias) is GLUE_TASKS[name]


def test_unknown_task_is_one_line_listing_valid_tasks():
    with pytest.raises(UserError) as raised:
        get_task("glu")
    message = str(raised.value)
    assert "\n" not in message and "'glu'" in message
    assert all(name in message for name in EXPECTED)


def test_custom_classification_with_label_names():
    task = custom_task("reviews", "text", label_column="stars", label_names=["bad", "ok", "good"])
    assert (task.text_columns, task.num_labels, task.regression, task.hub_path) == (("text",), 3, False, None)
    assert task.columns == ("text", "stars")
    assert [task.encode_label(v) for v in ["good", "0", 1, 2.0]] == [2, 0, 1, 2]
    # 2 of 3 right; per-class F1 = 1 (bad), 0 (ok: FN), 2/3 (good: 1 TP, 1 FP) -> macro 5/9
    scores = task.compute_metrics([0, 2, 2], [0, 1, 2])
    assert scores == pytest.approx({"accuracy": 2 / 3, "f1_macro": 5 / 9})


def test_custom_pair_regression():
    task = custom_task("similarity", ["a", "b"], label_column="score", regression=True)
    assert (task.num_labels, task.metric, task.problem_type) == (1, "pearson", "regression")
    assert task.encode_label("3.5") == 3.5


@pytest.mark.parametrize("kwargs", [
    dict(text_columns=["a", "b", "c"], num_labels=2),
    dict(text_columns="a"),
    dict(text_columns="a", num_labels=1),
    dict(text_columns="a", num_labels=3, label_names=["x", "y"]),
    dict(text_columns="a", regression=True, num_labels=2),
])
def test_custom_task_errors(kwargs):
    with pytest.raises(UserError):
        custom_task("mine", **kwargs)


@pytest.mark.parametrize("bad", [2, -2, 0.5, "maybe", None])
def test_bad_class_label_is_a_user_error(bad):
    with pytest.raises(UserError, match="rte"):
        get_task("rte").encode_label(bad)


def test_unlabelled_marker_is_kept():
    assert get_task("rte").encode_label(-1) == -1

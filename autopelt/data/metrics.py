"""GLUE metrics from scikit-learn and scipy, so scoring never reaches the hub.

Every function takes predictions (class ids, or scores for regression) and gold labels as 1-D arrays and
returns {metric name: float}. All metrics are "higher is better", so a search can always maximise.
"""

from __future__ import annotations

import warnings

import numpy as np

# scikit-learn and scipy are imported by the functions that use them: a task (and with it a search's offline
# check) is then known without their seconds of import time.


def accuracy(predictions, labels) -> dict[str, float]:
    """Accuracy: the fraction of predictions equal to the label."""
    from sklearn.metrics import accuracy_score

    return {"accuracy": float(accuracy_score(labels, predictions))}


def accuracy_and_f1(predictions, labels) -> dict[str, float]:
    """MRPC/QQP: accuracy, F1 of the positive class (1), and their mean as GLUE averages them."""
    from sklearn.metrics import accuracy_score, f1_score

    acc = float(accuracy_score(labels, predictions))
    f1 = float(f1_score(labels, predictions, pos_label=1, average="binary", zero_division=0))
    return {"accuracy": acc, "f1": f1, "combined_score": (acc + f1) / 2}


def accuracy_and_macro_f1(predictions, labels) -> dict[str, float]:
    """A user's classification task: accuracy and macro-averaged F1 (robust to label imbalance)."""
    from sklearn.metrics import accuracy_score, f1_score

    f1 = f1_score(labels, predictions, average="macro", zero_division=0)
    return {"accuracy": float(accuracy_score(labels, predictions)), "f1_macro": float(f1)}


def matthews(predictions, labels) -> dict[str, float]:
    """CoLA: Matthews correlation coefficient (0 when either side is constant)."""
    from sklearn.metrics import matthews_corrcoef

    return {"matthews_correlation": float(matthews_corrcoef(labels, predictions))}


def pearson_and_spearman(predictions, labels) -> dict[str, float]:
    """STS-B: Pearson and Spearman correlation and their mean; a constant side counts as 0, not NaN."""
    from scipy import stats

    pearson = _correlation(stats.pearsonr, predictions, labels)
    spearman = _correlation(stats.spearmanr, predictions, labels)
    return {"pearson": pearson, "spearman": spearman, "combined_score": (pearson + spearman) / 2}


def _correlation(function, predictions, labels) -> float:
    predictions = np.asarray(predictions, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.float64)
    # An untrained regressor can predict a constant; NaN would poison a maximising search, 0 is "no signal".
    if len(labels) < 2 or np.ptp(predictions) == 0 or np.ptp(labels) == 0:
        return 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        value = float(function(predictions, labels)[0])
    return 0.0 if np.isnan(value) else value

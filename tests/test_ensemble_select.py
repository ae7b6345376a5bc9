"""Greedy ensemble selection with replacement (Caruana et al. 2004) on constructed dev predictions."""

from __future__ import annotations

import numpy as np
import pytest

from autopelt.ensemble.select import Rule, accuracy, answers, combine, limit, pearson, select
from autopelt.errors import UserError


def _binary(p_right, labels):
    """(rows, 2) probabilities giving each row's label the probability p_right."""
    p = np.asarray(p_right, dtype=np.float32)
    out = np.stack([1 - p, p], axis=1)
    return np.where(np.asarray(labels)[:, None] == 1, out, out[:, ::-1])


def test_three_members_wrong_on_different_rows_make_a_perfect_ensemble():
    labels = np.array([0, 1, 0, 1, 0, 1])
    members = []
    for wrong in range(3):  # member i is wrong (0.4 on the label) on rows 2i, 2i+1, sure (0.9) elsewhere
        p = np.full(6, 0.9)
        p[2 * wrong: 2 * wrong + 2] = 0.4
        members.append(_binary(p, labels))
    chosen = select(members, labels, Rule(max_size=5))
    assert [accuracy(m, labels) for m in members] == pytest.approx([4 / 6] * 3)
    assert chosen.dev == 1.0 and chosen.single_dev == pytest.approx(4 / 6) and chosen.gain > 0.3
    assert len(chosen.members) == 2 and chosen.weights.sum() == pytest.approx(1.0)  # two already cover every row


def test_replacement_picks_a_member_twice_when_two_to_one_beats_one_to_one():
    labels = np.array([1, 1])
    a = _binary([0.9, 0.4], labels)  # right on row 0 only
    b = _binary([0.05, 0.9], labels)  # right on row 1 only; 1:1 is wrong on row 0, 2:1 right on both
    assert accuracy(combine([a, b], [0.5, 0.5]), labels) == 0.5
    best = select([a, b], labels, Rule(max_size=3, stop="best"))
    assert best.weights.tolist() == pytest.approx([2 / 3, 1 / 3]) and best.dev == 1.0
    assert best.climb == (0.5, 0.5, 1.0)
    early = select([a, b], labels, Rule(max_size=3, stop="no_gain"))  # the second step gains nothing: stop there
    assert early.weights.tolist() == [1.0, 0.0] and early.dev == 0.5


def test_best_prefix_keeps_the_smaller_ensemble_on_ties():
    labels = np.array([1, 0, 1])
    only = _binary([0.9, 0.8, 0.7], labels)
    chosen = select([only, only * 1.0], labels, Rule(max_size=6))
    assert chosen.members == [0] and len(chosen.climb) == 6  # climbed to 6, kept the first


def test_regression_averages_values_and_beats_each_noisy_member():
    rng = np.random.default_rng(0)
    truth = rng.normal(size=400)
    members = [truth + rng.normal(scale=1.0, size=400) for _ in range(4)]
    chosen = select(members, truth, Rule(max_size=8), regression=True)
    assert len(chosen.members) >= 3 and chosen.dev > max(pearson(m, truth) for m in members) + 0.05
    from autopelt.data import metrics

    assert pearson(members[0], truth) == pytest.approx(metrics.pearson_and_spearman(members[0], truth)["pearson"])


def test_accuracy_is_the_tasks_own_metric():
    from autopelt.data import get_task

    rng = np.random.default_rng(1)
    probabilities = rng.dirichlet([1, 1], size=50)
    labels = rng.integers(0, 2, size=50)
    assert accuracy(probabilities, labels) == get_task("sst2").compute_metrics(probabilities, labels)["accuracy"]


def test_bagging_is_seeded_and_its_weights_sum_to_one():
    rng = np.random.default_rng(2)
    labels = rng.integers(0, 3, size=200)
    members = [rng.dirichlet([1, 1, 1], size=200) for _ in range(8)]
    one = select(members, labels, Rule(max_size=5, bags=6, seed=3))
    two = select(members, labels, Rule(max_size=5, bags=6, seed=3))
    assert one.weights.tolist() == two.weights.tolist() and one.weights.sum() == pytest.approx(1.0)
    assert select(members, labels, Rule(max_size=5, bags=6, seed=4)).weights.tolist() != one.weights.tolist()


def test_limit_keeps_the_heaviest_members_and_the_margin_rule():
    labels = np.array([1, 1])
    a, b = _binary([0.9, 0.4], labels), _binary([0.05, 0.9], labels)
    chosen = select([a, b], labels, Rule(max_size=3))
    one = limit(chosen, [a, b], labels, 1)
    assert one.members == [0] and one.dev == 0.5
    assert answers(chosen, margin=0.25) and not answers(chosen, margin=0.5) and not answers(one, margin=-1.0)


def test_bad_candidates_are_one_line_errors():
    with pytest.raises(UserError, match="no candidates"):
        select([], np.array([1]))
    with pytest.raises(UserError, match="differ in shape"):
        select([np.zeros((2, 2)), np.zeros((2, 3))], np.array([0, 1]))
    with pytest.raises(UserError, match="dev labels"):
        select([np.zeros((2, 2))], np.array([0, 1, 1]))
    with pytest.raises(UserError, match="stop rule"):
        Rule(stop="never")

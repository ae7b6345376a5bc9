"""The task-aware prior: meta-features read from training rows, and portfolios learned from the nearest tasks."""

from __future__ import annotations

import pytest

from autopelt.portfolio import select
from autopelt.portfolio.config import Config
from autopelt.portfolio.metafeatures import MetaFeatures, compute
from autopelt.portfolio.portfolio import SHIPPED, load
from autopelt.portfolio.prior import Prior, unlike_threshold


def test_meta_features_count_classes_pairs_words_and_imbalance():
    rows = [{"a": "one two three", "b": "four", "label": "x"}] * 3 + [{"a": "five", "b": "six", "label": "y"}]
    found = compute(rows, ["a", "b"], "label", regression=False, train_rows=2)
    assert (found.classes, found.rows, found.pair, found.regression) == (2, 2, True, False)
    assert found.mean_tokens == pytest.approx((4 * 3 + 2) / 4)  # whitespace words of both texts, without a tokenizer
    assert 0 < found.imbalance < 1  # 3:1 is neither balanced (0) nor one class (1)
    balanced = compute([{"t": "a", "label": i % 2} for i in range(10)], ["t"], "label", regression=False)
    assert balanced.imbalance == 0.0 and not balanced.pair
    scores = compute([{"t": "a b", "label": 1.5}, {"t": "c", "label": 2.0}], ["t"], "label", regression=True)
    assert (scores.classes, scores.regression, scores.imbalance) == (1, True, 0.0)


def _features(classes, tokens=10.0, pair=False, regression=False):
    return MetaFeatures(classes=classes, rows=1000, mean_tokens=tokens, pair=pair, regression=regression,
                        imbalance=0.0)


def _prior(k: int) -> Prior:
    tasks = {"binary-a": _features(2), "binary-b": _features(2, 12), "many-a": _features(64), "many-b": _features(150),
             "pair": _features(2, 40, pair=True)}
    # "low" wins the binary tasks, "high" the many-class ones, "mid" is second everywhere
    scores = {t: {"low": 0.9, "high": 0.5, "mid": 0.8} for t in ("binary-a", "binary-b", "pair")}
    scores.update({t: {"low": 0.3, "high": 0.9, "mid": 0.7} for t in ("many-a", "many-b")})
    configs = {name: Config(name, ({"method": "lora"},), rate) for name, rate in
               (("low", 1e-3), ("high", 1e-2), ("mid", 3e-3))}
    return Prior(k=k, tasks=tasks, scores=scores, configs=configs, unlike=unlike_threshold(tasks))


def test_the_nearest_tasks_choose_the_portfolio_and_an_unlike_task_gets_the_global_one():
    prior = _prior(k=2)
    members, nearest, like = prior.portfolio(_features(100), size=1)
    assert like and {name for name, _ in nearest} == {"many-a", "many-b"} and members[0].name == "high"
    members, nearest, like = prior.portfolio(_features(2, 11), size=1)
    assert like and {name for name, _ in nearest} == {"binary-a", "binary-b"} and members[0].name == "low"
    # a regression is unlike all of them (the flag does not vary there, so it is not used), but its length is
    far = _features(2, 5000)
    members, nearest, like = prior.portfolio(far, size=3)
    assert not like and len(nearest) == 5  # every task: the global portfolio
    assert [m.name for m in members] == select.greedy_portfolio(prior.scores, 3)


def test_a_prior_survives_its_file(tmp_path):
    from autopelt.portfolio.portfolio import _member

    prior = _prior(k=3)
    again = Prior.from_dict(prior.to_dict(), _member)
    assert again.k == 3 and again.tasks == prior.tasks and again.scores == prior.scores
    assert again.unlike == pytest.approx(prior.unlike, abs=1e-4)
    assert [c.learning_rate for c in again.configs.values()] == [1e-3, 1e-2, 3e-3]


def test_the_shipped_prior_gives_a_many_class_task_the_head_rate_configurations():
    portfolio, line = load(SHIPPED).for_task(_features(77, tokens=12))
    assert any(member.head_lr_scale > 1 for member in portfolio.members[:3]), [m.name for m in portfolio.members]
    assert "its portfolio is learned from those" in line and "77 classes" in line

"""Budgets as users write them: `--budget 20 | 90s | 2h`, `--max-params 0.5% | 100k | 2M | 12345`."""

import pytest

from autopelt.errors import UserError
from autopelt.search.budget import (
    ParamLimit, TimeBudget, TrialBudget, format_count, format_duration, parse_budget, parse_max_params,
)


@pytest.mark.parametrize("text, expected", [
    ("20", TrialBudget(20)), (7, TrialBudget(7)), ("90s", TimeBudget(90)), ("30m", TimeBudget(1800)),
    ("2h", TimeBudget(7200)), ("1.5h", TimeBudget(5400)), (" 2H ", TimeBudget(7200)), ("1d", TimeBudget(86400)),
])
def test_budget_is_a_trial_count_or_a_wall_time(text, expected):
    assert parse_budget(text) == expected


@pytest.mark.parametrize("text", ["0", "0s", "-3", "ten", "2 hours", "", "1.5"])
def test_bad_budgets_are_user_errors(text):
    with pytest.raises(UserError, match="--budget"):
        parse_budget(text)


@pytest.mark.parametrize("text, expected", [
    ("0.5%", ParamLimit(percent=0.5)), ("100k", ParamLimit(count=100_000)), ("2M", ParamLimit(count=2_000_000)),
    ("12345", ParamLimit(count=12345)), ("1.5m", ParamLimit(count=1_500_000)), ("12_345", ParamLimit(count=12345)),
    (None, None), ("", None),
])
def test_max_params_is_a_share_or_a_count(text, expected):
    assert parse_max_params(text) == expected


@pytest.mark.parametrize("text", ["0%", "101%", "abc%", "0", "-5k", "5x", "1e5"])
def test_bad_max_params_are_user_errors(text):
    with pytest.raises(UserError, match="--max-params"):
        parse_max_params(text)


def test_param_limit_says_why_a_delta_is_over():
    assert ParamLimit(count=1000).excess(stored=1000, base=10**6) is None
    assert "1.5k stored parameters > --max-params 1k" == ParamLimit(count=1000).excess(1500, 10**6)
    assert ParamLimit(percent=0.5).excess(stored=5000, base=10**6) is None
    assert ParamLimit(percent=0.5).excess(stored=5001, base=10**6).startswith("0.5001% stored")


def test_formats():
    assert [format_count(n) for n in (999, 12345, 2_000_000)] == ["999", "12.3k", "2M"]
    assert [format_duration(s) for s in (7.2, 125, 3725)] == ["7s", "2m05s", "1h02m"]

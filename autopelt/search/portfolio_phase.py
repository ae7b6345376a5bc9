"""The portfolio's place in a search: its members are queued first (after the baselines), in order, once per
study, each tagged with its name and rank; early stopping (ASHA) makes successive halving of them, except the
first, which always trains to the end. The sampler then draws, and learns from every finished trial.
"""

from __future__ import annotations

from typing import Callable

import optuna
from autopelt.search.claims import ALIVE
from autopelt.study.record import attrs, portfolio_of


def enqueue_missing(study: optuna.Study, members, params_of: Callable) -> list[str]:
    """Queue each member that no trial is queued, running or trained for (one that failed in an earlier run runs
    again, ahead of the sampler); the names queued."""
    have = {portfolio_of(t).get("name") for t in study.get_trials(deepcopy=False) if t.state in ALIVE}
    queued = []
    for rank, member in enumerate(members):
        if member.name in have:
            continue
        params = params_of(member)
        tag = {"name": member.name, "rank": rank, **({"drawn": True} if params is not None else {})}
        study.enqueue_trial(params or {}, user_attrs=attrs(portfolio=tag))
        queued.append(member.name)
    return queued


def member_params(plan, member) -> dict | None:
    """The space's parameters that draw a portfolio member (so the sampler learns from it), or None."""
    params = plan.space.params_for(member.spec(plan.num_layers), plan.num_layers)
    if params is not None and "batch_size" in params:
        params["batch_size"] = member.batch_size
    return params


def spec_and_hparams(plan, tag: dict) -> tuple[dict, dict]:
    """What a queued member trains: its spec for this model and its recorded rate, batch and backbone dropout (a
    leader's variant, tagged with a `factor`, is set at that factor of the rate by rate_policy.decide)."""
    from autopelt.errors import UserError

    members = {m.name: (i, m) for i, m in enumerate(plan.portfolio.members)} if plan.portfolio else {}
    if tag.get("name") not in members:
        raise UserError(f"portfolio member {tag.get('name')!r} was queued by another portfolio; resume with the "
                        "same --portfolio")
    index, member = members[tag["name"]]
    return member.spec(plan.num_layers), plan.portfolio.hparams(index, plan.epochs)

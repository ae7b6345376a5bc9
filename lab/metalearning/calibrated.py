"""The shipped portfolio's members at calibrated rates on another model: what `autopelt search --rates calibrated`
trains there, collected beside the design, so that leave-one-task-out on that model can compare its own portfolio
with MiniLM's at calibrated and at absolute rates.

On each task and seed, LoRA's rate is the one its sweep chooses on the design's LoRA ladder collected there
(`simulate.tuned_lora`, as `build.calibration` reads it for the portfolio file). The members are MiniLM's: the first
N that the shipped prior (its k) built from MiniLM's meta-dataset without that task chooses for the task's
meta-features, measured with the model's tokenizer (`minilm_portfolio`: MiniLM's portfolio held out as the other
model's own is). Each trains at its recorded rate x that LoRA rate / the reference rate, LoRA's on MiniLM over
the tasks the members were chosen from (`autopelt.search.rate_policy.portfolio_rate` after `Portfolio.for_task`, as a search with
`--rates calibrated` computes it), read as the model's family reads it (`space_models.configuration_for_model`). A
configuration is named `MEMBER~cal@RATE` (the rate to 3 significant digits): each task and seed has its own, and
the same name on two tasks is no configuration of the design (`MetaDataset.candidates` leaves such names out).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from metalearning.metadata import CALIBRATED as SUFFIX


def calibrated_name(member: str, rate: float) -> str:
    return f"{member}{SUFFIX}{float(f'{rate:.3g}'):g}"


def member_of(name: str) -> str | None:
    """The member a calibrated configuration's name was made from; None for any other name."""
    member, found, _ = name.partition(SUFFIX)
    return member if found else None


def lora_rate(records: list[dict], task: str, seed: int) -> float | None:
    """The rate LoRA's sweep chooses on `task` at `seed` from the ladder in `records`; None without the ladder."""
    from metalearning import simulate
    from metalearning.metadata import MetaDataset

    meta = MetaDataset({}, tuple(r for r in records if r["task"] == task and r["seed"] == seed))
    try:
        chosen = simulate.tuned_lora(simulate.Task(meta, task, seed=seed)).config
    except (ValueError, TypeError, AttributeError):  # no ladder (or no reference trial) collected there yet
        return None
    return float(chosen.partition("@")[2])


def minilm_portfolio(task: str, features):
    """MiniLM's portfolio as a search on a task of `features` runs it with `--rates calibrated`, its prior built as
    the shipped one (its k) from MiniLM's meta-dataset without `task`: the members chosen for the task, and the
    reference rate over the tasks they were chosen from (`Portfolio.for_task`)."""
    from autopelt.portfolio.portfolio import SHIPPED
    from autopelt.portfolio.portfolio import load as load_portfolio
    from metalearning import metadata, prior

    meta = metadata.shipped()
    shipped = load_portfolio(SHIPPED)
    others = [t for t in meta.tasks if t != task]
    k = shipped.prior.k if shipped.prior else len(others)
    held_out = dataclasses.replace(shipped, prior=prior.build(meta, prior.features_of(meta), k, others),
                                   calibrate=True)
    return held_out.for_task(features)[0]


def jobs(results: str | Path, pool: str | Path, model: str, tasks: list[str], seed: int,
         members: int) -> tuple[list, dict, list[str]]:
    """(collect.Job list, {name: Config} of the calibrated members, the tasks skipped for want of a LoRA ladder) at
    `seed`: the first `members` of MiniLM's portfolio for each task (`minilm_portfolio`), at their calibrated
    rates."""
    from transformers import AutoConfig

    from autopelt.models import load_tokenizer
    from autopelt.search.rate_policy import portfolio_rate
    from autopelt.search.space_models import configuration_for_model
    from metalearning import prior
    from metalearning.collect import Job

    path = Path(results)
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    features = prior.task_features(pool, load_tokenizer(model))
    model_config = AutoConfig.from_pretrained(model)
    out, configs, skipped = [], {}, []
    for task in tasks:
        rate = lora_rate(records, task, seed)
        if rate is None:
            skipped.append(task)
            continue
        portfolio = minilm_portfolio(task, features[task])
        for member in portfolio.members[:members]:
            calibrated, _ = portfolio_rate(portfolio, member.learning_rate, rate)
            name = calibrated_name(member.name, calibrated)
            config = configuration_for_model(dataclasses.replace(member, name=name, learning_rate=calibrated),
                                             model_config)
            if config is not None:
                configs[name] = config
                out.append(Job(task, name, seed))
    return out, configs, skipped

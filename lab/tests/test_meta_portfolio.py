"""The meta-dataset's portfolio: the leave-one-task-out simulation, the shipped meta-dataset against the design and the shipped portfolio, the learned baseline rate."""
from __future__ import annotations

import random
from pathlib import Path

import pytest
from support import benches

from autopelt.portfolio import select
from metalearning import metadata, prior, simulate
from metalearning import build as meta_build
from metalearning.design import BY_NAME, DESIGN
from autopelt.portfolio.portfolio import SHIPPED, load

ROOT = Path(__file__).resolve().parents[2]


def _run(task, config, seed, devs, tests=None):
    """A trial of one second an epoch with these dev metrics per epoch (tests: the same, unless given)."""
    tests = tests or devs
    return {"task": task, "config": config, "seed": seed, "status": "ok",
            "epochs": [{"dev": d, "test": t, "seconds": float(e + 1)} for e, (d, t) in enumerate(zip(devs, tests))]}


def test_random_search_with_halving_stops_a_late_bloomer_that_full_fidelity_draws_keep():
    """Successive halving (as ASHA runs random search) keeps a third of the draws past the first epoch; a
    configuration last after one epoch and best after three is then found only when it is drawn first."""
    others = [_run("t", f"c{i}", 0, [0.7, 0.7, 0.7]) for i in range(5)]
    records = [_run("t", simulate.REFERENCE, 0, [0.6, 0.6, 0.6]), _run("t", "late", 0, [0.1, 0.5, 0.9]), *others]
    task = simulate.Task(metadata.MetaDataset({}, tuple(records)), "t")
    configs = [r["config"] for r in records]
    everything = 100.0  # full-trial equivalents: every draw trained to full fidelity
    assert simulate.random_search(task, configs, everything, draws=50, seed=0) == pytest.approx(0.9)
    halved = simulate.random_search(task, configs, everything, draws=400, seed=0, halving=True)
    assert 0.7 < halved < 0.7 + 0.2 * 2 / len(configs)  # late answers only when first (1 in 7), else 0.7


def test_the_simulation_protects_only_a_portfolios_favourite_as_the_search_does():
    """autopelt/study/answers.py: the portfolio's first configuration answers unless the best other beats it by the
    margin (here one standard error, ~0.018 near 0.8 on 1,000 rows); a search without a portfolio answers with the
    best dev, and so does the simulation's random search, whatever the margin."""
    records = [_run("t", simulate.REFERENCE, 0, [0.5]), _run("t", "fav", 0, [0.800], [0.7]),
               _run("t", "close", 0, [0.810], [0.9]), _run("t", "far", 0, [0.830], [0.95]),
               _run("t", "x", 0, [0.6]), _run("t", "y", 0, [0.6])]
    task = simulate.Task(metadata.MetaDataset({}, tuple(records)), "t", margin=1.0)
    everything = 100.0
    assert task.halving(["fav", "x", "y", "close"], everything, favourite=True).config == "fav"  # fav, close go on
    assert task.halving(["fav", "x", "y", "far"], everything, favourite=True).config == "far"
    assert task.halving(["fav", "x", "y", "close"], everything).config == "close"  # no favourite: higher dev answers
    assert task.full(["fav", "close"], everything).config == "close"
    # the best other is compared with the favourite, not each with the one before it
    order = [_run("t", "fav", 0, [0.80]), _run("t", "b", 0, [0.83]), _run("t", "c", 0, [0.84])]
    task = simulate.Task(metadata.MetaDataset({}, tuple([records[0], *order])), "t", margin=1.0)
    assert task.full(["fav", "b", "c"], everything, favourite=True).config == "c"
    sampled = simulate.portfolio_then_random(task, ["fav"], ["b", "c"], everything, random.Random(0))
    assert sampled.config == "c" and set(sampled.trained) == {"fav", "b", "c"}


def test_the_test_choice_at_the_other_seed_chooses_by_one_seeds_test_and_scores_the_others():
    records = [_run("t", "a", 0, [0.6], [0.9]), _run("t", "a", 1, [0.6], [0.5]),  # a: lucky at seed 0
               _run("t", "b", 0, [0.6], [0.8]), _run("t", "b", 1, [0.6], [0.8])]
    meta = metadata.MetaDataset({}, tuple(records))
    assert simulate.by_test_at_other_seed(meta, "t", ["a", "b"], (0, 1)) == 0.5  # a chosen at seed 0, scored at 1
    assert simulate.by_test_at_other_seed(meta, "t", ["a", "b"], (1, 0)) == 0.8  # b chosen at seed 1


def _tampered(meta: metadata.MetaDataset, task: str, dev: bool = True) -> metadata.MetaDataset:
    records = []
    for record in meta.records:
        if record["task"] == task:  # the held-out task's scores (test only, unless dev) reversed: best becomes worst
            record = {**record, "epochs": [{**e, "dev": 1 - e["dev"] if dev else e["dev"], "test": 1 - e["test"]}
                                           for e in record["epochs"]]}
        records.append(record)
    return metadata.MetaDataset(meta.header, tuple(records))


def _trial(task, config, seed, dev):
    return {"task": task, "config": config, "seed": seed, "status": "ok",
            "epochs": [{"dev": dev, "test": dev, "seconds": 1.0}]}


def test_selection_averages_the_design_seeds_so_a_config_that_collapses_at_one_seed_loses():
    dev = {("a", 0): 0.90, ("a", 1): 0.30, ("b", 0): 0.85, ("b", 1): 0.84}  # a: best at seed 0, collapses at 1
    records = [_trial(t, c, s, dev[c, s] - (0.01 if t == "y" else 0)) for t in ("x", "y") for c, s in dev]
    records += [_trial(t, "a", 2, 0.9) for t in ("x", "y")]  # a third seed of one configuration only
    records += [_trial("x", "c", 0, 0.99), _trial("y", "c", 0, 0.99)]  # no seed 1: not a candidate
    meta = metadata.MetaDataset({}, tuple(records))
    assert meta.selection_seeds == (0, 1) and meta.candidates() == ["a", "b"]
    assert meta.dev_scores(["x"], meta.candidates()) == {"x": {"a": pytest.approx(0.60), "b": pytest.approx(0.845)}}
    assert select.greedy_portfolio(meta.dev_scores(meta.tasks, meta.candidates()), 1) == ["b"]


def test_leave_one_task_out_never_reads_the_held_out_task_when_it_builds_the_portfolio(monkeypatch):
    loo = benches.load_bench("portfolio_loo")
    monkeypatch.setattr(loo, "DRAWS", 20)  # the bench's draws and permutations make its means precise, not its folds
    monkeypatch.setattr(loo, "PERMUTATIONS", 10)
    monkeypatch.setattr(prior, "CANDIDATE_K", (3,))  # the nested choice of k over fewer candidates: faster, as honest
    meta = metadata.shipped()
    features = prior.features_of(meta)
    configs = meta.candidates()
    task = "trec"
    honest = loo.held_out(meta, features, task, configs, size=4)
    tampered = loo.held_out(_tampered(meta, task), features, task, configs, size=4)
    assert honest["portfolio"] == tampered["portfolio"]  # built without the held-out task
    assert honest["task_aware"] == tampered["task_aware"] and honest["k"] == tampered["k"]  # k chosen without it
    assert honest["arms"][8] != tampered["arms"][8]  # while the held-out task's own scores do reach the answers
    # the held-out task's test metrics reversed and its dev kept: no strategy chooses by test, so every arm answers
    # the same trials, and each arm's test is 100 minus what it was
    reversed_test = loo.held_out(_tampered(meta, task, dev=False), features, task, configs, size=4)
    for budget in loo.BUDGETS:
        for arm, value in honest["arms"][budget].items():
            assert reversed_test["arms"][budget][arm] == pytest.approx(100 - value), (budget, arm)


def test_shipped_meta_dataset_and_portfolio_agree_with_the_design():
    meta = metadata.shipped()
    assert len(meta.tasks) == 21 and sorted(meta.configs(seed=0)) == sorted(c.name for c in DESIGN) and 0 in meta.selection_seeds
    assert meta.header["design_version"] == 2 and set(meta.header["features"]) == set(meta.tasks)
    portfolio = load(SHIPPED, "all-MiniLM-L6-v2")
    assert [m.name for m in portfolio.members] == select.greedy_portfolio(
        meta.dev_scores(meta.tasks, meta.candidates()), 16)
    assert all(m.name in BY_NAME for m in portfolio.members)
    assert portfolio.prior is not None and set(portfolio.prior.tasks) == set(meta.tasks)
    assert portfolio.prior.scores == prior.scores(meta, meta.tasks)


def _rate_meta(floors: dict | None) -> metadata.MetaDataset:
    """UniPELT at 1e-3 and 3e-3 on two tasks at seeds 0 and 1: 3e-3 has the better mean dev but ends at task b's
    one class (0.5) at seed 1, where 1e-3 learned."""
    dev = {("a", 0): (0.80, 0.90), ("a", 1): (0.80, 0.90), ("b", 0): (0.70, 0.85), ("b", 1): (0.70, 0.50)}
    records = [{"task": task, "config": f"unipelt-apl@{rate}", "seed": seed, "status": "ok",
                "epochs": [{"dev": pair[i], "dev_loss": 0.5, "test": pair[i], "seconds": 1.0}]}
               for (task, seed), pair in dev.items() for i, rate in enumerate(("1e-3", "3e-3"))]
    header = {"protocol": {"dev_size": 1000}, **({"floors": floors} if floors else {})}
    return metadata.MetaDataset(header, tuple(records))


def test_a_baselines_learned_rate_is_one_that_never_collapsed_where_another_learned():
    assert meta_build.baseline_rates(_rate_meta({"a": 0.5, "b": 0.5}), ["a", "b"]) == {"unipelt_apl": 1e-3}
    assert meta_build.baseline_rates(_rate_meta(None), ["a", "b"]) == {"unipelt_apl": 3e-3}  # no floors: mean dev
    assert meta_build.baseline_rates(_rate_meta({"a": 0.5, "b": 0.5}), ["a"]) == {"unipelt_apl": 3e-3}  # b not seen


def test_the_shipped_portfolio_carries_the_rate_its_meta_dataset_teaches():
    meta = metadata.shipped()
    assert set(meta.header["floors"]) == set(meta.tasks)
    assert load(SHIPPED).baseline_rates == meta_build.baseline_rates(meta, meta.tasks) == {"unipelt_apl": 1e-3}

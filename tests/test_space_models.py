"""A search space as a model family can take it: what cannot apply is never drawn for that model."""

from __future__ import annotations

import dataclasses

import optuna
import pytest
from conftest import tiny_config
from decodermodels import tiny_decoder_config

from autopelt import delta
from autopelt.errors import UserError
from autopelt.search.space import load_space
from autopelt.search.space_models import cannot_apply_preset, for_model
from support.configs import BY_NAME


def draws(space, config, trials=60):
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    return [space.sample(study.ask(), config.num_hidden_layers)[0] for _ in range(trials)]


def test_llama_never_draws_bitfit_or_mean_pooling():
    config = tiny_decoder_config("llama")
    space = for_model(load_space("default"), config)
    assert "bitfit" not in space.methods
    specs = draws(space, config)
    methods = [m for spec in specs for m in spec["methods"]]
    assert {m["method"] for m in methods} >= {"lora", "prefix"}
    assert all(spec.get("pooling", "cls") == "cls" for spec in specs)
    for spec in specs:  # no draw fails for what the family cannot take (a rank above the tiny sizes may)
        try:
            delta.count_parameters(spec, config)
        except UserError as error:
            assert "exceeds" in str(error) or "must divide" in str(error), str(error)


def test_an_encoder_keeps_the_whole_space():
    space = load_space("default")
    assert for_model(space, tiny_config("bert")).methods == space.methods


def test_a_space_with_nothing_the_family_takes_is_one_line():
    space = load_space("default")
    only_bitfit = space.__class__(space.name, space.path, space.tree.__class__(
        methods={"bitfit": space.tree.methods["bitfit"]}, combine=1, shared={}, train=space.tree.train),
        space.fingerprint, space.param_names)
    with pytest.raises(UserError, match="nothing a llama model can take .bitfit: it has no bias terms"):
        for_model(only_bitfit, tiny_decoder_config("llama"))


def test_baselines_the_family_cannot_take_are_named():
    assert cannot_apply_preset("bitfit", tiny_decoder_config("llama")) == "it has no bias terms"
    assert cannot_apply_preset("unipelt_apl", tiny_decoder_config("llama")) is None
    assert cannot_apply_preset("bitfit", tiny_decoder_config("t5")) == "it has no bias terms"
    assert cannot_apply_preset("prefix", tiny_decoder_config("t5")) is None
    assert cannot_apply_preset("unipelt_apl", tiny_decoder_config("t5-gated")) is None


@pytest.mark.parametrize("family", ["llama", "t5", "gpt2"])
def test_the_shipped_portfolio_runs_on_a_decoder_reading_its_one_token_without_what_the_family_cannot_take(family):
    """Its members were learned on MiniLM reading the mean, which a decoder's and T5's classifier refuse (every
    member's trial failed so); BitFit members leave a Llama's and a T5's portfolio (no biases)."""
    from autopelt.portfolio.portfolio import SHIPPED, load
    from autopelt.search.space_models import portfolio_for_model

    config = tiny_decoder_config(family)
    shipped = load(SHIPPED)
    shipped = dataclasses.replace(shipped, members=shipped.members + (BY_NAME["lora+bitfit@3e-3"],))  # Llama can't
    portfolio, line = portfolio_for_model(shipped, config)
    assert portfolio.members and all(m.pooling == "cls" for m in portfolio.members)
    for member in portfolio.members:  # every member builds on the family
        delta.count_parameters(member.spec(config.num_hidden_layers), config)
    assert line.startswith("portfolio on this model: its members read the last")
    dropped = {m.name for m in shipped.members} - {m.name for m in portfolio.members}
    cannot = family in ("llama", "t5")  # no biases for BitFit
    assert bool(dropped) == cannot and ("left out" in line) == cannot


def test_an_encoders_portfolio_is_left_as_it_is():
    from autopelt.portfolio.portfolio import SHIPPED, load
    from autopelt.search.space_models import portfolio_for_model

    shipped = load(SHIPPED)
    assert portfolio_for_model(shipped, tiny_config("bert")) == (shipped, "")

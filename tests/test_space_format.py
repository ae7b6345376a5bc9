"""Layer placements, the fingerprint, and tiny.yaml building real deltas on a tiny model."""

from __future__ import annotations

import optuna
import pytest

from autopelt.search.space import SPACES_DIR, load_space
from autopelt.search.space_schema import layer_indices
from conftest import tiny_batch, tiny_config, tiny_model

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.mark.parametrize("placement,num_layers,expected", [
    ("all", 6, None),
    (None, 6, None),
    ("upper_half", 6, [3, 4, 5]),
    ("lower_half", 6, [0, 1, 2]),
    ("upper_half", 5, [2, 3, 4]),
    ("upper_half", 1, [0]),
    ("top:0.25", 12, [9, 10, 11]),
    ("top:0.25", 6, [4, 5]),
    ("top:0.25", 2, [1]),
    ("bottom:0.5", 2, [0]),
    ("top:1", 3, [0, 1, 2]),
    ([0, -1], 6, [0, 5]),
    ([-1, 5], 6, [5]),
])
def test_placement_maps_to_layer_indices(placement, num_layers, expected):
    assert layer_indices(placement, num_layers) == expected


@pytest.mark.parametrize("placement", [[6], [-7]])
def test_placement_outside_the_model_is_refused(placement):
    with pytest.raises(ValueError, match="out of range for a model with 6 layers"):
        layer_indices(placement, 6)


def write(tmp_path, name: str, text: str):
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return load_space(path)


def test_fingerprint_ignores_comments_layout_and_key_order(tmp_path):
    a = write(tmp_path, "a", "# a space\nmethods:\n  lora: {rank: {choice: [4, 8]}, alpha: 16}\n  prompt: {}\n"
                             "train: {learning_rate: 1e-3}\n")
    b = write(tmp_path, "b", "train:\n  learning_rate: 0.001\nmethods:\n  prompt:\n  lora:\n    alpha: 16\n"
                             "    rank:\n      choice: [4, 8]\n")
    assert a.fingerprint == b.fingerprint and len(a.fingerprint) == 12
    assert (a.name, b.name) == ("a", "b")


@pytest.mark.parametrize("change", ["[8, 4]", "[4, 16]"])
def test_fingerprint_changes_with_the_content(tmp_path, change):
    base = "methods: {lora: {rank: {choice: RANKS}}}\ntrain: {learning_rate: 1e-3}\n"
    a = write(tmp_path, "a", base.replace("RANKS", "[4, 8]"))
    b = write(tmp_path, "b", base.replace("RANKS", change))
    assert a.fingerprint != b.fingerprint


def test_shipped_fingerprints_are_distinct():
    prints = [load_space(p).fingerprint for p in SPACES_DIR.glob("*.yaml")]
    assert len(set(prints)) == len(prints)


def test_switches_never_leave_a_spec_empty(tmp_path):
    space = write(tmp_path, "s", "methods: {lora: {}, prompt: {}}\ntrain: {learning_rate: 1e-3}\n")
    spec, _ = space.sample(optuna.trial.FixedTrial({"use.lora": False, "learning_rate": 1e-3}), 2)
    assert spec == {"methods": [{"method": "prompt"}]}
    assert space.param_names == ("use.lora", "use.prompt")


def test_shared_field_goes_only_where_the_method_leaves_it_unset(tmp_path):
    space = write(tmp_path, "s", "methods: {lora: {gate: false}, prefix: {}, prompt: {}}\n"
                                 "shared: {gate: {choice: [false, true]}}\n"
                                 "combine: {combinations: [[lora, prefix, prompt]]}\n"
                                 "train: {learning_rate: 1e-3}\n")
    spec, _ = space.sample(optuna.trial.FixedTrial({"gate": True}), 2)
    assert [e.get("gate") for e in spec["methods"]] == [False, True, None]


def test_tiny_space_builds_and_runs_on_a_tiny_model():
    from autopelt import delta

    space, config = load_space("tiny"), tiny_config()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(12):
        trial = study.ask()
        spec, _ = space.sample(trial, config.num_hidden_layers)
        model = delta.apply_delta(tiny_model(), spec, seed=0)
        logits = model(**tiny_batch()).logits
        assert logits.shape == (3, 2) and bool(logits.isfinite().all()), spec
        assert delta.count_parameters(spec, config, 2).stored > 0
        study.tell(trial, 0.0)

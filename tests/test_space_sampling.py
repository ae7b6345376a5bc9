"""Sampling from every shipped search space: valid specs, conditional parameters, reachability, determinism."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from autopelt.delta import parse_spec
from autopelt.search.space import SPACES_DIR, load_space

optuna.logging.set_verbosity(optuna.logging.WARNING)

SPACE_FILES = sorted(SPACES_DIR.glob("*.yaml"))
DRAWS = 200

# The delta spec of docs/design.md, written out here independently of the spec the space schema derives from.
DESIGN_FIELDS = {
    "lora": {"rank", "alpha", "targets", "dropout", "gate", "layers", "rslora", "dora"},
    "adapter": {"placement", "bottleneck", "activation", "projection", "n", "phm_rank", "gate", "layers"},
    "prefix": {"length", "reparam_hidden", "gate", "split_gate", "layers", "shift_positions"},
    "prompt": {"length"},
    "bitfit": {"targets", "pooler"},
    "adamix": {"experts", "share_up", "consistency", "expert_init", "delta"},
    "ia3": {"targets", "layers"},
    "vera": {"rank", "targets", "d_initial", "dropout", "gate", "layers"},
}


def draw_many(space, num_layers: int, seed: int = 0, n: int = DRAWS, sampler=None):
    """[(spec, train, trial params)] from one study."""
    study = optuna.create_study(sampler=sampler or optuna.samplers.RandomSampler(seed=seed))
    out = []
    for _ in range(n):
        trial = study.ask()
        spec, train = space.sample(trial, num_layers)
        out.append((spec, train, dict(trial.params)))
        study.tell(trial, float(len(spec["methods"])))
    return out


@pytest.fixture(scope="module", params=SPACE_FILES, ids=lambda p: p.stem)
def space(request):
    return load_space(request.param.stem)


@pytest.fixture(scope="module", params=[2, 6], ids=lambda n: f"{n}layers")
def draws(request, space):
    return request.param, draw_many(space, request.param)


def check_entry(entry: dict, num_layers: int) -> None:
    method = entry["method"]
    assert method in DESIGN_FIELDS, entry
    assert set(entry) - {"method"} <= DESIGN_FIELDS[method], entry
    layers = entry.get("layers")
    if layers is not None:
        assert layers and layers == sorted(set(layers)) and all(0 <= i < num_layers for i in layers), entry
    if method == "adamix":
        inner = entry["delta"]
        assert inner["method"] in ("adapter", "lora"), entry
        check_entry(inner, num_layers)


def families(spec: dict) -> list[str]:
    return [e["delta"]["method"] if e["method"] == "adamix" else e["method"] for e in spec["methods"]]


def test_every_file_starts_with_a_comment_saying_what_it_is_for():
    assert len(SPACE_FILES) >= 6
    for path in SPACE_FILES:
        first = path.read_text().splitlines()[0]
        assert first.startswith(f"# {path.stem}: ") and len(first) > 30, path


def test_specs_are_plain_json_in_the_design_format(space, draws):
    num_layers, samples = draws
    for spec, train, _ in samples:
        assert json.loads(json.dumps(spec)) == spec and list(spec) in (["methods"], ["methods", "pooling"])
        assert spec.get("pooling", "mean") == "mean", "a spec leaves the default pooling (cls) out"
        assert spec["methods"], "a spec is never empty"
        for entry in spec["methods"]:
            check_entry(entry, num_layers)
        assert len(set(families(spec))) == len(families(spec)), f"one entry per family: {spec}"
        if train["learning_rate"] == "auto":  # the baselines' rates for the drawn methods, times lr_scale
            assert isinstance(train["lr_scale"], float) and train["lr_scale"] > 0
        else:
            assert isinstance(train["learning_rate"], float) and train["learning_rate"] > 0
        assert json.loads(json.dumps(train)) == train


def test_max_methods_is_respected(space, draws):
    most = space.tree.combine if isinstance(space.tree.combine, int) else len(space.methods)
    assert max(len(spec["methods"]) for spec, _, _ in draws[1]) <= most


def test_conditional_parameters_appear_only_under_their_parent(space, draws):
    for spec, _, params in draws[1]:
        entries = {e["method"]: e for e in spec["methods"]}
        for name, value in params.items():
            head, _, field = name.partition(".")
            if head in DESIGN_FIELDS:
                assert head in entries, f"{name} drawn but {head} not chosen: {spec}"
            if head == "adamix" and field.count("."):
                assert entries["adamix"]["delta"]["method"] == field.split(".")[0], (name, spec)
            if name in ("adapter.n", "adapter.phm_rank"):
                assert entries["adapter"]["projection"] in ("phm", "compacter"), (name, spec)
            if name in ("gate", "layers"):
                assert any(name in e for e in entries.values()), (name, spec)
            if name.startswith("use."):
                assert value == (field in entries), (name, spec)


def test_drawn_values_are_the_spec_values(space, draws):
    for spec, _, params in draws[1]:
        entries = {e["method"]: e for e in spec["methods"]}
        for name, value in params.items():
            parts = name.split(".")
            if len(parts) != 2 or parts[0] not in entries or parts[1] == "layers":
                continue
            got = entries[parts[0]][parts[1]]
            got = got["method"] if parts[1] == "delta" else got
            assert value == ("+".join(got) if isinstance(got, list) else got), (name, spec)


def test_children_appear_whenever_their_parent_is_chosen(space, draws):
    for spec, _, params in draws[1]:
        adapter = next((e for e in spec["methods"] if e["method"] == "adapter"), None)
        if adapter and adapter.get("projection") in ("phm", "compacter") and "adapter.n" in space.param_names:
            assert "adapter.n" in params, spec
        for entry in spec["methods"]:
            drawn = [p for p in space.param_names if p.startswith(entry["method"] + ".") and p.count(".") == 1]
            conditional = {"adapter.n", "adapter.phm_rank"}
            if {"adapter", "lora"} & set(families(spec)):
                conditional.add("adamix.delta")  # forced to the family the spec does not hold yet
            unconditional = [p for p in drawn if p not in conditional]
            assert set(unconditional) <= set(params), (entry, params)


def test_every_method_and_parameter_is_reachable(space, draws):
    chosen = {e["method"] for spec, _, _ in draws[1] for e in spec["methods"]}
    assert chosen == set(space.methods)
    drawn = {name for _, _, params in draws[1] for name in params}
    assert drawn == set(space.param_names)


def test_same_seed_same_samples_and_another_seed_differs(space):
    first, again, other = (draw_many(space, 6, seed=s, n=30) for s in (7, 7, 8))
    assert first == again
    assert first != other


def test_tpe_sampler_accepts_the_space(space):
    """Optuna refuses one parameter name with two distributions; TPE after its start-up trials must run."""
    sampler = optuna.samplers.TPESampler(seed=0, n_startup_trials=5)
    assert len(draw_many(space, 6, n=15, sampler=sampler)) == 15


def test_delta_library_accepts_every_sampled_spec(space, draws):
    assert draws[1]
    for spec, _, _ in draws[1]:
        parsed = parse_spec(spec).to_dict()
        assert [e["method"] for e in parsed["methods"]] == [e["method"] for e in spec["methods"]], spec
        for drawn, kept in zip(spec["methods"], parsed["methods"]):  # every drawn value reaches the spec as drawn
            assert {k: v for k, v in kept.items() if k in drawn and k != "delta"} == \
                {k: v for k, v in drawn.items() if k != "delta"}, spec


def test_unipelt_paper_default_replays_from_stable_parameter_names():
    params = {"methods": "apl", "lora.rank": 8, "adapter.bottleneck": 48, "prefix.length": 10, "gate": True,
              "lr_scale": 1.0}
    spec, train = load_space("unipelt").sample(optuna.trial.FixedTrial(params), 12)
    assert spec == {"methods": [
        {"method": "lora", "rank": 8, "alpha": 16, "targets": ["query", "value"], "gate": True},
        {"method": "adapter", "placement": "pfeiffer", "bottleneck": 48, "gate": True},
        {"method": "prefix", "length": 10, "gate": True},
    ]}
    assert train == {"learning_rate": "auto", "lr_scale": 1.0, "epochs": 3, "batch_size": 32}


def test_adamix_never_mixes_a_family_already_in_the_spec():
    space = load_space("default")
    with_adamix = [spec for spec, _, _ in draw_many(space, 6, n=400) if "adamix" in families(spec) or
                   any(e["method"] == "adamix" for e in spec["methods"])]
    assert with_adamix
    pairs = {(e["delta"]["method"], tuple(sorted(m["method"] for m in spec["methods"])))
             for spec in with_adamix for e in spec["methods"] if e["method"] == "adamix"}
    assert all(inner not in others for inner, others in pairs)
    assert any(inner == "lora" and "adapter" in others for inner, others in pairs)


def test_the_default_space_is_all_without_prompt_tuning():
    """Two near-copies of one file: this keeps them in step."""
    full, default = load_space("all").tree, load_space("default").tree
    assert "prompt" in full.methods and "prompt" not in default.methods
    assert {k: v for k, v in full.methods.items() if k != "prompt"} == dict(default.methods)
    assert (full.combine, full.shared, full.train) == (default.combine, default.shared, default.train)


def test_named_space_and_root_link_are_the_same_file():
    via_link = load_space(Path(__file__).resolve().parents[1] / "search_spaces" / "default.yaml")
    by_name = load_space("default")
    assert via_link.name == by_name.name == "default"
    assert via_link.fingerprint == by_name.fingerprint


def test_the_variants_beside_the_reference_forms_can_be_searched(tmp_path):
    """Placement ffn, split prefix gates, BitFit without the pooler, independent AdaMix experts: each a field a
    space may draw, and each drawn value reaches the delta spec."""
    from autopelt.delta import parse_spec

    path = tmp_path / "variants.yaml"
    path.write_text("""# variants: every autopelt variant of a reference form
methods:
  adapter: {placement: {choice: [houlsby, pfeiffer, ffn]}}
  prefix: {gate: true, split_gate: {choice: [false, true]}}
  bitfit: {pooler: {choice: [true, false]}}
  adamix:
    expert_init: {choice: [copy, independent]}
    delta: {lora: {rank: 2}}
combine: {max_methods: 4}
train: {learning_rate: 1e-3}
""")
    seen = set()
    for spec, _, _ in draw_many(load_space(path), 2, n=120):
        for entry in parse_spec(spec).methods:
            value = {"adapter": "placement", "prefix": "split_gate", "bitfit": "pooler", "adamix": "expert_init"}
            seen.add((entry.method, getattr(entry, value[entry.method])))
    assert seen == {("adapter", "houlsby"), ("adapter", "pfeiffer"), ("adapter", "ffn"), ("prefix", False),
                    ("prefix", True), ("bitfit", True), ("bitfit", False), ("adamix", "copy"),
                    ("adamix", "independent")}


def test_the_default_space_draws_every_baseline_from_parameters_a_sampler_can_learn_from():
    """The study queues its baselines with these parameters: replayed, they draw exactly the preset."""
    from autopelt.delta.presets import BASELINES, PRESETS

    space = load_space("default")
    for name in BASELINES:
        params = space.params_for(PRESETS[name], 6)
        assert params is not None, name
        study = optuna.create_study()
        study.enqueue_trial(params)
        spec, train = space.sample(study.ask(), 6)
        ordered = lambda s: sorted(parse_spec(s).to_dict()["methods"], key=lambda e: e["method"])
        assert ordered(spec) == ordered(PRESETS[name]), name
        assert train.get("lr_scale", 1.0) == 1.0


def test_a_mixtures_spec_is_drawn_from_its_own_parameters_and_its_deltas():
    """A wrapper's spec (AdaMix over an adapter, over a LoRA) has the parameters that draw it: its own fields', and
    its delta's under `adamix.<method>.`; replayed, they draw the same delta."""
    from autopelt.delta.presets import PRESETS

    space = load_space("adamix")
    over_lora = {"methods": [{"method": "adamix", "experts": 4, "delta": {"method": "lora", "rank": 8}}]}
    for spec, inner in ((PRESETS["adamix"], {"adamix.adapter.bottleneck": 48}), (over_lora, {"adamix.lora.rank": 8})):
        params = space.params_for(spec, 6)
        assert params is not None and inner.items() <= params.items()
        study = optuna.create_study()
        study.enqueue_trial(params)
        drawn, _ = space.sample(study.ask(), 6)
        assert parse_spec(drawn) == parse_spec(spec)


def test_a_spec_the_space_cannot_draw_has_no_parameters():
    space = load_space("default")
    assert space.params_for({"methods": [{"method": "lora", "rank": 3}]}, 6) is None  # rank 3 is not offered
    assert load_space("lora").params_for({"methods": [{"method": "bitfit"}]}, 6) is None  # no bitfit there

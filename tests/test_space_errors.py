"""A bad search space fails at load time with one line naming the file and the offending key."""

from __future__ import annotations

import textwrap

import optuna
import pytest

from autopelt.errors import UserError
from autopelt.search.space import available_spaces, load_space

TRAIN = "train: {learning_rate: 1e-3}\n"

# (id, file body, text the one-line error must contain besides the file name)
CASES = [
    ("syntax", "methods: [lora\n", "malformed YAML"),
    ("duplicate-key", "methods:\n  lora: {}\n  lora: {}\n" + TRAIN, "lora: duplicate key (line 3)"),
    ("not-a-mapping", "- lora\n- adapter\n", "(top level)"),
    ("empty-file", "", "(top level)"),
    ("unknown-top-key", "methodz: {lora: {}}\n" + TRAIN, "methodz: unknown top-level key"),
    ("no-methods", "methods: {}\n" + TRAIN, "methods: required"),
    ("unknown-method", "methods: {loraa: {}}\n" + TRAIN, "methods.loraa: unknown method"),
    ("preset-as-method", "methods: {compacter: {}}\n" + TRAIN, "methods.compacter: compacter is an adapter"),
    ("unknown-field", "methods: {lora: {rnk: 8}}\n" + TRAIN, "methods.lora.rnk: unknown field"),
    ("low-above-high", "methods: {lora: {rank: {int: [64, 1]}}}\n" + TRAIN, "methods.lora.rank.int: low 64 > high 1"),
    ("empty-choice", "methods: {lora: {rank: {choice: []}}}\n" + TRAIN, "methods.lora.rank.choice: empty choice"),
    ("choice-not-list", "methods: {lora: {rank: {choice: 8}}}\n" + TRAIN, "methods.lora.rank.choice"),
    ("duplicate-option", "methods: {lora: {rank: {choice: [4, 4]}}}\n" + TRAIN, "methods.lora.rank.choice: option 4"),
    ("unknown-dist-key", "methods: {lora: {rank: {int: [1, 8], steps: 2}}}\n" + TRAIN, "methods.lora.rank.steps"),
    ("choice-and-int", "methods: {lora: {rank: {choice: [1], int: [1, 2]}}}\n" + TRAIN, "methods.lora.rank.int"),
    ("not-a-distribution", "methods: {lora: {rank: {dist: 8}}}\n" + TRAIN, "methods.lora.rank: expected"),
    ("float-for-int", "methods: {lora: {rank: {float: [1, 8]}}}\n" + TRAIN, "methods.lora.rank.float"),
    ("int-bounds-are-floats", "methods: {lora: {rank: {int: [1.5, 8]}}}\n" + TRAIN, "methods.lora.rank.int"),
    ("one-bound", "methods: {lora: {rank: {int: [8]}}}\n" + TRAIN, "methods.lora.rank.int: expected [low, high]"),
    ("bound-out-of-kind", "methods: {lora: {rank: {int: [0, 8]}}}\n" + TRAIN, "methods.lora.rank.int: 0 is invalid"),
    ("log-from-zero", "methods: {lora: {}}\ntrain: {learning_rate: 1e-3, weight_decay: {float: [0, 0.1], log: true}}\n",
     "train.weight_decay.float: a log range needs low > 0"),
    ("negative-learning-rate", "methods: {lora: {}}\ntrain: {learning_rate: {float: [-1, 1e-2]}}\n",
     "train.learning_rate.float: -1.0 is invalid: expected a positive number"),
    ("log-and-step", "methods: {lora: {rank: {int: [1, 64], log: true, step: 2}}}\n" + TRAIN,
     "methods.lora.rank.step: step and log"),
    ("step-off-grid", "methods: {lora: {rank: {int: [1, 8], step: 3}}}\n" + TRAIN, "methods.lora.rank.step"),
    ("log-not-bool", "methods: {lora: {rank: {int: [1, 8], log: 1}}}\n" + TRAIN, "methods.lora.rank.log"),
    ("bad-value", "methods: {lora: {rank: 0}}\n" + TRAIN, "methods.lora.rank: 0 is invalid"),
    ("bad-enum", "methods: {adapter: {placement: middle}}\n" + TRAIN, "methods.adapter.placement: 'middle'"),
    ("bad-site", "methods: {lora: {targets: [querry]}}\n" + TRAIN, "methods.lora.targets"),
    ("bad-site-option", "methods: {lora: {targets: {choice: [[query], [vlue]]}}}\n" + TRAIN,
     "methods.lora.targets.choice"),
    ("bad-placement", "methods: {lora: {layers: 'top:1.5'}}\n" + TRAIN, "methods.lora.layers: 'top:1.5'"),
    ("bad-branch-option", "methods: {adapter: {projection: {choice: {dense: {}, kron: {}}}}}\n" + TRAIN,
     "methods.adapter.projection.choice.kron"),
    ("unknown-field-in-branch", "methods: {adapter: {projection: {choice: {phm: {m: 4}}}}}\n" + TRAIN,
     "methods.adapter.projection.choice.phm.m: unknown field"),
    ("branch-resets-field", "methods: {adapter: {n: 2, projection: {choice: {phm: {n: 4}}}}}\n" + TRAIN,
     "methods.adapter.projection.choice.phm.n: already set"),
    ("one-name-two-distributions",
     "methods: {adapter: {projection: {choice: {phm: {n: {choice: [2, 4]}}, compacter: {n: {choice: [2, 8]}}}}}}\n"
     + TRAIN, "methods.adapter.projection.choice.compacter.n.choice: parameter adapter.n is drawn differently"),
    ("n-does-not-divide-bottleneck",
     "methods: {adapter: {bottleneck: {choice: [8, 12]}, projection: {choice: {phm: {n: {choice: [2, 8]}}}}}}\n"
     + TRAIN, "methods.adapter.n: n=8 does not divide bottleneck 12"),
    ("log-int-bottleneck-with-n",
     "methods: {adapter: {bottleneck: {int: [8, 64], log: true}, projection: compacter, n: 4}}\n" + TRAIN,
     "methods.adapter.n: n=4 does not divide bottleneck 9"),
    ("adamix-without-delta", "methods: {adamix: {experts: 4}}\n" + TRAIN, "methods.adamix.delta: required"),
    ("adamix-gated-delta", "methods: {adamix: {delta: {choice: {adapter: {gate: true}}}}}\n" + TRAIN,
     "methods.adamix.delta.choice.adapter.gate: unknown field"),
    ("adamix-mixes-prefix", "methods: {adamix: {delta: {prefix: {length: 4}}}}\n" + TRAIN,
     "methods.adamix.delta.prefix: unknown mixed delta"),
    ("adamix-two-without-choice", "methods: {adamix: {delta: {adapter: {}, lora: {}}}}\n" + TRAIN,
     "methods.adamix.delta: several mixed deltas"),
    ("max-methods-zero", "methods: {lora: {}}\ncombine: {max_methods: 0}\n" + TRAIN, "combine.max_methods"),
    ("max-methods-too-many", "methods: {lora: {}}\ncombine: {max_methods: 2}\n" + TRAIN, "combine.max_methods"),
    ("both-combine-modes", "methods: {lora: {}}\ncombine: {max_methods: 1, combinations: [[lora]]}\n" + TRAIN,
     "combine: give max_methods or combinations, not both"),
    ("combination-undefined-method",
     "methods: {lora: {}}\ncombine: {combinations: {mine: [lora, prefix]}}\n" + TRAIN,
     "combine.combinations.mine: 'prefix' is not under methods"),
    ("combination-empty", "methods: {lora: {}}\ncombine: {combinations: {mine: []}}\n" + TRAIN,
     "combine.combinations.mine: expected a non-empty list"),
    ("combination-twice", "methods: {lora: {}}\ncombine: {combinations: [[lora, lora]]}\n" + TRAIN,
     "combine.combinations.0: 'lora' is listed twice"),
    ("method-in-no-combination",
     "methods: {lora: {}, prompt: {}}\ncombine: {combinations: {l: [lora]}}\n" + TRAIN,
     "methods.prompt: is in no combination"),
    ("adamix-family-clash",
     "methods: {adapter: {}, adamix: {delta: {adapter: {}}}}\ncombine: {combinations: {x: [adapter, adamix]}}\n"
     + TRAIN, "combine.combinations.x: adamix mixes a family"),
    ("unknown-shared", "methods: {lora: {}}\nshared: {rank: 8}\n" + TRAIN, "shared.rank: unknown field"),
    ("shared-without-taker", "methods: {prompt: {}}\nshared: {gate: true}\n" + TRAIN, "shared.gate: no method"),
    ("shared-with-branches", "methods: {lora: {}}\nshared: {gate: {choice: {true: {layers: all}}}}\n" + TRAIN,
     "shared.gate: a shared field takes a list"),
    ("no-train", "methods: {lora: {}}\n", "train.learning_rate: required"),
    ("unknown-train-key", "methods: {lora: {}}\ntrain: {learning_rate: 1e-3, lr: 1e-3}\n", "train.lr: unknown field"),
    ("bad-learning-rate", "methods: {lora: {}}\ntrain: {learning_rate: fast}\n", "train.learning_rate: 'fast'"),
    ("section-not-mapping", "methods: {lora: {}}\ntrain: [1e-3]\n", "train: expected a mapping"),
]


@pytest.mark.parametrize("body,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_space_is_one_line_naming_file_and_key(tmp_path, body, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(body)
    with pytest.raises(UserError) as caught:
        load_space(path)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: ")
    assert expected in message


def test_syntax_error_gives_the_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("methods:\n  lora: {rank: 8\n" + TRAIN)
    with pytest.raises(UserError, match=r"broken\.yaml: \(line \d+, column \d+\): malformed YAML"):
        load_space(str(path))


def test_exponent_floats_are_numbers(tmp_path):
    """PyYAML alone reads 1e-5 as a string; a space file means the number."""
    path = tmp_path / "ok.yaml"
    path.write_text("methods: {lora: {}}\ntrain: {learning_rate: {float: [1e-5, 3E-2], log: true}, epochs: 2}\n")
    space = load_space(path)
    assert space.name == "ok"
    _, train = space.sample(optuna.trial.FixedTrial({"learning_rate": 1e-4}), 2)
    assert train == {"learning_rate": 1e-4, "epochs": 2}


def test_unknown_space_name_lists_the_available_ones():
    with pytest.raises(UserError) as caught:
        load_space("nope")
    message = str(caught.value)
    assert "'nope'" in message and "\n" not in message
    assert {"default", "all", "lora", "adapters", "unipelt", "adamix", "tiny"} <= set(available_spaces())
    for name in available_spaces():
        assert name in message


def test_missing_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_space(tmp_path / "absent.yaml")


def test_layer_outside_the_model_fails_when_sampled(tmp_path):
    path = tmp_path / "layers.yaml"
    path.write_text(textwrap.dedent("""\
        methods: {lora: {layers: [0, 7]}}
        train: {learning_rate: 1e-3}
    """))
    space = load_space(path)
    spec, _ = space.sample(optuna.trial.FixedTrial({}), 8)
    assert spec["methods"][0]["layers"] == [0, 7]
    with pytest.raises(UserError, match=rf"^{path}: lora\.layers: layer 7 is out of range for a model with 6 layers$"):
        space.sample(optuna.trial.FixedTrial({}), 6)

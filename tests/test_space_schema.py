"""The search-space schema is the delta spec's: a method declared in autopelt/delta/spec.py is one a space file
can search, with no edit under autopelt/search/."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

import optuna
import pytest

from autopelt.delta import parse_spec
from autopelt.delta.fields import BOOL, LAYER_INDICES, POSITIVE_INT, declare, one_of
from autopelt.delta.spec import METHODS, MethodConfig
from autopelt.errors import UserError
from autopelt.search import space_schema
from autopelt.search.space import load_space
from autopelt.train import TrialSettings


@dataclass(frozen=True)
class ScaleConfig(MethodConfig):
    """A method as a new one is declared: a frozen config whose fields say what they accept."""

    method: ClassVar[str] = "scale"
    summary: ClassVar[str] = "a learned scale per site (a stand-in method for this test)"

    size: int = declare("vectors per site", 1, POSITIVE_INT)
    where: str = declare("keys, values or both", "both", one_of("keys", "values", "both"))
    gate: bool = declare("UniPELT gate", False, BOOL)
    layers: tuple[int, ...] | None = declare("layer indices; null = all", None, LAYER_INDICES)


@pytest.fixture
def scale(monkeypatch):
    monkeypatch.setitem(METHODS, "scale", ScaleConfig)


def write(tmp_path, text: str):
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return load_space(path)


def test_every_method_and_field_of_the_spec_is_in_the_schema():
    assert space_schema.method_names() == tuple(METHODS)
    for name, cls in METHODS.items():
        searchable = [f.name for f in dataclasses.fields(cls) if f.metadata.get("search", True)]
        assert list(space_schema.method_fields(name)) == searchable, name
    assert "layers" not in space_schema.method_fields("bitfit")  # declared search=False in the spec
    assert space_schema.nested_field("adamix") == "delta" and space_schema.required_fields("adamix") == ("delta",)
    assert list(space_schema.mixed_fields("adamix", "adapter")) == ["placement", "bottleneck", "activation", "layers"]
    assert list(space_schema.mixed_fields("adamix", "lora")) == ["rank", "alpha", "targets", "dropout", "layers",
                                                                   "rslora"]


def test_the_train_section_names_trial_settings():
    settings = {f.name for f in dataclasses.fields(TrialSettings)}
    assert set(space_schema.TRAIN_FIELDS) - {"lr_scale"} <= settings  # lr_scale: the controller's, on `auto`


def test_a_method_declared_in_the_spec_is_searchable(tmp_path, scale):
    space = write(tmp_path, "methods:\n  lora: {rank: 4}\n  scale: {size: {int: [1, 8]}, where: {choice: [keys, both]}}\n"
                            "combine: {max_methods: 2}\nshared:\n  gate: {choice: [false, true]}\n"
                            "  layers: {choice: [all, upper_half]}\ntrain: {learning_rate: 1e-3}\n")
    assert space.methods == ("lora", "scale")
    assert set(space.param_names) == {"use.lora", "use.scale", "scale.size", "scale.where", "gate", "layers"}
    params = {"use.lora": True, "use.scale": True, "scale.size": 3, "scale.where": "keys", "gate": True,
              "layers": "upper_half"}
    spec, _ = space.sample(optuna.trial.FixedTrial(params), 6)
    assert spec["methods"][1] == {"method": "scale", "size": 3, "where": "keys", "gate": True, "layers": [3, 4, 5]}
    parsed = parse_spec(spec)  # the delta library takes what the space drew
    assert isinstance(parsed.methods[1], ScaleConfig) and parsed.methods[1].layers == (3, 4, 5)


@pytest.mark.parametrize("body, words", [
    ("scale: {size: 0}", "methods.scale.size: 0 is invalid: expected a positive integer"),
    ("scale: {size: {float: [1, 2]}}", "methods.scale.size.float: a float range cannot draw a positive integer"),
    ("scale: {where: middle}", "methods.scale.where: 'middle' is invalid: expected keys, values or both"),
    ("scale: {depth: 2}", "methods.scale.depth: unknown field"),
])
def test_a_declared_methods_fields_are_checked_when_the_file_loads(tmp_path, scale, body, words):
    with pytest.raises(UserError, match="^" + str(tmp_path / "s.yaml") + ": ") as caught:
        write(tmp_path, f"methods:\n  {body}\ntrain: {{learning_rate: 1e-3}}\n")
    assert words in str(caught.value)


def test_without_the_declaration_the_method_is_unknown(tmp_path):
    with pytest.raises(UserError, match="methods.scale: unknown method"):
        write(tmp_path, "methods:\n  scale: {}\ntrain: {learning_rate: 1e-3}\n")

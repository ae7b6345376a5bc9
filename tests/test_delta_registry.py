"""A delta method is one registry entry, in one file: `toyshift` (tests/support/toy_method.py), which the package never
names, parses from a spec, builds, counts, trains, saves and loads, and a search space draws it, through the same
calls every built-in method goes through."""

from __future__ import annotations

import dataclasses
import importlib
import sys
from pathlib import Path
from typing import ClassVar

import optuna
import pytest
import torch
from conftest import tiny_batch, tiny_model
from tinymodels import make_settings, sst2_dir, tiny_model_dir, trial_cache  # noqa: F401  (fixtures)

from autopelt import delta
from autopelt.delta import registry
from autopelt.delta.config import MethodConfig
from autopelt.delta.modules.lora import LoRALinear
from autopelt.delta.peft_export import peft_reason
from autopelt.errors import UserError
from autopelt.search import space_schema
from autopelt.search.space import load_space

SPEC = {"methods": [{"method": "toyshift", "targets": ["value", "output"], "layers": [1]},
                    {"method": "lora", "rank": 2, "targets": ["value"]}]}
PACKAGE = Path(delta.__file__).resolve().parents[1]


@pytest.fixture
def toy():
    """The toy's file imported, as a user's own method is; the registry as it was afterwards."""
    saved = [(table, dict(table)) for table in (registry.METHODS, registry.ENTRIES, registry.ALIASES)]
    sys.modules.pop("support.toy_method", None)
    yield importlib.import_module("support.toy_method")
    sys.modules.pop("support.toy_method", None)
    for table, before in saved:
        table.clear()
        table.update(before)


def test_the_package_never_names_the_toy_method():
    named = [str(path) for path in PACKAGE.rglob("*.py") if "toyshift" in path.read_text().lower()]
    assert named == []


def test_the_toy_parses_from_a_spec_with_its_fields_checked(toy):
    spec = delta.parse_spec(SPEC)
    assert isinstance(spec.methods[0], toy.ToyShiftConfig) and spec.methods[0].layers == (1,)
    assert spec.summary() == "toyshift + lora r2"
    with pytest.raises(UserError, match=r"^toyshift.targets = \('nowhere',\) is invalid: expected a non-empty list"):
        delta.parse_spec({"methods": [{"method": "toyshift", "targets": ["nowhere"]}]})
    with pytest.raises(UserError, match="unknown field 'rank' for method 'toyshift'"):
        delta.parse_spec({"methods": [{"method": "toyshift", "rank": 2}]})


def test_the_toy_injects_where_its_entry_says_and_starts_as_the_identity(toy):
    base = tiny_model()
    expected = base(**tiny_batch()).logits
    model = delta.apply_delta(tiny_model(), SPEC)
    layers = model.bert.encoder.layer
    value, output = layers[1].attention.self.value, layers[1].output.dense
    assert isinstance(value, toy.ShiftLinear) and isinstance(value.base_layer, LoRALinear)  # built after LoRA
    assert isinstance(output, toy.ShiftLinear) and isinstance(output.base_layer, torch.nn.Linear)
    assert not isinstance(layers[0].output.dense, toy.ShiftLinear)  # layer 0 was not chosen
    torch.testing.assert_close(model(**tiny_batch()).logits, expected, rtol=0, atol=1e-6)


def test_the_toy_counts_what_it_builds(toy):
    model = delta.apply_delta(tiny_model(), SPEC)
    count = delta.count_parameters(SPEC, model.config)
    assert count.trainable == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert count.stored == sum(t.numel() for t in delta.delta_state(model).values())
    shift_only = delta.count_parameters({"methods": [SPEC["methods"][0]]}, model.config)
    head = sum(p.numel() for p in model.classifier.parameters())
    assert shift_only.trainable - head == 32 + 32  # the value's and the FFN output's widths, in layer 1


def test_the_toy_trains_only_itself_and_the_head_and_reloads_to_the_same_logits(toy, tmp_path):
    model = delta.apply_delta(tiny_model(), SPEC).train()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimiser = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model(**tiny_batch(), labels=torch.tensor([0, 1, 1])).loss.backward()
    optimiser.step()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert {n for n in changed if n.endswith(".shift")} == {"bert.encoder.layer.1.attention.self.value.shift",
                                                             "bert.encoder.layer.1.output.dense.shift"}
    assert changed <= {n for n, p in model.named_parameters() if p.requires_grad}
    model.eval()
    expected = model(**tiny_batch()).logits
    delta.save_delta(model, SPEC, tmp_path)
    fresh = delta.load_delta(tiny_model(seed=0), tmp_path).eval()
    torch.testing.assert_close(fresh(**tiny_batch()).logits, expected, rtol=1e-5, atol=1e-5)


def test_a_search_space_lists_and_draws_the_toy(toy, tmp_path):
    assert "toyshift" in space_schema.method_names()
    assert list(space_schema.method_fields("toyshift")) == ["targets", "layers"]
    path = tmp_path / "s.yaml"
    path.write_text("methods:\n  toyshift: {targets: {choice: [[value], [value, output]]}}\n"
                    "train: {learning_rate: 1e-3}\n")
    space = load_space(path)
    assert space.methods == ("toyshift",)
    spec, _ = space.sample(optuna.trial.FixedTrial({"toyshift.targets": "value+output"}), 2)  # a list's label
    assert spec["methods"] == [{"method": "toyshift", "targets": ["value", "output"]}]
    assert isinstance(delta.parse_spec(spec).methods[0], toy.ToyShiftConfig)
    # and the parameters that draw a given toy spec (a baseline's, a portfolio member's): the toy wraps no delta
    assert space.params_for(spec, 2) == {"toyshift.targets": "value+output"}


def test_the_toy_trains_through_a_whole_trial_and_its_entry_answers_for_it(toy, make_settings, tmp_path):
    """A user's method runs as a built-in one does: a real trial (data, training, dev, test, saved delta), and the
    questions the trial, the search and the report ask of a method (rate family, extra loss, checkpointing, soup,
    sizes a space checks, a wider placement, a wrapped delta, a gate's row) answered by its entry's defaults."""
    from autopelt.ensemble.soup import why_not_soup
    from autopelt.train import run_trial

    spec = {"methods": [SPEC["methods"][0]]}
    result = run_trial(make_settings(spec=spec, learning_rate=1e-2, epochs=1, out_dir=str(tmp_path / "trial")))
    assert result["status"] == "ok", result["reason"]
    assert result["params"]["trainable"] == delta.count_parameters(spec, tiny_model().config).trainable
    assert result["dev_metric"] is not None and result["test"] and (tmp_path / "trial" / "delta").is_dir()
    config = delta.parse_spec(spec).methods[0]
    entry = registry.method_of(config)
    assert registry.rate_family(config) == "toyshift" and entry.extra_loss(config) == 0.0
    assert entry.checkpointing_refusal(config, None, None) is None and entry.soup is None
    assert why_not_soup([spec, spec]).startswith("only LoRA (with BitFit) deltas are souped, not toyshift")
    assert registry.sizes("toyshift") == () and registry.wider("toyshift", "targets", "value") is None
    assert registry.inner_field("toyshift") is None and "toyshift" not in registry.mixable()
    assert registry.in_gate_order(["toyshift", "lora", "adapter"]) == ["adapter", "lora", "toyshift"]  # no row: last


def test_the_toy_has_no_peft_form_and_says_why(toy):
    assert peft_reason({"methods": [SPEC["methods"][0]]}).endswith("peft has no toyshift (a test's method)")


def test_a_name_is_registered_once(toy):
    with pytest.raises(ValueError, match="'toyshift'"):
        registry.register(toy.METHOD)
    other = dataclasses.make_dataclass("OtherConfig", [("method", ClassVar[str], "other")],
                                       bases=(MethodConfig,), frozen=True)
    with pytest.raises(ValueError, match="'compacter'"):  # an adapter's alias
        registry.register(registry.Method(other, toy.build, toy.count, aliases={"compacter": {}}))
    assert "other" not in registry.METHODS


NOT_A_METHOD = {("autopelt/export/predict_generation.py", '"prompt"')}  # a generation header's prompt template


def test_no_method_name_is_compared_outside_the_delta_library():
    """The registry is the one place a method is known: a rule of one method kept elsewhere (a loss looked up by
    name, a soup's eligibility, a rate family) is a second place that must change with it."""
    import re

    import autopelt.delta.methods  # noqa: F401  (every built-in method registered)

    names = "|".join(map(re.escape, sorted(set(registry.METHODS) | set(registry.ALIASES), key=len, reverse=True)))
    compared = re.compile(rf"""(?:==|!=|\bin)\s*\(?\s*(["'](?:{names})["'])|(["'](?:{names})["'])\s*(?:==|!=|\bin\b)"""
                          rf"""|\[\s*(["'](?:{names})["'])\s*\]|\.get\(\s*(["'](?:{names})["'])""")
    root = Path(__file__).resolve().parents[1]
    found = set()
    for path in sorted((root / "autopelt").rglob("*.py")):
        if path.relative_to(root).parts[1] == "delta":
            continue
        for line in path.read_text().splitlines():
            for match in compared.finditer(line.split("#")[0]):
                found.add((str(path.relative_to(root)), next(group for group in match.groups() if group)))
    assert found - NOT_A_METHOD == set(), "a rule of one method kept outside autopelt/delta/: make it a hook on its entry"


def test_no_method_config_class_is_named_outside_the_delta_library():
    """An isinstance on a method's config class (or its import) outside autopelt/delta/ is a rule of that method kept
    elsewhere, as a name compared is: the entry's hooks answer for it (`registry.innermost` for a wrapper's delta)."""
    import re

    import autopelt.delta.methods  # noqa: F401  (every built-in method registered)

    classes = re.compile(r"\b(" + "|".join(config.__name__ for config in registry.METHODS.values()) + r")\b")
    root = Path(__file__).resolve().parents[1]
    named = {(str(path.relative_to(root)), match.group(1)) for path in sorted((root / "autopelt").rglob("*.py"))
             if path.relative_to(root).parts[1] != "delta"
             for line in path.read_text().splitlines() for match in classes.finditer(line.split("#")[0])}
    assert named == set()

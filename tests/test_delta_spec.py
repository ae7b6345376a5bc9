"""Delta specs: validation with one-line errors, JSON round trips, presets, unsupported models."""

from __future__ import annotations

import json

import pytest
from conftest import tiny_config, tiny_model

from autopelt import delta
from autopelt.delta.spec import METHODS
from autopelt.errors import UserError


@pytest.mark.parametrize("name", sorted(delta.PRESETS))
def test_every_preset_parses_and_round_trips_through_json(name):
    spec = delta.parse_spec(delta.PRESETS[name])
    assert delta.parse_spec(spec.to_json()) == spec
    assert delta.parse_spec(json.loads(spec.to_json())).to_dict() == spec.to_dict()
    assert spec.summary()


def test_unipelt_presets_follow_the_paper():
    apl = delta.parse_spec(delta.PRESETS["unipelt_apl"])
    assert [m.method for m in apl.methods] == ["adapter", "prefix", "lora"]
    assert all(m.gate for m in apl.methods)
    adapter, prefix, lora = apl.methods
    assert (adapter.bottleneck, prefix.length, lora.rank, lora.targets) == (48, 10, 8, ("query", "value"))
    assert (adapter.placement, prefix.split_gate) == ("pfeiffer", False)  # AdapterHub's Pfeiffer, one prefix gate
    assert not delta.parse_spec(delta.PRESETS["unipelt_apl_nogate"]).is_gated


def test_single_method_presets_follow_their_references():
    (adamix,) = delta.parse_spec(delta.PRESETS["adamix"]).methods
    soup = adamix.delta
    assert (adamix.experts, adamix.share_up, adamix.consistency, adamix.expert_init) == (4, True, 1.0, "copy")
    assert (soup.placement, soup.activation, soup.bottleneck) == ("ffn", "gelu", 48)
    assert delta.parse_spec({"methods": [{"method": "adamix"}]}) == delta.parse_spec(delta.PRESETS["adamix"])
    inner = delta.parse_spec({"methods": [{"method": "adamix", "delta": {"method": "adapter", "bottleneck": 16}}]})
    assert (inner.methods[0].delta.placement, inner.methods[0].delta.activation) == ("ffn", "gelu")
    (bitfit,) = delta.parse_spec(delta.PRESETS["bitfit"]).methods
    assert (bitfit.targets, bitfit.layers, bitfit.pooler) == (None, None, True)
    assert delta.parse_spec(delta.PRESETS["adapter"]).methods[0].placement == "pfeiffer"


def test_new_method_presets_and_their_summaries():
    summaries = {name: delta.parse_spec(delta.PRESETS[name]).summary() for name in ("ia3", "dora", "rslora", "vera")}
    assert summaries == {"ia3": "ia3", "dora": "dora r8", "rslora": "rslora r8", "vera": "vera r1024"}
    (dora,) = delta.parse_spec(delta.PRESETS["dora"]).methods
    (lora,) = delta.parse_spec(delta.PRESETS["lora"]).methods
    assert dora == type(lora)(**{**vars(lora), "dora": True})  # LoRA's setting, with the magnitude
    (vera,) = delta.parse_spec(delta.PRESETS["vera"]).methods
    assert (vera.targets, vera.d_initial, vera.projection_seed) == (("query", "value"), 0.1, 0)


def test_adapter_preset_names_normalise():
    spec = delta.parse_spec({"methods": [{"method": "compacter++", "n": 8, "bottleneck": 16}]})
    (adapter,) = spec.methods
    assert (adapter.method, adapter.placement, adapter.projection, adapter.n) == ("adapter", "pfeiffer", "compacter", 8)
    assert spec.summary() == "compacter++ k16 n8"


@pytest.mark.parametrize("bad, words", [
    ({"methods": [{"method": "lorra"}]}, "unknown method 'lorra'"),
    ({"methods": [{"method": "lora", "rnk": 4}]}, "unknown field 'rnk' for method 'lora'"),
    ({"methods": [{"method": "lora", "rank": 0}]}, "lora.rank = 0"),
    ({"methods": [{"method": "lora", "rank": "8"}]}, "lora.rank = '8'"),
    ({"methods": [{"method": "lora", "targets": ["qkvo"]}]}, "lora.targets"),
    ({"methods": [{"method": "adapter", "placement": "middle"}]}, "adapter.placement"),
    ({"methods": [{"method": "adamix", "expert_init": "random"}]}, "adamix.expert_init = 'random'"),
    ({"methods": [{"method": "prefix", "split_gate": 1}]}, "prefix.split_gate"),
    ({"methods": [{"method": "bitfit", "pooler": "yes"}]}, "bitfit.pooler"),
    ({"methods": [{"method": "compacter", "bottleneck": 10, "n": 4}]}, "multiple of n=4"),
    ({"methods": [{"method": "prefix", "gate": "yes"}]}, "prefix.gate"),
    ({"methods": [{"method": "bitfit", "targets": ["pooler"]}]}, "bitfit.targets"),
    ({"methods": [{"method": "adamix", "delta": {"method": "prefix"}}]}, "adamix.delta"),
    ({"methods": [{"method": "adamix", "delta": {"method": "lora", "gate": True}}]}, "ungated"),
    ({"methods": [{"method": "lora"}, {"method": "adamix", "delta": {"method": "lora"}}]}, "one lora entry"),
    ({"methods": [{"method": "lora", "dora": True, "gate": True}]}, "lora.dora = True is invalid"),
    ({"methods": [{"method": "lora", "rslora": "yes"}]}, "lora.rslora = 'yes'"),
    ({"methods": [{"method": "adamix", "delta": {"method": "lora", "dora": True}}]}, "without dora"),
    ({"methods": [{"method": "ia3", "targets": ["qkvo"]}]}, "ia3.targets"),
    ({"methods": [{"method": "ia3", "targets": []}]}, "ia3.targets"),
    ({"methods": [{"method": "ia3", "gate": True}]}, "unknown field 'gate' for method 'ia3'"),
    ({"methods": [{"method": "vera", "rank": 0}]}, "vera.rank = 0"),
    ({"methods": [{"method": "vera", "d_initial": 0}]}, "vera.d_initial = 0"),
    ({"methods": [{"method": "vera", "dropout": 1.0}]}, "vera.dropout = 1.0"),
    ({"methods": [{"method": "vera", "projection_seed": -1}]}, "vera.projection_seed = -1"),
    ({"methods": [{"method": "vera", "projection_seed": 0.5}]}, "vera.projection_seed = 0.5"),
    ({"methods": [{"method": "vera"}, {"method": "vera", "rank": 4}]}, "one vera entry"),
    ({"methods": [{"method": "prefix", "shift_positions": 1}]}, "prefix.shift_positions"),
    ({"methods": []}, "at least one method"),
    ({"methods": [{"rank": 8}]}, "\"method\" field"),
    ({"method": "lora"}, "{\"methods\": [...]}"),
    ("{not json", "not valid JSON"),
])
def test_bad_specs_give_one_line_errors(bad, words):
    with pytest.raises(UserError) as error:
        delta.parse_spec(bad)
    assert words in str(error.value)
    assert "\n" not in str(error.value)


def test_spec_from_a_file_and_a_missing_file(tmp_path):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(delta.PRESETS["lora"]))
    assert delta.parse_spec(str(path)) == delta.parse_spec(delta.PRESETS["lora"])
    with pytest.raises(UserError, match="cannot read delta spec"):
        delta.parse_spec(str(tmp_path / "nope.json"))


@pytest.mark.parametrize("spec, words", [
    ({"methods": [{"method": "lora", "layers": [5]}]}, "layer 5 does not exist"),
    ({"methods": [{"method": "compacter", "n": 3, "bottleneck": 9}]}, "must divide the model's hidden size 32"),
    ({"methods": [{"method": "lora", "rank": 64}]}, "exceeds the smallest adapted dimension"),
])
def test_specs_that_do_not_fit_the_model(spec, words):
    with pytest.raises(UserError, match=words):
        delta.count_parameters(spec, tiny_config())
    with pytest.raises(UserError, match=words):
        delta.apply_delta(tiny_model(), spec)


def test_an_architecture_autopelt_cannot_read_is_a_clear_error():
    """An undeclared type is read by its structure (test_discover.py); an undeclared encoder-decoder cannot be."""
    from transformers import PegasusConfig

    with pytest.raises(UserError, match="model type 'pegasus' is an encoder-decoder autopelt does not know; declare"):
        delta.count_parameters(delta.PRESETS["lora"], PegasusConfig(vocab_size=100, d_model=32, encoder_layers=1,
                                                                    decoder_layers=1))


def test_loading_a_delta_whose_weights_do_not_match_fails_cleanly(tmp_path):
    model = delta.apply_delta(tiny_model(), delta.PRESETS["lora"])
    delta.save_delta(model, delta.PRESETS["lora"], tmp_path)
    header = json.loads((tmp_path / "delta.json").read_text())
    header["spec"] = delta.parse_spec(delta.PRESETS["bitfit"]).to_dict()
    (tmp_path / "delta.json").write_text(json.dumps(header))
    with pytest.raises(UserError, match="does not match its spec"):
        delta.load_delta(tiny_model(), tmp_path)
    with pytest.raises(UserError, match="not an autopelt delta folder"):
        delta.load_delta(tiny_model(), tmp_path / "missing")


def test_every_method_is_documented_and_says_what_each_field_accepts():
    import dataclasses

    from autopelt.delta.fields import kind_of

    for cls in METHODS.values():
        assert cls.summary
        for field in dataclasses.fields(cls):
            assert field.metadata.get("help"), f"{cls.method}.{field.name} has no help text"
            kind = kind_of(field)
            assert kind is not None, f"{cls.method}.{field.name} declares no kind (delta/fields.py)"
            default = field.default.to_dict() if hasattr(field.default, "to_dict") else field.default
            assert kind.accepts(field.default), f"{cls.method}.{field.name}: its default {default!r} is refused"

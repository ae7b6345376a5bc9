"""Parity with peft: our LoRA equals peft's given the same weights, and exports load in peft."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_batch, tiny_model

from autopelt import delta
from autopelt.delta.peft_export import export_peft, peft_expressible
from autopelt.errors import UserError

peft = pytest.importorskip("peft")

EXPORTABLE = {
    "lora": {"methods": [{"method": "lora", "rank": 4, "alpha": 8}]},
    "lora_sites_layers": {"methods": [{"method": "lora", "rank": 2, "layers": [1],
                                       "targets": ["key", "attention_output", "intermediate", "output"]}]},
    "lora+bitfit": {"methods": [{"method": "lora", "rank": 4}, {"method": "bitfit"}]},  # bias="all"
    "lora+bitfit_lora_only": {"methods": [{"method": "lora", "rank": 4, "targets": ["value", "output"]},
                                          {"method": "bitfit", "targets": ["value", "output"], "pooler": False}]},
    "adamix_lora": {"methods": [{"method": "adamix", "experts": 3, "delta": {"method": "lora", "rank": 4}}]},
}


def trained(spec, family):
    model = delta.apply_delta(tiny_model(family), spec)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():  # stand-in for training: every trainable tensor moves
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.3 * torch.randn(p.shape, generator=generator))
    return model.eval()


@pytest.mark.parametrize("family", ["bert", "roberta"])
@pytest.mark.parametrize("name", EXPORTABLE)
def test_export_loads_in_peft_with_the_same_logits(name, family, tmp_path):
    from peft import PeftModel

    model = trained(EXPORTABLE[name], family)
    batch = tiny_batch()
    expected = model(**batch).logits
    export_peft(model, EXPORTABLE[name], tmp_path)
    loaded = PeftModel.from_pretrained(tiny_model(family), str(tmp_path)).eval()
    torch.testing.assert_close(loaded(**batch).logits, expected, rtol=1e-5, atol=1e-5)
    merged = loaded.merge_and_unload()
    torch.testing.assert_close(merged(**batch).logits, expected, rtol=1e-4, atol=1e-5)


def peft_trainable(peft_model) -> set[str]:
    """What peft would train, under our parameter names."""
    names = set()
    for name, p in peft_model.named_parameters():
        if p.requires_grad:
            name = name.removeprefix("base_model.model.").replace(".default.", ".")
            names.add(name.replace(".modules_to_save.", ".").replace(".original_module.", "."))
    return names


@pytest.mark.parametrize("family", ["bert", "roberta"])
@pytest.mark.parametrize("name", EXPORTABLE)
def test_the_exported_config_trains_only_what_the_delta_trained(name, family, tmp_path):
    from peft import PeftModel

    model = trained(EXPORTABLE[name], family)
    export_peft(model, EXPORTABLE[name], tmp_path)
    loaded = PeftModel.from_pretrained(tiny_model(family), str(tmp_path), is_trainable=True)
    assert peft_trainable(loaded) == {n for n, p in model.named_parameters() if p.requires_grad}


def test_our_lora_forward_equals_peft_lora_given_the_same_weights():
    from peft import LoraConfig, get_peft_model

    spec = {"methods": [{"method": "lora", "rank": 4, "alpha": 16, "targets": ["query", "value"]}]}
    ours = trained(spec, "bert")
    reference = get_peft_model(tiny_model("bert"), LoraConfig(r=4, lora_alpha=16, target_modules=["query", "value"]))
    theirs = dict(reference.named_parameters())
    copied = 0
    with torch.no_grad():
        for name, p in ours.named_parameters():
            if ".lora_" in name:
                peft_name = "base_model.model." + name.replace(".lora_A.", ".lora_A.default.").replace(
                    ".lora_B.", ".lora_B.default.")
                theirs[peft_name].copy_(p)
                copied += 1
            elif name.startswith("classifier"):
                theirs["base_model.model." + name].copy_(p)
    assert copied == 2 * 2 * 2  # A and B, query and value, two layers
    batch = tiny_batch()
    torch.testing.assert_close(reference.eval()(**batch).logits, ours(**batch).logits, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("spec", [
    {"methods": [{"method": "lora", "gate": True}]},
    {"methods": [{"method": "lora"}, {"method": "pfeiffer"}]},
    {"methods": [{"method": "bitfit"}]},
    {"methods": [{"method": "lora"}, {"method": "bitfit", "targets": ["value"]}]},  # peft would train other biases
    {"methods": [{"method": "lora"}, {"method": "bitfit", "pooler": False}]},
    {"methods": [{"method": "lora"}, {"method": "bitfit", "targets": ["query", "value"], "layers": [1],
                                      "pooler": False}]},
])
def test_deltas_without_a_peft_form_are_refused(spec, tmp_path):
    assert not peft_expressible(spec)
    model = delta.apply_delta(tiny_model(), spec)
    with pytest.raises(UserError, match="no peft form") as error:
        export_peft(model, spec, tmp_path)
    assert "\n" not in str(error.value)

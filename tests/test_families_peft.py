"""Parity with peft on every family beyond BERT, RoBERTa, Llama, GPT-2 and T5 where peft can hold the delta: the
exported peft folder, loaded by peft onto the same base weights, gives the logits autopelt's model gives (so peft's
LoRA, (IA)³ and VeRA forward equals ours on the same weights), and merges to them too."""

from __future__ import annotations

import pytest
import torch
from conftest import moved, tiny_batch
from familymodels import NEW_DECODERS, NEW_ENCODERS, family_model

from autopelt import delta
from autopelt.delta.peft_export import export_peft

peft = pytest.importorskip("peft")

EXPORTABLE = {
    "lora": {"methods": [{"method": "lora", "rank": 4, "alpha": 8}]},
    "lora_every_site_one_layer": {"methods": [{"method": "lora", "rank": 2, "layers": [1], "targets": [
        "query", "key", "value", "attention_output", "intermediate", "output"]}]},
    "dora": {"methods": [{"method": "lora", "rank": 4, "dora": True, "rslora": True}]},
    "ia3": {"methods": [{"method": "ia3"}]},
    "vera": {"methods": [{"method": "vera", "rank": 16, "projection_seed": 2}]},
}
FAMILIES = NEW_ENCODERS + NEW_DECODERS + ("bart",)


def batch_for(family: str) -> dict:
    batch = tiny_batch()
    if family == "bart":  # its classifier reads the last </s> (2) of every row
        for row, length in enumerate(batch["attention_mask"].sum(1).tolist()):
            batch["input_ids"][row, length - 1] = 2
    return batch


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", EXPORTABLE)
def test_export_loads_in_peft_with_the_same_logits(name, family, tmp_path):
    from peft import PeftModel

    spec = EXPORTABLE[name]
    model = moved(delta.apply_delta(family_model(family), spec))
    batch = batch_for(family)
    with torch.no_grad():
        expected = model(**batch).logits
    export_peft(model, spec, tmp_path)
    loaded = PeftModel.from_pretrained(family_model(family), str(tmp_path)).eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(**batch).logits, expected, rtol=1e-5, atol=1e-5)

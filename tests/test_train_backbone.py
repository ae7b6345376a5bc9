"""Backbone dropout and attention implementation: what each setting turns off, and that a delta's dropout stays."""

import pytest
import torch
from torch import nn

from autopelt import delta
from autopelt.errors import UserError
from autopelt.train.backbone import set_attention, set_backbone_dropout
from autopelt.train.settings import TrialSettings
from tests.conftest import tiny_model


def tiny_bert():
    return tiny_model("bert", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)


def _rates(model):
    return {name: module.p for name, module in model.named_modules() if isinstance(module, nn.Dropout)}


def test_model_keeps_every_dropout():
    model = tiny_bert()
    before = _rates(model)
    assert set_backbone_dropout(model, "model") == 0
    assert _rates(model) == before


def test_attention_off_zeroes_only_the_attention_probabilities():
    model = tiny_bert()
    set_backbone_dropout(model, "attention-off")
    rates = _rates(model)
    attention = {n: p for n, p in rates.items() if n.endswith("attention.self.dropout")}
    others = {n: p for n, p in rates.items() if n not in attention}
    assert attention and all(p == 0 for p in attention.values())
    assert others and all(p > 0 for p in others.values())


def test_off_makes_a_training_forward_deterministic_and_keeps_the_delta_dropout():
    model = tiny_bert()
    set_backbone_dropout(model, "off")
    delta.apply_delta(model, {"methods": [{"method": "lora", "rank": 4, "dropout": 0.1}]}, seed=0)
    lora_rates = [p for n, p in _rates(model).items() if n.endswith(("query.dropout", "value.dropout"))]
    assert lora_rates and all(p == 0.1 for p in lora_rates)
    for module in model.modules():  # the LoRA dropout off too, to see the backbone alone
        if isinstance(module, nn.Dropout):
            module.p = 0.0 if module.p == 0.1 else module.p
    model.train()
    ids = torch.randint(0, model.config.vocab_size, (2, 9))
    assert torch.equal(model(input_ids=ids).logits, model(input_ids=ids).logits)


def test_attention_implementations_agree():
    model = tiny_bert().eval()
    ids = torch.randint(0, model.config.vocab_size, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    set_attention(model, "eager")
    eager = model(input_ids=ids, attention_mask=mask).logits
    set_attention(model, "sdpa")
    assert torch.allclose(model(input_ids=ids, attention_mask=mask).logits, eager, atol=1e-5)


@pytest.mark.parametrize("field, value", [("backbone_dropout", "none"), ("attention", "flash")])
def test_bad_settings_are_one_line_errors(field, value):
    with pytest.raises(UserError, match=field):
        TrialSettings(task="sst2", spec={"methods": []}, **{field: value})


def test_the_default_is_off_and_settings_stored_before_the_field_read_as_trained():
    assert TrialSettings(task="sst2", spec={"methods": []}).backbone_dropout == "off"
    stored = TrialSettings(task="sst2", spec={"methods": []}).to_dict()
    del stored["backbone_dropout"]
    assert TrialSettings.from_dict(stored).backbone_dropout == "model"

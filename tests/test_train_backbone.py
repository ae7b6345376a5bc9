"""Backbone dropout and attention implementation: what each setting turns off, and that a delta's dropout stays."""

import pytest
import torch
from decodermodels import DECODER_FAMILIES, tiny_decoder_config
from torch import nn

from autopelt import delta
from autopelt.errors import UserError
from autopelt.train import backbone
from autopelt.train.backbone import choose_attention, set_attention, set_backbone_dropout
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


def test_auto_times_both_on_a_cpu_once_per_shape_and_leaves_the_trial_untouched(monkeypatch):
    monkeypatch.delenv(backbone.ATTENTION_ENV, raising=False)
    monkeypatch.setattr(backbone, "_CHOSEN", {})
    timed = []
    monkeypatch.setattr(backbone, "time_attention", lambda *a: timed.append(a) or backbone_time(*a))
    model = tiny_bert().train()
    before = {n: p.detach().clone() for n, p in model.state_dict().items()}
    batch = {"input_ids": torch.randint(0, 100, (4, 20)), "attention_mask": torch.ones(4, 20, dtype=torch.long)}
    state = torch.get_rng_state()
    choice = choose_attention("auto", model, batch, torch.device("cpu"), None, "model")
    assert choice["by"] == "measured" and set(choice["seconds"]) == {"sdpa", "eager"}
    assert choice["attention"] == min(choice["seconds"], key=choice["seconds"].get)
    assert torch.equal(torch.get_rng_state(), state)  # the trial's dropout masks are those it would draw anyway
    assert all(torch.equal(p, before[n]) for n, p in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert choose_attention("auto", model, batch, torch.device("cpu"), None, "model") == choice
    assert len(timed) == 1  # the same shape: not timed again
    choose_attention("auto", model, {k: v[:, :5] for k, v in batch.items()}, torch.device("cpu"), None, "model")
    assert len(timed) == 1  # 5 and 20 tokens round to the same width
    choose_attention("auto", model, batch, torch.device("cpu"), None, "off")
    assert len(timed) == 2  # another dropout: another cost


backbone_time = backbone.time_attention


@pytest.mark.parametrize("family", DECODER_FAMILIES)
def test_a_step_is_timed_through_every_familys_layers_and_no_weight_gets_a_gradient(family):
    """T5's forward embeds with its encoder's and decoder's `embed_tokens`, tied to `shared` (its
    `get_input_embeddings()`): all three are the token embeddings, the relative position bias is not."""
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(tiny_decoder_config(family)).train()
    embedded = {name for name, module in model.named_modules() if module in backbone.token_embeddings(model)}
    t5 = {"transformer.shared", "transformer.encoder.embed_tokens", "transformer.decoder.embed_tokens"}
    assert embedded == t5 if family.startswith("t5") else len(embedded) == 1
    ids = torch.randint(3, 100, (2, 9))
    ids[:, -1] = model.config.eos_token_id  # T5's classifier reads the decoder at each row's one <eos>
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    seconds = backbone_time(model, batch, torch.device("cpu"), None, rounds=1)
    assert set(seconds) == {"sdpa", "eager"} and all(0 < s < float("inf") for s in seconds.values())
    assert all(p.grad is None for p in model.parameters())


def test_a_language_models_head_tied_to_the_token_embeddings_is_not_one_of_them():
    from decodermodels import tiny_decoder

    model = tiny_decoder("llama", lm=True)  # tie_word_embeddings: lm_head.weight is embed_tokens.weight
    assert model.lm_head.weight is model.get_input_embeddings().weight
    assert backbone.token_embeddings(model) == [model.get_input_embeddings()]


def test_a_model_whose_logits_no_gradient_reaches_is_one_line(monkeypatch):
    monkeypatch.setattr(backbone, "token_embeddings", lambda model: [])
    batch = {"input_ids": torch.randint(3, 100, (2, 9))}
    with pytest.raises(UserError, match="no gradient reaches a bert model's logits.*pass --attention sdpa or eager"):
        backbone_time(tiny_bert(), batch, torch.device("cpu"), None)


def test_auto_is_sdpa_on_cuda_and_the_environment_decides_untimed(monkeypatch):
    monkeypatch.setattr(backbone, "time_attention", lambda *a: pytest.fail("timed"))
    model, batch = tiny_bert(), {"input_ids": torch.ones(2, 4, dtype=torch.long)}
    monkeypatch.delenv(backbone.ATTENTION_ENV, raising=False)
    assert choose_attention("auto", model, batch, torch.device("cuda"), None, "model")["attention"] == "sdpa"
    monkeypatch.setenv(backbone.ATTENTION_ENV, "eager")
    assert choose_attention("auto", model, batch, torch.device("cpu"), None, "model") == {
        "attention": "eager", "by": backbone.ATTENTION_ENV, "seconds": None}
    assert choose_attention("sdpa", model, batch, torch.device("cpu"), None, "model")["attention"] == "sdpa"
    monkeypatch.setenv(backbone.ATTENTION_ENV, "flash")
    with pytest.raises(UserError, match=backbone.ATTENTION_ENV):
        choose_attention("auto", model, batch, torch.device("cpu"), None, "model")


@pytest.mark.parametrize("preset", sorted(delta.PRESETS))
def test_every_preset_trains_and_predicts_alike_with_either_attention(preset):
    model = delta.apply_delta(tiny_bert(), delta.PRESETS[preset], seed=0)
    ids = torch.randint(3, model.config.vocab_size, (3, 9))
    mask = torch.ones_like(ids)
    mask[2, 6:] = 0
    logits = {}
    for implementation in ("eager", "sdpa"):
        set_attention(model, implementation)
        model.train()
        delta.route_all(model, torch.Generator().manual_seed(0)) if delta.has_mixtures(model) else None
        model(input_ids=ids, attention_mask=mask).logits.sum().backward()
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters() if p.requires_grad)
        model.zero_grad()
        logits[implementation] = model.eval()(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(logits["sdpa"], logits["eager"], rtol=1e-5, atol=1e-5)


def test_auto_is_timed_once_per_machine_through_the_cache_file(monkeypatch, tmp_path):
    monkeypatch.delenv(backbone.ATTENTION_ENV, raising=False)
    monkeypatch.setattr(backbone, "_CHOSEN", {})
    timed = []
    monkeypatch.setattr(backbone, "time_attention", lambda *a: timed.append(1) or {"sdpa": 2.0, "eager": 1.0})
    model, cache = tiny_bert(), tmp_path / "cache" / "attention.json"
    batch = {"input_ids": torch.ones(4, 20, dtype=torch.long)}
    first = choose_attention("auto", model, batch, torch.device("cpu"), None, "model", cache)
    assert first["attention"] == "eager" and len(timed) == 1 and cache.exists()
    monkeypatch.setattr(backbone, "_CHOSEN", {})  # another process on the same machine
    assert choose_attention("auto", model, batch, torch.device("cpu"), None, "model", cache) == first
    assert len(timed) == 1
    cache.write_text("not json")
    monkeypatch.setattr(backbone, "_CHOSEN", {})
    assert choose_attention("auto", model, batch, torch.device("cpu"), None, "model", cache) == first
    assert len(timed) == 2  # an unreadable cache is timed again, and written anew


CHECKPOINTED = ("lora", "dora", "vera", "ia3", "adapter", "houlsby", "compacter", "prompt", "adamix",
                "unipelt_apl_nogate", "prefix", "unipelt_apl", "unipelt_al")  # prefix: on an encoder and T5 (a
# decoder's is refused, below); UniPELT's gates averaged over the real tokens recompute with their pass's mask
CHECKPOINTED_SPECS = {**delta.PRESETS, "unipelt_al": {"methods": [  # UniPELT's gates without a prefix: decoders too
    {"method": "adapter", "placement": "pfeiffer", "bottleneck": 8, "gate": True},
    {"method": "lora", "rank": 4, "targets": ["query", "value"], "gate": True}]}}


def _delta_grads(model, spec, batch, checkpointing: bool) -> dict:
    set_backbone_dropout(model, "off")
    backbone.set_gradient_checkpointing(model, checkpointing, spec)
    delta.apply_delta(model, spec, seed=0)
    model.train()
    for module in model.modules():  # the delta's own dropout too: both runs draw nothing
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    out = model(**batch)
    out.logits.float().pow(2).mean().backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad and p.grad is not None}


def _fresh(family: str):
    from tests.decodermodels import tiny_decoder

    return tiny_model("bert") if family == "bert" else tiny_decoder(family, lm=True)


@pytest.mark.parametrize("family", ["bert", "llama", "gpt2", "t5"])
@pytest.mark.parametrize("name", CHECKPOINTED)
def test_gradient_checkpointing_gives_the_same_gradients(family, name):
    """Recomputed activations, the same backward: every delta parameter's gradient equal with and without, on an
    encoder classifier, on decoder language models and on T5."""
    from tests.decodermodels import decoder_batch

    spec = CHECKPOINTED_SPECS[name]
    if family in ("llama", "gpt2") and any(m.method == "prefix" for m in delta.parse_spec(spec).methods):
        pytest.skip("a decoder's prefix is refused with checkpointing (tested below)")
    batch = decoder_batch(family, batch_size=3, seq_len=9)
    plain = _delta_grads(_fresh(family), spec, batch, checkpointing=False)
    checkpointed = _delta_grads(_fresh(family), spec, batch, checkpointing=True)
    assert plain.keys() == checkpointed.keys() and plain
    for key in plain:
        torch.testing.assert_close(checkpointed[key], plain[key], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("family, name, message", [
    ("llama", "unipelt_ap", "llama prefix travels in the key/value cache"),
    ("llama", "prefix", "llama prefix travels in the key/value cache"),
    ("gpt2", "unipelt_apl_nogate", "gpt2 prefix travels in the key/value cache"),
    ("t5", "peft_prefix", "t5 prefix travels in the key/value cache"),  # peft's form, in the decoder's cache
])
def test_gradient_checkpointing_is_refused_in_one_line_where_it_would_change_the_gradients(family, name, message):
    specs = {**delta.PRESETS, "peft_prefix": {"methods": [{"method": "prefix", "shift_positions": True}]}}
    with pytest.raises(UserError, match=message):
        backbone.set_gradient_checkpointing(_fresh(family), True, specs[name])


def test_gradient_checkpointing_is_a_setting_and_refused_where_the_model_cannot(monkeypatch):
    model = tiny_model("bert")
    monkeypatch.setattr(type(model), "supports_gradient_checkpointing", False)
    with pytest.raises(UserError, match="cannot checkpoint bert models"):
        backbone.set_gradient_checkpointing(model, True)
    backbone.set_gradient_checkpointing(model, False)  # off: nothing asked of the model
    with pytest.raises(UserError, match="gradient_checkpointing"):
        TrialSettings(task="sst2", spec={"methods": []}, gradient_checkpointing="yes")


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_a_regression_head_starts_at_the_training_labels_mean(family):
    model = tiny_model(family, num_labels=1)
    ids = torch.randint(3, 100, (4, 9))
    assert backbone.center_regression_head(model, [2.5, 3.0, 3.5, 3.0])
    with torch.no_grad():
        outputs = model(input_ids=ids).logits
    # the output layer's weights are small at initialisation: every row starts near the mean, not near zero
    assert outputs.shape == (4, 1) and torch.allclose(outputs, torch.full((4, 1), 3.0), atol=0.5)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_bias_free_regression_head_is_given_a_bias_at_the_labels_mean(family):
    from autopelt.delta.sites import model_class

    config = tiny_decoder_config(family, num_labels=1)
    model = model_class(config, False).from_config(config)
    weight = model.score.weight.clone()
    assert model.score.bias is None
    assert backbone.center_regression_head(model, [3.0, 3.2])
    assert torch.equal(model.score.weight, weight) and model.score.bias.shape == (1,)
    assert float(model.score.bias.detach()) == pytest.approx(3.1)
    assert "score.bias" in dict(model.named_parameters())  # so the optimiser and the saved delta hold it

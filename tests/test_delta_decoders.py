"""The delta library's behaviour, method by method, on tiny random Llama, GPT-2 and T5 models."""

from __future__ import annotations

import pytest
import torch
from decodermodels import DECODER_FAMILIES, decoder_batch, row_alone, tiny_decoder

from autopelt import delta
from autopelt.errors import UserError

CASES = {
    "lora": {"methods": [{"method": "lora", "rank": 4}]},
    "lora_every_site_some_layers": {"methods": [{"method": "lora", "rank": 2, "dropout": 0.1, "layers": [1],
        "targets": ["query", "key", "value", "attention_output", "intermediate", "output"]}]},
    "lora_gated": {"methods": [{"method": "lora", "rank": 4, "gate": True}]},
    "rslora": {"methods": [{"method": "lora", "rank": 4, "rslora": True, "targets": ["key", "output"]}]},
    "dora": {"methods": [{"method": "lora", "rank": 4, "dora": True, "targets": ["value", "attention_output"]}]},
    "vera": {"methods": [{"method": "vera", "rank": 16, "targets": ["query", "value", "intermediate"]}]},
    "vera_gated": {"methods": [{"method": "vera", "rank": 8, "gate": True}]},
    "ia3": {"methods": [{"method": "ia3"}]},
    "houlsby": {"methods": [{"method": "houlsby", "bottleneck": 8}]},
    "pfeiffer": {"methods": [{"method": "pfeiffer", "bottleneck": 8, "activation": "gelu"}]},
    "adapter_gated": {"methods": [{"method": "adapter", "bottleneck": 8, "gate": True}]},
    "phm_adapter": {"methods": [{"method": "phm_adapter", "bottleneck": 8, "n": 4}]},
    "compacter++": {"methods": [{"method": "compacter++", "bottleneck": 8, "n": 2, "phm_rank": 2}]},
    "adamix_adapter": {"methods": [{"method": "adamix", "experts": 3, "delta": {"method": "adapter", "bottleneck": 8}}]},
    "adamix_lora": {"methods": [{"method": "adamix", "experts": 2, "delta": {"method": "lora", "rank": 4}}]},
    "unipelt_al": {"methods": [{"method": "pfeiffer", "bottleneck": 8, "gate": True},
                               {"method": "lora", "rank": 4, "gate": True}]},
    "dora+vera+ia3+ffn_adapter_same_site": {"methods": [
        {"method": "lora", "rank": 2, "dora": True, "targets": ["value", "output"]},
        {"method": "vera", "rank": 4, "targets": ["value", "output"]},
        {"method": "ia3", "targets": ["value", "output"]},
        {"method": "adapter", "placement": "ffn", "bottleneck": 4}]},
    "prefix": {"methods": [{"method": "prefix", "length": 3, "reparam_hidden": 16}]},
    "prefix_shifted+lora": {"methods": [{"method": "prefix", "length": 3, "reparam_hidden": 0,
                                         "shift_positions": True}, {"method": "lora", "rank": 2}]},
    "prompt": {"methods": [{"method": "prompt", "length": 4}]},
    "unipelt_apl": {"methods": [{"method": "pfeiffer", "bottleneck": 8, "gate": True},
                                {"method": "prefix", "length": 3, "reparam_hidden": 16, "gate": True},
                                {"method": "lora", "rank": 4, "gate": True}]},
    "prefix_split_gate": {"methods": [{"method": "prefix", "length": 3, "reparam_hidden": 0, "gate": True,
                                       "split_gate": True}]},
    "bitfit": {"methods": [{"method": "bitfit"}]},
}
REFUSED = {("llama", "bitfit"), ("t5", "bitfit"), ("t5", "prefix"), ("t5", "prefix_shifted+lora"),
           ("t5", "unipelt_apl"), ("t5", "prefix_split_gate")}
MERGEABLE = ["lora", "lora_every_site_some_layers", "rslora", "dora", "vera", "ia3", "adamix_lora",
             "dora+vera+ia3+ffn_adapter_same_site"]
PAIRS = [(name, family) for name in CASES for family in DECODER_FAMILIES if (family, name) not in REFUSED]


def changes_output_at_init(name: str) -> bool:
    return "prefix" in name or "prompt" in name or name == "unipelt_apl"


def build(name: str, family: str, seed: int = 0):
    return delta.apply_delta(tiny_decoder(family), CASES[name], seed=seed).eval()


def logits(model, batch):
    return model(**batch).logits


def train_step(model, family: str, steps: int = 1, lr: float = 1e-2):
    model.train()
    optimiser = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    generator = torch.Generator().manual_seed(1)
    for step in range(steps):
        delta.route_all(model, generator)
        batch = decoder_batch(family, seed=step)
        labels = batch["decoder_input_ids"] if family == "t5" else torch.tensor([0, 1, 1])
        model(**batch, labels=labels).loss.backward()
        optimiser.step()
        optimiser.zero_grad()
    return model.eval()


@pytest.mark.parametrize("name, family", PAIRS)
def test_identity_at_init_when_zero_initialised(name, family):
    batch = decoder_batch(family)
    expected = logits(tiny_decoder(family), batch)
    got = logits(build(name, family), batch)
    if changes_output_at_init(name):
        assert not torch.allclose(got, expected, atol=1e-6)
    else:
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name, family", PAIRS)
def test_a_step_changes_only_the_delta_and_head(name, family):
    model = build(name, family)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    train_step(model, family)
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and changed <= trainable
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters() if n not in trainable)
    assert any(not n.startswith("score") for n in changed), "only the head trained"
    assert any(n.startswith("score") for n in changed) == (family != "t5")  # a language model has no task head


@pytest.mark.parametrize("name, family", PAIRS)
def test_analytic_count_equals_counted(name, family):
    model = build(name, family)
    count = delta.count_parameters(CASES[name], model.config, lm=family == "t5")
    assert count.trainable == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert count.stored == sum(t.numel() for t in delta.delta_state(model).values())
    assert count.base == sum(p.numel() for p in tiny_decoder(family).parameters())


@pytest.mark.parametrize("name, family", PAIRS)
def test_save_load_round_trip_gives_the_same_logits(name, family, tmp_path):
    model = train_step(build(name, family), family, steps=2)
    batch = decoder_batch(family)
    expected = logits(model, batch)
    delta.save_delta(model, CASES[name], tmp_path)
    fresh = tiny_decoder(family)
    if family != "t5":
        torch.nn.init.normal_(fresh.score.weight)
    delta.load_delta(fresh, tmp_path)
    torch.testing.assert_close(logits(fresh.eval(), batch), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", DECODER_FAMILIES)
@pytest.mark.parametrize("name", MERGEABLE)
def test_merged_equals_unmerged(name, family):
    model = train_step(build(name, family), family, steps=2)
    batch = decoder_batch(family)
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    expected = logits(model, batch)
    delta.merge(model)
    assert any(not torch.equal(p, weights[n]) for n, p in model.named_parameters() if not p.requires_grad)
    torch.testing.assert_close(logits(model, batch), expected, rtol=1e-5, atol=1e-5)
    delta.unmerge(model)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p, weights[n], rtol=0, atol=1e-6)


def _perturb(model, seed=3):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.requires_grad and not name.startswith("score"):
                p.add_(torch.randn(p.shape, generator=generator) * 0.5)


@pytest.mark.parametrize("name, family", PAIRS)
def test_padding_does_not_change_a_sequence_result(name, family):
    """A row's logits are the same alone and right-padded in a longer batch (the head reads the last real token)."""
    model = build(name, family)
    _perturb(model)
    batch = decoder_batch(family, seq_len=9)
    together = logits(model, batch)[-1]
    alone = logits(model, row_alone(batch, 2))[0]
    torch.testing.assert_close(alone, together, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("family, name, why", [
    ("llama", "bitfit", "bitfit cannot apply to llama: it has no bias terms"),
    ("t5", "bitfit", "bitfit cannot apply to t5: it has no bias terms"),
    ("t5", "prefix", "prefix cannot apply to t5: prefix-tuning on T5"),
])
def test_a_method_that_cannot_apply_is_refused_in_one_line(family, name, why):
    for attempt in (lambda: build(name, family),
                    lambda: delta.count_parameters(CASES[name], tiny_decoder(family).config)):
        with pytest.raises(UserError, match=why) as error:
            attempt()
        assert "\n" not in str(error.value)


@pytest.mark.parametrize("spec, why", [
    ({"methods": [{"method": "prefix", "layers": [0]}]}, "fills the key/value cache of every layer"),
    ({"methods": [{"method": "lora", "targets": ["qkv"]}]}, "llama has no linear site 'qkv'"),
])
def test_decoder_specific_refusals(spec, why):
    with pytest.raises(UserError, match=why):
        delta.apply_delta(tiny_decoder("llama"), spec)


def test_gpt2_query_key_and_value_are_its_fused_c_attn():
    from autopelt.delta.modules.lora import LoRALinear

    model = delta.apply_delta(tiny_decoder("gpt2"), {"methods": [{"method": "lora", "targets": ["query", "value"]}]})
    wrapped = sorted(n for n, m in model.named_modules() if isinstance(m, LoRALinear))
    assert wrapped == ["transformer.h.0.attn.c_attn", "transformer.h.1.attn.c_attn"]


def test_t5_layers_run_over_the_encoder_then_the_decoder_and_cross_sites_are_the_decoders():
    from autopelt.delta.modules.lora import LoRALinear

    spec = {"methods": [{"method": "lora", "targets": ["query", "cross_value"], "layers": [1, 2]}]}
    model = delta.apply_delta(tiny_decoder("t5"), spec)
    assert sorted(n for n, m in model.named_modules() if isinstance(m, LoRALinear)) == [
        "decoder.block.0.layer.0.SelfAttention.q", "decoder.block.0.layer.1.EncDecAttention.v",
        "encoder.block.1.layer.0.SelfAttention.q"]


def test_a_decoder_gate_is_per_token_so_no_token_sees_the_ones_after_it():
    model = build("unipelt_al", "llama", seed=0)
    _perturb(model)
    lm_inputs = decoder_batch("llama", batch_size=1, seq_len=8, padded=False)
    full = model.model(**lm_inputs).last_hidden_state
    head = model.model(**{k: v[:, :5] for k, v in lm_inputs.items()}).last_hidden_state
    torch.testing.assert_close(head[:, :4], full[:, :4], rtol=1e-5, atol=1e-5)  # the last position is the read-out


@pytest.mark.parametrize("name", ["lora", "prefix", "prefix_shifted+lora", "prompt", "unipelt_apl", "houlsby"])
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_batched_left_padded_generation_with_the_cache_equals_one_by_one(name, family):
    """Greedy tokens of each row alone equal those of the row left-padded in a batch, KV cache on."""
    model = delta.apply_delta(tiny_decoder(family, lm=True), CASES[name])
    _perturb(model)
    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(3, 100, (n,), generator=g) for n in (5, 3, 7)]
    width = max(len(r) for r in rows)
    ids = torch.stack([torch.cat([torch.zeros(width - len(r), dtype=torch.long), r]) for r in rows])
    mask = (torch.arange(width)[None] >= torch.tensor([width - len(r) for r in rows])[:, None]).long()
    settings = dict(max_new_tokens=5, do_sample=False, pad_token_id=0, eos_token_id=None)
    together = model.generate(input_ids=ids, attention_mask=mask, **settings)[:, width:]
    for i, row in enumerate(rows):
        alone = model.generate(input_ids=row[None], attention_mask=torch.ones(1, len(row), dtype=torch.long),
                               **settings)[:, len(row):]
        assert alone[0].tolist() == together[i].tolist()


def test_t5_generates_the_same_with_a_soft_prompt_whether_padded_in_a_batch_or_alone():
    """The prompt's ones lead the encoder's mask and the cross-attention's, in the training forward and in
    generate (which runs the encoder once and passes the decoder the unextended mask)."""
    model = delta.apply_delta(tiny_decoder("t5", lm=True), CASES["prompt"])
    _perturb(model)
    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(3, 100, (n,), generator=g) for n in (5, 3, 7)]
    width = max(len(r) for r in rows)
    ids = torch.stack([torch.cat([r, torch.zeros(width - len(r), dtype=torch.long)]) for r in rows])
    mask = (torch.arange(width)[None] < torch.tensor([len(r) for r in rows])[:, None]).long()
    settings = dict(max_new_tokens=5, do_sample=False, pad_token_id=0, eos_token_id=None)
    together = model.generate(input_ids=ids, attention_mask=mask, **settings)
    for i, row in enumerate(rows):
        alone = model.generate(input_ids=row[None], attention_mask=torch.ones(1, len(row), dtype=torch.long),
                               **settings)
        assert alone[0].tolist() == together[i].tolist()
    forward = model(input_ids=ids, attention_mask=mask, decoder_input_ids=together[:, :-1]).logits.argmax(-1)
    assert forward.tolist() == together[:, 1:].tolist()  # teacher forcing agrees with what was generated


def test_gate_values_of_a_decoder_are_readable_per_method_and_layer():
    model = build("unipelt_apl", "llama")
    values = delta.gate_values(model, decoder_batch("llama"))
    assert set(values) == {"adapter", "prefix", "lora"}
    assert set(values["prefix"]) == {"0", "1"} and values["prefix"]["0"] == pytest.approx(0.5)


@pytest.mark.parametrize("model_type", ["qwen2", "mistral"])
@pytest.mark.parametrize("name", ["lora", "ia3", "houlsby", "unipelt_apl"])
def test_the_llama_declaration_serves_qwen2_and_mistral(model_type, name):
    from transformers import AutoConfig, AutoModelForSequenceClassification

    config = AutoConfig.for_model(model_type, vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
                                  max_position_embeddings=64, pad_token_id=0)
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(config).eval()
    batch = decoder_batch("llama")
    expected = logits(model, batch)
    delta.apply_delta(model, CASES[name]).eval()
    if not changes_output_at_init(name):
        torch.testing.assert_close(logits(model, batch), expected, rtol=0, atol=1e-6)
    count = delta.count_parameters(CASES[name], config)
    assert count.trainable == sum(p.numel() for p in model.parameters() if p.requires_grad)

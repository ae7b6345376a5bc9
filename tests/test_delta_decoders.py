"""The delta library's behaviour, method by method, on tiny random Llama, GPT-2 and T5 models."""

from __future__ import annotations

import pytest
import torch
from decodermodels import DECODER_FAMILIES, decoder_batch, is_t5, row_alone, tiny_decoder, tiny_decoder_config

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
    "prefix_upper": {"methods": [{"method": "prefix", "length": 3, "reparam_hidden": 0, "layers": [1]}]},
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
REFUSED = {("llama", "bitfit"), ("t5", "bitfit"), ("t5-gated", "bitfit")}
MERGEABLE = ["lora", "lora_every_site_some_layers", "rslora", "dora", "vera", "ia3", "adamix_lora",
             "dora+vera+ia3+ffn_adapter_same_site"]
PAIRS = [(name, family) for name in CASES for family in DECODER_FAMILIES if (family, name) not in REFUSED]


def changes_output_at_init(name: str) -> bool:
    return "prefix" in name or "prompt" in name or name == "unipelt_apl"


def build(name: str, family: str, seed: int = 0):
    return delta.apply_delta(tiny_decoder(family), CASES[name], seed=seed).eval()


@torch.no_grad()
def logits(model, batch):  # without autograd, whose kernels may round a frozen and a trainable model differently
    return model(**batch).logits


def train_step(model, family: str, steps: int = 1, lr: float = 1e-2):
    model.train()
    optimiser = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    generator = torch.Generator().manual_seed(1)
    for step in range(steps):
        delta.route_all(model, generator)
        batch = decoder_batch(family, seed=step)
        labels = batch["decoder_input_ids"] if is_t5(family) else torch.tensor([0, 1, 1])
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
    assert any(n.startswith("score") for n in changed) == (not is_t5(family))  # a language model has no task head


@pytest.mark.parametrize("name, family", PAIRS)
def test_analytic_count_equals_counted(name, family):
    model = build(name, family)
    count = delta.count_parameters(CASES[name], model.config, lm=is_t5(family))
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
    if not is_t5(family):
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
])
def test_a_method_that_cannot_apply_is_refused_in_one_line(family, name, why):
    for attempt in (lambda: build(name, family),
                    lambda: delta.count_parameters(CASES[name], tiny_decoder(family).config)):
        with pytest.raises(UserError, match=why) as error:
            attempt()
        assert "\n" not in str(error.value)


@pytest.mark.parametrize("family, spec, why", [
    ("llama", {"methods": [{"method": "lora", "targets": ["qkv"]}]}, "llama has no linear site 'qkv'"),
    ("t5", {"methods": [{"method": "prefix", "shift_positions": True, "layers": [2, 3]}]},
     "peft's T5 prefix .prefix.shift_positions. fills every decoder layer's cache"),
])
def test_decoder_specific_refusals(family, spec, why):
    with pytest.raises(UserError, match=why):
        delta.apply_delta(tiny_decoder(family), spec)


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


def test_a_gated_t5_ffn_declares_gate_up_and_down_as_llama_does_and_v1_0_has_no_gate():
    from autopelt.delta.modules.lora import LoRALinear

    spec = {"methods": [{"method": "lora", "targets": ["gate", "intermediate", "output"], "layers": [0]}]}
    model = delta.apply_delta(tiny_decoder("t5-gated"), spec)
    assert sorted(n for n, m in model.named_modules() if isinstance(m, LoRALinear)) == [
        "encoder.block.0.layer.1.DenseReluDense.wi_0", "encoder.block.0.layer.1.DenseReluDense.wi_1",
        "encoder.block.0.layer.1.DenseReluDense.wo"]
    with pytest.raises(UserError, match="t5 has no linear site 'gate'"):
        delta.apply_delta(tiny_decoder("t5"), spec)


def test_mt5_is_declared_as_the_gated_t5_it_is():
    from transformers import AutoModelForSeq2SeqLM, MT5Config

    from autopelt.delta.modules.lora import LoRALinear

    base = tiny_decoder("t5-gated").config.to_dict()
    config = MT5Config(**{k: v for k, v in base.items() if k not in ("model_type", "architectures")})
    model = delta.apply_delta(AutoModelForSeq2SeqLM.from_config(config),
                              {"methods": [{"method": "lora", "targets": ["gate"], "layers": [3]}]})
    assert [n for n, m in model.named_modules() if isinstance(m, LoRALinear)] == [
        "decoder.block.1.layer.2.DenseReluDense.wi_0"]


def test_a_decoder_gate_is_per_token_so_no_token_sees_the_ones_after_it():
    model = build("unipelt_al", "llama", seed=0)
    _perturb(model)
    lm_inputs = decoder_batch("llama", batch_size=1, seq_len=8, padded=False)
    full = model.model(**lm_inputs).last_hidden_state
    head = model.model(**{k: v[:, :5] for k, v in lm_inputs.items()}).last_hidden_state
    torch.testing.assert_close(head[:, :4], full[:, :4], rtol=1e-5, atol=1e-5)  # the last position is the read-out


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_decoder_prefix_limited_to_upper_layers_leaves_the_lower_ones_as_they_were(family):
    """The lower layer sees no prefix (its cache's placeholders and their mask columns are dropped), so its output
    is the base model's at the positions the prefix gives (shift_positions off: the same positions)."""
    batch = decoder_batch(family, batch_size=2, seq_len=6, padded=False)
    base = tiny_decoder(family, lm=True)
    model = delta.apply_delta(tiny_decoder(family, lm=True), CASES["prefix_upper"])
    _perturb(model)
    with torch.no_grad():
        plain = base(**batch, output_hidden_states=True).hidden_states
        prefixed = model(**batch, output_hidden_states=True).hidden_states
    torch.testing.assert_close(prefixed[1], plain[1], rtol=1e-5, atol=1e-6)  # after layer 0
    assert not torch.allclose(prefixed[2], plain[2], atol=1e-3)  # layer 1 attends over its prefix


@pytest.mark.parametrize("name", ["lora", "prefix", "prefix_upper", "prefix_shifted+lora", "prompt", "unipelt_apl",
                                  "houlsby"])
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


@pytest.mark.parametrize("name", ["prompt", "prefix", "prefix_shifted+lora", "unipelt_apl"])
@pytest.mark.parametrize("family", ["t5", "t5-gated"])
def test_t5_generates_the_same_whether_padded_in_a_batch_or_alone(name, family):
    """A prompt's ones lead the encoder's mask and the cross-attention's, in the training forward and in generate
    (which runs the encoder once and passes the decoder the unextended mask); a prefix stays out of the cache, so
    step-by-step decoding with the cache computes what the teacher-forced pass does."""
    model = delta.apply_delta(tiny_decoder(family, lm=True), CASES[name])
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


@pytest.mark.parametrize("attention", ["encoder.block.1.layer.0.SelfAttention", "decoder.block.1.layer.0.SelfAttention",
                                       "decoder.block.1.layer.1.EncDecAttention"])
def test_a_t5_prefix_is_attended_as_keys_and_values_with_no_position_before_every_real_one(attention):
    """The wrapped attention against the formula written out: softmax(q·[P_k; K]ᵀ + [0, bias] + mask)·[P_v; V]."""
    model = delta.apply_delta(tiny_decoder("t5"), {"methods": [{"method": "prefix", "length": 3, "reparam_hidden": 0}]})
    _perturb(model)
    wrapped = model.get_submodule(attention)
    base, seen = wrapped.base_layer, {}
    wrapped.register_forward_hook(lambda m, args, kwargs, out: seen.update(args=args, kwargs=kwargs, out=out),
                                  with_kwargs=True)
    batch = decoder_batch("t5", padded=True)
    with torch.no_grad():
        model(**batch)
        hidden = seen["args"][0] if seen["args"] else seen["kwargs"]["hidden_states"]
        states = seen["kwargs"].get("key_value_states")
        states = hidden if states is None else states
        mask, bias = seen["kwargs"].get("mask"), seen["out"][1]
        split = lambda x: x.view(x.shape[0], x.shape[1], 4, 8).transpose(1, 2)  # noqa: E731
        q, k, v = split(base.q(hidden)), split(base.k(states)), split(base.v(states))
        pk, pv = (split(p[None]).expand(q.shape[0], -1, -1, -1) for p in wrapped.prefix_encoder(wrapped.row))
        scores = q @ torch.cat([pk, k], 2).transpose(2, 3) + torch.cat([torch.zeros(*bias.shape[:-1], 3), bias], -1)
        if mask is not None:
            mask = mask if mask.dtype != torch.bool else torch.zeros(mask.shape).masked_fill(~mask, -1e9)
            scores = scores + torch.cat([torch.zeros(*mask.shape[:-1], 3), mask], -1)
        elif "decoder" in attention and "SelfAttention" in attention:  # causal, left to sdpa's flag
            causal = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril()
            scores = scores + torch.cat([torch.zeros(q.shape[2], 3), torch.zeros(causal.shape).masked_fill(
                ~causal, -1e9)], -1)
        expected = base.o((scores.softmax(-1) @ torch.cat([pv, v], 2)).transpose(1, 2).reshape(*hidden.shape[:2], -1))
    torch.testing.assert_close(seen["out"][0], expected, rtol=1e-5, atol=1e-5)


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


def _t5_classifier(family: str = "t5"):
    from autopelt.delta.sites import model_class

    config = tiny_decoder_config(family)
    torch.manual_seed(0)
    return model_class(config, lm=False).from_config(config).eval()


def _eos_batch(seq_len: int = 7):
    """Right-padded rows that end in <eos> (2), as a T5 tokenizer writes them: T5's classifier reads it."""
    batch = decoder_batch("t5", seq_len=seq_len)
    batch.pop("decoder_input_ids")
    for row, length in enumerate(batch["attention_mask"].sum(1).tolist()):
        batch["input_ids"][row, length - 1] = 2
    return batch


@pytest.mark.parametrize("name", ["lora", "ia3", "houlsby", "prefix", "prompt", "unipelt_apl"])
@pytest.mark.parametrize("family", ["t5", "t5-gated"])
def test_a_t5_classifier_trains_its_delta_and_head_counts_them_and_ignores_padding(name, family):
    """T5ForSequenceClassification (the decoder's state at the last <eos>, a dense layer and an output projection):
    identity where zero-initialised, only the delta and the head move, the analytic count, padding-invariant."""
    batch = _eos_batch()
    expected = logits(_t5_classifier(family), batch)
    model = delta.apply_delta(_t5_classifier(family), CASES[name])
    if not changes_output_at_init(name):
        torch.testing.assert_close(logits(model, batch), expected, rtol=0, atol=1e-6)
    before = {n: p.clone() for n, p in model.named_parameters()}
    model.train()
    optimiser = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model(**batch, labels=torch.tensor([0, 1, 1])).loss.backward()
    optimiser.step()
    model.eval()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert changed <= trainable and any(n.startswith("classification_head") for n in changed)
    assert any(not n.startswith("classification_head") for n in changed)
    count = delta.count_parameters(CASES[name], model.config, num_labels=2)
    assert count.trainable == sum(p.numel() for p in model.parameters() if p.requires_grad)
    longer = _eos_batch(seq_len=9)
    alone = {k: v[2:3, : int(longer["attention_mask"][2].sum())] for k, v in longer.items()}
    torch.testing.assert_close(logits(model, alone)[0], logits(model, longer)[2], rtol=1e-5, atol=1e-5)


def test_a_t5_classifier_refuses_mean_pooling_in_one_line():
    with pytest.raises(UserError, match="reads the decoder's state at the last <eos> .use --pooling cls.$"):
        delta.apply_delta(_t5_classifier(), {"methods": [{"method": "lora"}], "pooling": "mean"})


def test_a_t5_prefix_in_peft_form_has_a_gate_per_decoder_layer_that_trains_and_reads_as_its_layer():
    model = delta.apply_delta(tiny_decoder("t5", lm=True),
                              {"methods": [{"method": "prefix", "length": 3, "shift_positions": True, "gate": True}]})
    batch = decoder_batch("t5")
    model(**batch, labels=batch["decoder_input_ids"]).loss.backward()
    assert bool((model.prefix_gates.logit.grad != 0).all())  # every decoder layer's gate, rows read or not
    assert set(delta.gate_values(model.eval(), batch)["prefix"]) == {"2", "3"}  # the decoder's layers


def test_a_decoder_prompt_leads_the_token_types_too_where_a_tokenizer_gives_them():
    """GPT-2 adds a type embedding where token_type_ids are passed (a BERT-style tokenizer gives them): the soft
    tokens lead them with type 0, so the model sees as many types as tokens."""
    model = build("prompt", "gpt2")
    batch = decoder_batch("gpt2")
    typed = {**batch, "token_type_ids": torch.zeros_like(batch["input_ids"])}
    with torch.no_grad():
        logits_typed = model(**typed).logits
        alone = model(**{k: v[:1] for k, v in typed.items()}).logits
    assert logits_typed.shape == (3, 2)
    torch.testing.assert_close(alone[0], logits_typed[0], rtol=1e-5, atol=1e-5)

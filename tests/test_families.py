"""Every method on every declared family beyond BERT, RoBERTa, Llama, GPT-2 and T5 (which test_delta_methods.py and
test_delta_decoders.py cover): the same behaviour, proved with numbers on tiny random models, or a refusal in one
line that names the reason before anything is built."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_batch
from decodermodels import row_alone
from familymodels import NEW_DECODERS, NEW_ENCODERS, family_config, family_model
from test_delta_decoders import CASES as DECODER_CASES
from test_delta_decoders import changes_output_at_init as decoder_changes_output
from test_delta_methods import CASES as ENCODER_CASES
from test_delta_methods import changes_output_at_init as encoder_changes_output

from autopelt import delta
from autopelt.delta.registry import innermost
from autopelt.delta.spec import parse_spec
from autopelt.delta.families import architecture_of
from autopelt.errors import UserError

# What each family refuses, written out here (not read from the declarations), so a refusal that appears or goes
# unnoticed fails a test
REFUSED = {
    "electra": set(), "deberta-v2": set(), "mpnet": set(), "distilbert": set(), "albert": set(),
    "modernbert": {"bitfit"},
    **{family: {"bitfit"} for family in NEW_DECODERS},
}
MERGEABLE = ("lora", "rslora", "dora", "vera", "ia3", "adamix_lora", "dora+vera+ia3+ffn_adapter_same_site")


def methods_of(spec: dict) -> set[str]:
    return {innermost(method).method for method in parse_spec(spec).methods}


def cases(families, table):
    return [(family, name) for family in families for name in table if not methods_of(table[name]) & REFUSED[family]]


def refused_cases(families, table):
    return [(family, name) for family in families for name in table if methods_of(table[name]) & REFUSED[family]]


# Each method once, in its placements and with the others on one site: what tells whether a family's sites are
# right (the method semantics are proved on BERT, RoBERTa, Llama, GPT-2 and T5 by the full tables)
KEPT = {"lora", "lora_all_sites_some_layers", "lora_every_site_some_layers", "lora_gated", "rslora", "dora", "vera",
        "vera_gated_every_shape", "vera_gated", "ia3", "ia3_all_sites_some_layers", "houlsby", "pfeiffer_gelu",
        "pfeiffer", "adapter_gated", "ffn_gated", "compacter", "compacter++_rank2", "compacter++", "prefix",
        "prefix_upper", "prefix_split_gate", "prompt", "bitfit", "bitfit_subset", "adamix_adapter", "adamix_lora",
        "unipelt_apl", "unipelt_al", "dora+vera+ia3+ffn_adapter_same_site", "prefix+lora+compacter+bitfit",
        "lora+adapter_same_site+prompt"}
ENCODER_CASES = {name: spec for name, spec in ENCODER_CASES.items() if name in KEPT}
DECODER_CASES = {name: spec for name, spec in DECODER_CASES.items() if name in KEPT}
ENCODER_PAIRS = cases(NEW_ENCODERS, ENCODER_CASES)
DECODER_PAIRS = cases(NEW_DECODERS, DECODER_CASES)
QUICK = {"lora", "vera", "ia3", "houlsby", "pfeiffer", "pfeiffer_gelu", "prefix", "prompt", "bitfit", "unipelt_apl",
         "dora+vera+ia3+ffn_adapter_same_site"}  # the quick loop's share; the rest is in the slow suite


def _param(family: str, name: str, spec: dict):
    return pytest.param(family, name, spec, marks=() if name in QUICK else pytest.mark.slow)


PAIRS = [_param(f, n, ENCODER_CASES[n]) for f, n in ENCODER_PAIRS] + [
    _param(f, n, DECODER_CASES[n]) for f, n in DECODER_PAIRS]
REFUSALS = ([(f, n, ENCODER_CASES[n]) for f, n in refused_cases(NEW_ENCODERS, ENCODER_CASES)]
            + [(f, n, DECODER_CASES[n]) for f, n in refused_cases(NEW_DECODERS, DECODER_CASES)])


def pair_id(value):
    return value if isinstance(value, str) else None


def changes_output_at_init(family: str, name: str) -> bool:
    """As the module the case comes from says: prefixes and prompts change attention at once."""
    return (encoder_changes_output if family in NEW_ENCODERS else decoder_changes_output)(name)


def batch_for(family: str, seq_len: int = 7, seed: int = 0) -> dict:
    return tiny_batch(seq_len=seq_len, seed=seed)


@torch.no_grad()
def logits(model, batch):
    return model(**batch).logits


def build(family: str, spec: dict, seed: int = 0):
    return delta.apply_delta(family_model(family), spec, seed=seed).eval()


def head_names(model) -> tuple[str, ...]:
    return tuple(part + "." for part in architecture_of(model.config).head_parts)


def train_step(model, steps: int = 1, lr: float = 1e-2):
    model.train()
    optimiser = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    generator = torch.Generator().manual_seed(1)
    for step in range(steps):
        delta.route_all(model, generator)
        model(**tiny_batch(seed=step), labels=torch.tensor([0, 1, 1])).loss.backward()
        optimiser.step()
        optimiser.zero_grad()
    return model.eval()


@pytest.mark.parametrize("family, name, spec", PAIRS, ids=pair_id)
def test_identity_at_init_when_zero_initialised(family, name, spec):
    batch = batch_for(family)
    expected = logits(family_model(family), batch)
    got = logits(build(family, spec), batch)
    if changes_output_at_init(family, name):
        assert not torch.allclose(got, expected, atol=1e-6)
    else:
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("family, name, spec", PAIRS, ids=pair_id)
def test_a_step_changes_only_the_delta_and_head(family, name, spec):
    model = build(family, spec)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    train_step(model)
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and changed <= trainable
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters() if n not in trainable)
    head = head_names(model)
    assert any(n.startswith(head) for n in changed), "the head did not train"
    assert any(not n.startswith(head) for n in changed), "only the head trained"


@pytest.mark.parametrize("family, name, spec", PAIRS, ids=pair_id)
def test_analytic_count_equals_counted(family, name, spec):
    model = build(family, spec)
    count = delta.count_parameters(spec, model.config)
    assert count.trainable == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert count.stored == sum(t.numel() for t in delta.delta_state(model).values())
    assert count.base == sum(p.numel() for p in family_model(family).parameters())


@pytest.mark.parametrize("family, name, spec", PAIRS, ids=pair_id)
def test_save_load_round_trip_gives_the_same_logits(family, name, spec, tmp_path):
    model = train_step(build(family, spec), steps=2)
    batch = batch_for(family)
    expected = logits(model, batch)
    delta.save_delta(model, spec, tmp_path)
    fresh = family_model(family)
    for part in architecture_of(fresh.config).head_parts:  # another head: the saved one must replace it
        for module in fresh.get_submodule(part).modules():
            if isinstance(module, torch.nn.Linear):
                torch.nn.init.normal_(module.weight)
    delta.load_delta(fresh, tmp_path)
    torch.testing.assert_close(logits(fresh.eval(), batch), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family, name, spec", [p for p in PAIRS if p.values[1] in MERGEABLE], ids=pair_id)
def test_merged_equals_unmerged(family, name, spec):
    model = train_step(build(family, spec), steps=2)
    batch = batch_for(family)
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    expected = logits(model, batch)
    delta.merge(model)
    assert any(not torch.equal(p, weights[n]) for n, p in model.named_parameters() if not p.requires_grad)
    torch.testing.assert_close(logits(model, batch), expected, rtol=1e-5, atol=1e-5)
    delta.unmerge(model)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p, weights[n], rtol=0, atol=1e-6)


@pytest.mark.parametrize("family, name, spec", PAIRS, ids=pair_id)
def test_padding_does_not_change_a_sequence_result(family, name, spec):
    """A row's logits are the same alone and right-padded in a longer batch."""
    model = train_step(build(family, spec), steps=2)
    batch = batch_for(family, seq_len=9)
    together = logits(model, batch)[-1]
    alone = logits(model, row_alone(batch, 2))[0]
    torch.testing.assert_close(alone, together, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("family, name, spec", REFUSALS, ids=pair_id)
def test_a_method_a_family_cannot_take_is_refused_in_one_line_before_anything_is_built(family, name, spec):
    config = family_config(family)
    refused = "|".join(sorted(methods_of(spec) & REFUSED[family]))
    with pytest.raises(UserError, match=f"^({refused}) cannot apply to {family}: ") as error:
        delta.count_parameters(spec, config)
    assert "\n" not in str(error.value)
    model = family_model(family)
    before = [name for name, _ in model.named_modules()]
    with pytest.raises(UserError):
        delta.apply_delta(model, spec)
    assert [name for name, _ in model.named_modules()] == before


@pytest.mark.parametrize("family", NEW_ENCODERS)
def test_mean_pooling_reads_the_mean_of_the_real_tokens_on_every_encoder(family):
    """Under mean pooling the head reads the mean of the last layer's states over real tokens: padding changes
    nothing, the output differs from the first token's, and the head's parameters still train."""
    spec = {"pooling": "mean", "methods": [{"method": "lora", "rank": 4}]}
    model = train_step(build(family, spec), steps=2)
    first = train_step(build(family, {"methods": spec["methods"]}), steps=2)
    batch = batch_for(family, seq_len=9)
    assert not torch.allclose(logits(model, batch), logits(first, batch), atol=1e-4)
    torch.testing.assert_close(logits(model, row_alone(batch, 2))[0], logits(model, batch)[-1], rtol=1e-4,
                               atol=1e-5)
    count = delta.count_parameters(spec, model.config)
    assert count.trainable == sum(p.numel() for p in model.parameters() if p.requires_grad)


def test_every_case_is_either_trained_or_refused_on_every_new_family():
    """The two lists above cover every (family, case) once: nothing is silently left out."""
    trained = {tuple(p.values[:2]) for p in PAIRS}
    refused = {(f, n) for f, n, _ in REFUSALS}
    assert not trained & refused
    assert len(trained | refused) == len(NEW_ENCODERS) * len(ENCODER_CASES) + len(NEW_DECODERS) * len(DECODER_CASES)


@pytest.mark.parametrize("family, site, path", [
    ("deberta-v2", "query", "attention.self.query_proj"), ("mpnet", "attention_output", "attention.attn.o"),
    ("distilbert", "intermediate", "ffn.lin1"), ("albert", "output", "ffn_output"),
    ("modernbert", "qkv", "attn.Wqkv"), ("phi3", "qkv", "self_attn.qkv_proj"),
    ("gemma2", "gate", "mlp.gate_proj"), ("olmo2", "value", "self_attn.v_proj"),
])
def test_declared_sites_are_real_linear_layers_of_the_declared_shape(family, site, path):
    config = family_config(family)
    arch = architecture_of(config)
    model = family_model(family)
    layer = arch.layer_modules(model)[0]
    module = layer.get_submodule(path)
    assert arch.stacks[0].linears[site] == path
    in_f, out_f = arch.shapes(config)[site]
    assert (module.in_features, module.out_features) == (in_f, out_f)
    for other, other_path in arch.stacks[0].linears.items():  # every declared site, not only the one named
        linear = layer.get_submodule(other_path)
        assert (linear.in_features, linear.out_features) == arch.shapes(config)[other], other


def test_albert_layers_are_its_one_group_of_shared_layers_and_other_groupings_are_refused():
    config = family_config("albert")  # 2 layers in its group, run num_hidden_layers times
    assert architecture_of(config).num_layers(config) == config.inner_group_num == 2
    config.num_hidden_groups = 2
    with pytest.raises(UserError, match="ALBERT with 2 layer groups"):
        architecture_of(config)


# BART: an encoder-decoder whose classifier reads the decoder's state at the last </s> (2), as T5's
BART_CASES = {name: spec for name, spec in ENCODER_CASES.items() if spec.get("pooling") != "mean"}


def eos_batch(seq_len: int = 7) -> dict:
    """Right-padded rows that each end in </s>."""
    batch = tiny_batch(seq_len=seq_len)
    for row, length in enumerate(batch["attention_mask"].sum(1).tolist()):
        batch["input_ids"][row, length - 1] = 2
    return batch


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in QUICK else pytest.mark.slow) for n in BART_CASES])
def test_bart_trains_each_delta_counts_it_reloads_it_and_ignores_padding(name, tmp_path):
    spec = BART_CASES[name]
    batch = eos_batch()
    expected = logits(family_model("bart"), batch)
    model = build("bart", spec)
    if not encoder_changes_output(name):
        torch.testing.assert_close(logits(model, batch), expected, rtol=0, atol=1e-6)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model.train()
    optimiser = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    delta.route_all(model, torch.Generator().manual_seed(1))
    model(**batch, labels=torch.tensor([0, 1, 1])).loss.backward()
    optimiser.step()
    model.eval()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed <= trainable and any(n.startswith("classification_head") for n in changed)
    assert any(not n.startswith("classification_head") for n in changed)
    count = delta.count_parameters(spec, model.config)
    assert count.trainable == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert count.stored == sum(t.numel() for t in delta.delta_state(model).values())
    longer = eos_batch(seq_len=9)
    alone = {k: v[2:3, : int(longer["attention_mask"][2].sum())] for k, v in longer.items()}
    torch.testing.assert_close(logits(model, alone)[0], logits(model, longer)[2], rtol=1e-5, atol=1e-5)
    delta.save_delta(model, spec, tmp_path)
    fresh = delta.load_delta(family_model("bart"), tmp_path).eval()
    torch.testing.assert_close(logits(fresh, batch), logits(model, batch), rtol=1e-5, atol=1e-5)


def test_bart_refuses_a_shifted_prefix_and_mean_pooling_in_one_line():
    config = family_config("bart")
    with pytest.raises(UserError, match=r"^prefix cannot apply to bart: prefix.shift_positions \(peft's form\) is "):
        delta.count_parameters({"methods": [{"method": "prefix", "shift_positions": True}]}, config)
    from autopelt.delta.methods.prefix import PrefixConfig, peft_refuses

    assert "moves the real tokens' positions" in peft_refuses(PrefixConfig(), architecture_of(config))
    with pytest.raises(UserError, match="reads the decoder's state at the last <eos> .use --pooling cls.$"):
        delta.count_parameters({"methods": [{"method": "lora"}], "pooling": "mean"}, config)


@pytest.mark.parametrize("attention", ["encoder.layers.1.self_attn", "decoder.layers.1.self_attn",
                                       "decoder.layers.1.encoder_attn"])
def test_a_bart_prefix_is_attended_as_keys_and_values_before_every_real_one(attention):
    """Each of BART's attentions against the formula written out: softmax(q·[P_k; K]ᵀ·scale + [0, mask])·[P_v; V],
    the decoder's self-attention causal over the real keys."""
    model = build("bart", {"methods": [{"method": "prefix", "length": 3, "reparam_hidden": 0}]})
    wrapped = model.get_submodule("model." + attention)
    base, seen = wrapped.base_layer, {}
    wrapped.register_forward_hook(lambda m, args, kwargs, out: seen.update(args=args, kwargs=kwargs, out=out),
                                  with_kwargs=True)
    with torch.no_grad():
        model(**eos_batch())
        hidden = seen["args"][0] if seen["args"] else seen["kwargs"]["hidden_states"]
        states = seen["kwargs"].get("key_value_states")
        states = hidden if states is None else states
        mask = seen["kwargs"].get("attention_mask")
        split = lambda x: x.view(x.shape[0], x.shape[1], 4, 8).transpose(1, 2)  # noqa: E731
        q, k, v = split(base.q_proj(hidden)), split(base.k_proj(states)), split(base.v_proj(states))
        pk, pv = (split(p[None]).expand(q.shape[0], -1, -1, -1) for p in wrapped.prefix_encoder(wrapped.row))
        scores = q @ torch.cat([pk, k], 2).transpose(2, 3) * base.scaling
        if mask is not None:
            mask = mask if mask.dtype != torch.bool else torch.zeros(mask.shape).masked_fill(~mask, -1e9)
            scores = scores + torch.cat([torch.zeros(*mask.shape[:-1], 3), mask], -1)
        elif attention == "decoder.layers.1.self_attn":  # causal, left to sdpa's flag
            causal = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril()
            scores = scores + torch.cat([torch.zeros(q.shape[2], 3), torch.zeros(causal.shape).masked_fill(
                ~causal, -1e9)], -1)
        expected = base.out_proj((scores.softmax(-1) @ torch.cat([pv, v], 2)).transpose(1, 2).reshape(
            *hidden.shape[:2], -1))
    torch.testing.assert_close(seen["out"][0], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("spec", [{"method": "prefix", "length": 3}, {"method": "prefix", "length": 3, "gate": True}])
def test_bart_generates_the_same_with_a_prefix_padded_in_a_batch_or_alone_and_as_teacher_forcing_reads(spec):
    """The prefix stays out of the key/value cache: step-by-step decoding with the cache computes what the
    teacher-forced pass does, and padding in a batch changes nothing."""
    model = delta.apply_delta(family_model("bart", lm=True), {"methods": [spec]}).eval()
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.requires_grad:
                parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.5)
    rows = [torch.randint(3, 100, (n,), generator=generator) for n in (5, 3, 7)]
    width = max(len(r) for r in rows)
    ids = torch.stack([torch.cat([r, torch.zeros(width - len(r), dtype=torch.long)]) for r in rows])
    mask = (torch.arange(width)[None] < torch.tensor([len(r) for r in rows])[:, None]).long()
    settings = dict(max_new_tokens=5, do_sample=False, pad_token_id=0, eos_token_id=None, decoder_start_token_id=2,
                    forced_bos_token_id=None, forced_eos_token_id=None)  # BART forces </s> last: not what is read
    with torch.no_grad():
        together = model.generate(input_ids=ids, attention_mask=mask, **settings)
        for i, row in enumerate(rows):
            alone = model.generate(input_ids=row[None], attention_mask=torch.ones(1, len(row), dtype=torch.long),
                                   **settings)
            assert alone[0].tolist() == together[i].tolist()
        forward = model(input_ids=ids, attention_mask=mask, decoder_input_ids=together[:, :-1]).logits.argmax(-1)
    assert forward.tolist() == together[:, 1:].tolist()


@pytest.mark.parametrize("family", ["electra", "distilbert", "albert", "mpnet"])
def test_a_prefix_is_the_family_attention_over_prefix_tokens_that_have_no_position(family):
    """The wrapped self-attention (with what its module holds after the attention: DistilBERT's output projection,
    ALBERT's and MPNet's too) equals the family's own module run on [prefix tokens; tokens], the prefix tokens' keys
    and values those of the prefix, never masked, without position (MPNet: zero position-bias columns), read at
    the real tokens."""
    from autopelt.delta.modules.prefix import MPNetPrefixAttention, PrefixEncoder, PrefixSelfAttention

    model = build(family, {"methods": [{"method": "prefix", "length": 3, "reparam_hidden": 0}]})
    wrapped = next(m for m in model.modules() if isinstance(m, (PrefixSelfAttention, MPNetPrefixAttention)))
    base, encoder = wrapped.base_layer, next(m for m in model.modules() if isinstance(m, PrefixEncoder))
    key, value = (getattr(base, name) for name in getattr(wrapped, "linears", ("k", "v"))[-2:])
    generator = torch.Generator().manual_seed(0)
    hidden, extra = torch.randn(2, 5, 32, generator=generator), torch.randn(3, 32, generator=generator)
    mask = torch.zeros(2, 1, 1, 5)
    mask[1, ..., -2:] = torch.finfo(torch.float32).min  # the second row's last two tokens are padding
    full_mask = torch.cat([torch.zeros(2, 1, 1, 3), mask], dim=-1)
    inputs = torch.cat([extra.expand(2, -1, -1), hidden], dim=1)
    with torch.no_grad():
        encoder.prefix[wrapped.row, 0], encoder.prefix[wrapped.row, 1] = key(extra), value(extra)
        if family == "mpnet":
            bias = model.mpnet.encoder.compute_position_bias(hidden)  # (B, heads, 5, 5)
            full_bias = torch.zeros(2, bias.shape[1], 8, 8)
            full_bias[:, :, 3:, 3:] = bias
            expected, got = base(inputs, full_mask, full_bias)[0], wrapped(hidden, mask, bias)[0]
            alone = base(hidden, mask, bias)[0]
        else:
            expected, got, alone = base(inputs, full_mask)[0], wrapped(hidden, mask)[0], base(hidden, mask)[0]
    torch.testing.assert_close(got, expected[:, 3:], rtol=0, atol=1e-5)
    assert not torch.allclose(got, alone, atol=1e-3)  # the prefix changes what it reads


def test_a_deberta_prefix_is_its_disentangled_attention_over_prefix_tokens_that_have_no_position(monkeypatch):
    """DeBERTa-v3's settings (relative positions only, both relative terms, shared keys): the wrapped attention
    equals the module's own run on [prefix tokens; tokens] whose relative scores are the real tokens' with zero rows
    and columns for the prefix tokens, read at the real tokens that are not padding."""
    from autopelt.delta.modules.prefix import DebertaPrefixAttention, PrefixEncoder

    model = build("deberta-v2", {"methods": [{"method": "prefix", "length": 3, "reparam_hidden": 0}]})
    wrapped = next(m for m in model.modules() if isinstance(m, DebertaPrefixAttention))
    base, encoder = wrapped.base_layer, next(m for m in model.modules() if isinstance(m, PrefixEncoder))
    generator = torch.Generator().manual_seed(0)
    hidden, extra = torch.randn(2, 5, 32, generator=generator), torch.randn(3, 32, generator=generator)
    real = torch.ones(2, 5)
    real[1, -2:] = 0  # the second row's last two tokens are padding
    full = torch.cat([torch.ones(2, 3), real], dim=1)
    pairs = lambda m: m[:, None, None, :] * m[:, None, :, None]  # noqa: E731  as DebertaV2Encoder.get_attention_mask
    relative = model.deberta.encoder.get_rel_embedding()
    own_bias = base.disentangled_attention_bias

    def no_position_for_the_first_three(query, key, relative_pos, embeddings, terms):
        scores = own_bias(query[:, 3:], key[:, 3:], None, embeddings, terms)
        return torch.nn.functional.pad(scores, (3, 0, 3, 0))

    with torch.no_grad():
        encoder.prefix[wrapped.row, 0], encoder.prefix[wrapped.row, 1] = base.key_proj(extra), base.value_proj(extra)
        got = wrapped(hidden, pairs(real), rel_embeddings=relative)[0]
        alone = base(hidden, pairs(real), rel_embeddings=relative)[0]
        monkeypatch.setattr(base, "disentangled_attention_bias", no_position_for_the_first_three)
        expected = base(torch.cat([extra.expand(2, -1, -1), hidden], dim=1), pairs(full), rel_embeddings=relative)[0]
    kept = real.bool()
    torch.testing.assert_close(got[kept], expected[:, 3:][kept], rtol=0, atol=1e-5)
    assert not torch.allclose(got[kept], alone[kept], atol=1e-3)  # the prefix changes what it reads


@pytest.mark.parametrize("window", [False, True])
def test_a_modernbert_prefix_is_its_rotary_attention_over_prefix_tokens_that_are_not_rotated(window):
    """The wrapped attention (Wqkv, rotary positions, Wo) equals the module's own run on [prefix tokens; tokens]
    whose rotation is none (cos 1, sin 0) for the prefix tokens and the real tokens' own for them, read at those;
    with a local layer's window (each token sees its neighbours only) the prefix stays visible to every token."""
    from autopelt.delta.modules.prefix import ModernBertPrefixAttention, PrefixEncoder

    model = build("modernbert", {"methods": [{"method": "prefix", "length": 3, "reparam_hidden": 0}]})
    wrapped = next(m for m in model.modules() if isinstance(m, ModernBertPrefixAttention))
    base, encoder = wrapped.base_layer, next(m for m in model.modules() if isinstance(m, PrefixEncoder))
    generator = torch.Generator().manual_seed(0)
    hidden, extra = torch.randn(2, 5, 32, generator=generator), torch.randn(3, 32, generator=generator)
    angles = torch.randn(1, 5, base.head_dim // 2, generator=generator).repeat(1, 1, 2)
    cos, sin = angles.cos(), angles.sin()
    none = torch.zeros(1, 3, base.head_dim)
    mask = torch.zeros(2, 1, 5, 5)
    mask[1, ..., -2:] = torch.finfo(torch.float32).min  # the second row's last two tokens are padding
    if window:
        apart = (torch.arange(5)[:, None] - torch.arange(5)[None, :]).abs() > 1
        mask = mask.masked_fill(apart, torch.finfo(torch.float32).min)
    full_mask = torch.zeros(2, 1, 8, 8)
    full_mask[:, :, 3:, 3:] = mask  # the prefix tokens' columns: visible to every token
    with torch.no_grad():
        _, key, value = base.Wqkv(extra).view(3, 3, -1).unbind(dim=1)
        encoder.prefix[wrapped.row, 0], encoder.prefix[wrapped.row, 1] = key, value
        got = wrapped(hidden, (cos, sin), mask)[0]
        alone = base(hidden, (cos, sin), mask)[0]
        expected = base(torch.cat([extra.expand(2, -1, -1), hidden], dim=1),
                        (torch.cat([none.cos(), cos], dim=1), torch.cat([none, sin], dim=1)), full_mask)[0]
    torch.testing.assert_close(got, expected[:, 3:], rtol=0, atol=1e-5)
    assert not torch.allclose(got, alone, atol=1e-3)  # the prefix changes what it reads


@pytest.mark.parametrize("family", ["deberta-v2", "mpnet", "distilbert", "albert", "modernbert"])
def test_a_prefix_refuses_shifted_positions_and_a_peft_export_in_one_line_where_the_embeddings_take_no_past(family):
    config = family_config(family)
    with pytest.raises(UserError, match=f"^prefix cannot apply to {family}: {family}'s embeddings take no past "):
        delta.count_parameters({"methods": [{"method": "prefix", "shift_positions": True}]}, config)
    from autopelt.delta.methods.prefix import PrefixConfig, peft_refuses

    assert "moves the real tokens' positions" in peft_refuses(PrefixConfig(), architecture_of(config))

"""Each method named after a paper against a hand-written computation of its reference code.

References: microsoft/AdaMix (expert_soup.py, modeling_roberta.py symmetric_KL_loss, bert_base_mnli_expert_soup.sh),
morningmoni/UniPELT (modeling_bert.py BertSelfAttention, adapters/layer.py with AdapterHub's PfeifferConfig),
google-research/adapter-bert (modeling.py) and benzakenelad/BitFit (glue_evaluator.py); the equations of (IA)³
(Liu et al. 2022, eq. in section 3.3), DoRA (Liu et al. 2024, eq. 5), rsLoRA (Kalajdzievski 2023) and VeRA (Kopiczko
et al. 2024, eq. 1). Parity with peft's implementations of these is in test_delta_peft.py.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import tiny_batch, tiny_config, tiny_model

from autopelt import delta
from autopelt.delta.modules.adapter import AdapterWrapper, Bottleneck, PostNormAdapter
from autopelt.delta.modules.gate import Gate
from autopelt.delta.modules.mixture import MixtureLinear
from autopelt.train.classify import training_loss

LABELS = torch.tensor([0, 1, 1])


def built(spec, family="bert", **config):
    return delta.apply_delta(tiny_model(family, **config), spec)


def perturbed(model, seed=3, scale=0.5):
    """Every delta tensor moved off its initial value (zero up-projections would hide the adapter)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=generator) * scale)
    return model


# 1. AdaMix: one expert soup per layer on the FFN output, GELU, adapter size 48.

def adamix_counts(hidden, layers, labels, k=48, experts=4):
    """The reference's ExpertSoup per layer: down Linear(H, k) x M experts, up Linear(k, H) shared (sharing_up 1)."""
    down, up, head = hidden * k + k, k * hidden + hidden, hidden * labels + labels
    return layers * (experts * down + up) + head, layers * (down + up) + head  # (trainable, stored)


@pytest.mark.parametrize("which", ["tiny", "minilm"])
def test_adamix_counts_are_one_ffn_soup_per_layer(which, request):
    if which == "tiny":
        config = tiny_config()
    else:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(request.getfixturevalue("minilm_path"), num_labels=2)
    count = delta.count_parameters(delta.PRESETS["adamix"], config)
    trainable, stored = adamix_counts(config.hidden_size, config.num_hidden_layers, 2)
    assert (count.trainable, count.stored) == (trainable, stored)
    if which == "minilm":
        assert (count.trainable, count.stored) == (557_186, 224_546)


def test_adamix_soup_sits_on_the_ffn_output_with_gelu():
    model = built(delta.PRESETS["adamix"])
    soups = {n: m for n, m in model.named_modules() if isinstance(m, AdapterWrapper)}
    assert sorted(soups) == [f"bert.encoder.layer.{i}.output.dense" for i in range(2)]
    for soup in soups.values():
        assert isinstance(soup.adapter.act, torch.nn.GELU)
        assert soup.adapter.down.experts == 4 and not isinstance(soup.adapter.up, MixtureLinear)


# 2. AdaMix's loss: cross-entropy of the first pass + symmetric KL with each side's target detached.

def reference_symmetric_kl(input, target):
    """AdaMix's modeling_roberta.symmetric_KL_loss, written out."""
    loss = (F.kl_div(F.log_softmax(input, dim=-1), F.softmax(target.detach(), dim=-1), reduction="batchmean")
            + F.kl_div(F.log_softmax(target, dim=-1), F.softmax(input.detach(), dim=-1), reduction="batchmean"))
    return 0.5 * loss.sum()


def gradients(model, loss_fn):
    model.zero_grad()
    loss_fn().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def two_passes(model, seed):
    routing = torch.Generator().manual_seed(seed)
    delta.route_all(model, routing)
    first = model(**tiny_batch()).logits
    delta.route_all(model, routing)
    return first, model(**tiny_batch()).logits


def test_adamix_gradient_equals_the_reference_formulas():
    spec = {"methods": [{"method": "adamix", "experts": 3, "delta": {"method": "adapter", "bottleneck": 8}}]}
    model = perturbed(built(spec)).train()
    ours = gradients(model, lambda: training_loss(model, {**tiny_batch(), "labels": LABELS},
                                                  torch.Generator().manual_seed(7), consistency=1.0))

    def reference():
        first, second = two_passes(model, 7)
        assert not torch.allclose(first, second)  # two routings, two predictions: the KL term is at work
        return F.cross_entropy(first, LABELS) + reference_symmetric_kl(first, second)

    expected = gradients(model, reference)
    assert ours.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(ours[name], expected[name], rtol=1e-5, atol=1e-7)

    def former():  # both passes' task loss, gradient through both sides of the KL
        first, second = two_passes(model, 7)
        p, q = F.log_softmax(first, -1), F.log_softmax(second, -1)
        kl = 0.5 * (F.kl_div(q, p, log_target=True, reduction="batchmean")
                    + F.kl_div(p, q, log_target=True, reduction="batchmean"))
        return 0.5 * (F.cross_entropy(first, LABELS) + F.cross_entropy(second, LABELS)) + kl

    old = gradients(model, former)
    assert any(not torch.allclose(old[n], expected[n], rtol=1e-3) for n in expected)  # the formulas differ


def test_consistency_value_is_the_symmetric_kl_and_pulls_each_side_only():
    a, b = torch.randn(4, 3, requires_grad=True), torch.randn(4, 3, requires_grad=True)
    loss = delta.consistency_loss(a, b)
    p, q = F.softmax(a, -1), F.softmax(b, -1)
    symmetric = 0.5 * ((p * (p.log() - q.log())).sum(-1) + (q * (q.log() - p.log())).sum(-1)).mean()
    torch.testing.assert_close(loss, symmetric)
    loss.backward()
    torch.testing.assert_close(a.grad, 0.5 * (p - q).detach() / 4)  # d/da KL(sg q || p) / 2, batch mean
    torch.testing.assert_close(b.grad, 0.5 * (q - p).detach() / 4)


# 3. AdaMix's experts start as copies of one (MixtureSoup deep-copies one module).

@pytest.mark.parametrize("inner", [{"method": "adapter", "bottleneck": 8}, {"method": "lora", "rank": 4}])
def test_adamix_experts_are_identical_at_initialisation(inner):
    def mixtures(expert_init):
        spec = {"methods": [{"method": "adamix", "experts": 3, "share_up": False, "expert_init": expert_init,
                             "delta": inner}]}
        return [m for m in built(spec).modules() if isinstance(m, MixtureLinear)]

    copied = mixtures("copy")
    assert copied and any(m.weight.abs().sum() > 0 for m in copied)  # down-projections drawn, ups zero
    for m in copied:
        assert all(torch.equal(m.weight[i], m.weight[0]) for i in range(m.experts))
    independent = [m for m in mixtures("independent") if m.weight.abs().sum() > 0]
    assert independent and all(not torch.equal(m.weight[1], m.weight[0]) for m in independent)


# 4. UniPELT's prefix gate: one per layer, the same value on the prefix keys and values.

def reference_prefix_attention(attention, hidden, gate_k, gate_v):
    """UniPELT's BertSelfAttention with a prefix: softmax(q [g_k P_k; K]^T / sqrt(d)) [g_v P_v; V], no mask."""
    base, encoder = attention.base_layer, attention.prefix_encoder
    heads, d = base.num_attention_heads, base.attention_head_size

    def split(x):  # (B, T, H) -> (B, heads, T, d)
        return x.view(x.shape[0], x.shape[1], heads, d).transpose(1, 2)

    prefix_k, prefix_v = (split(p.unsqueeze(0)).expand(hidden.shape[0], -1, -1, -1) for p in encoder(attention.row))
    keys = torch.cat([prefix_k * gate_k.view(-1, 1, 1, 1), split(base.key(hidden))], dim=2)
    values = torch.cat([prefix_v * gate_v.view(-1, 1, 1, 1), split(base.value(hidden))], dim=2)
    scores = split(base.query(hidden)) @ keys.transpose(-1, -2) / math.sqrt(d)
    return (scores.softmax(-1) @ values).transpose(1, 2).reshape(hidden.shape)


@pytest.mark.parametrize("split_gate", [False, True])
def test_unipelt_prefix_gate(split_gate):
    spec = {"methods": [{"method": "prefix", "length": 3, "reparam_hidden": 0, "gate": True,
                         "split_gate": split_gate}]}
    model = perturbed(built(spec)).eval()
    gates = [m for m in model.modules() if isinstance(m, Gate) and m.kind == "prefix"]
    assert sorted(g.layer for g in gates) == [0, 1]  # one gate module per layer ...
    assert {g.linear.out_features for g in gates} == {2 if split_gate else 1}  # ... with one value (UniPELT)
    attention = model.bert.encoder.layer[0].attention.self
    hidden = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(0))
    g = torch.sigmoid(attention.gate.linear(hidden)).mean(dim=1)  # (B, 1) or (B, 2)
    with torch.no_grad():
        got = attention(hidden)[0]
        torch.testing.assert_close(got, reference_prefix_attention(attention, hidden, g[:, 0], g[:, -1]))
        if split_gate:  # the two values differ, so one shared gate would be another function
            assert not torch.allclose(got, reference_prefix_attention(attention, hidden, g[:, 0], g[:, 0]))


def test_unipelt_apl_preset_has_one_prefix_gate_per_layer():
    spec = delta.parse_spec(delta.PRESETS["unipelt_apl"])
    assert not spec.get("prefix").split_gate
    small = {"methods": [{**m.to_dict(), **({"bottleneck": 8} if m.method == "adapter" else {})}
                         for m in spec.methods]}
    gates = [m for m in built(small).modules() if isinstance(m, Gate) and m.kind == "prefix"]
    assert [(g.layer, g.linear.out_features) for g in sorted(gates, key=lambda g: g.layer)] == [(0, 1), (1, 1)]


# 5. Pfeiffer's adapter reads LN(h_FN + residual), after the dropout; Houlsby's sits after the dropout too.

def capture_inputs(model, kind):
    seen = []
    for module in model.modules():
        if isinstance(module, kind):
            module.register_forward_hook(lambda mod, args, out: seen.append(args[0]))
    return seen


def test_pfeiffer_adapter_input_is_the_post_layernorm_state():
    model = perturbed(built({"methods": [{"method": "pfeiffer", "bottleneck": 8, "gate": True}]},
                           hidden_dropout_prob=0.3)).train()
    output = model.bert.encoder.layer[0].output  # BertOutput: LN(dropout(dense(inter)) + attention_output)
    assert isinstance(output.LayerNorm, PostNormAdapter)
    seen = {}
    output.register_forward_hook(lambda mod, args, out: seen.update(inputs=args, out=out))
    output.dropout.register_forward_hook(lambda mod, args, out: seen.update(h=out))
    adapter_inputs = capture_inputs(model, Bottleneck)
    gate_inputs = capture_inputs(model, Gate)
    torch.manual_seed(0)
    model(**tiny_batch())
    h, residual = seen["h"], seen["inputs"][1]
    layer_norm, adapter, gate = output.LayerNorm.base_layer, output.LayerNorm.adapter, output.LayerNorm.gate
    normed = layer_norm(h + residual)  # what AdapterHub's Pfeiffer configuration hands the adapter
    torch.testing.assert_close(adapter_inputs[0], normed)
    torch.testing.assert_close(gate_inputs[0], normed)
    real = tiny_batch()["attention_mask"][:, :, None].float()  # autopelt's gates average over real tokens only
    g = ((torch.sigmoid(gate.linear(normed)) * real).sum(dim=1) / real.sum(dim=1))[:, None, :]
    up = adapter.up(torch.relu(adapter.down(normed)))
    torch.testing.assert_close(seen["out"], layer_norm(h + g * up + residual))  # original_ln_after


@pytest.mark.parametrize("placement, after_dropout", [("houlsby", True), ("ffn", False)])
def test_adapter_input_is_after_the_dropout_except_for_ffn(placement, after_dropout):
    model = built({"methods": [{"method": "adapter", "placement": placement, "bottleneck": 8}]},
                  hidden_dropout_prob=0.5).train()
    inputs = capture_inputs(model, Bottleneck)
    model(**tiny_batch())
    dropped = torch.stack([(x == 0).float().mean() for x in inputs])  # dropout zeroes about half the entries
    assert len(inputs) == (4 if placement == "houlsby" else 2)
    assert bool((dropped > 0.3).all()) if after_dropout else bool((dropped == 0).all())


# 6. BitFit trains every bias the reference does, the pooler's included.

def reference_bitfit(model, components):
    """BitFit's _deactivate_relevant_gradients: name matches, plus the pooler bias and the classifier."""
    components = components + ["pooler.dense.bias", "classifier"]
    return {n for n, _ in model.named_parameters() if any(c in n for c in components)}


@pytest.mark.parametrize("family", ["bert", "roberta"])
@pytest.mark.parametrize("targets, components", [(None, ["bias"]), (["query"], ["attention.self.query.bias"])])
def test_bitfit_trains_the_reference_biases(family, targets, components):
    model = built({"methods": [{"method": "bitfit", "targets": targets}]}, family)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == reference_bitfit(model, components)
    assert ("bert.pooler.dense.bias" in trainable) == (family == "bert")
    without = built({"methods": [{"method": "bitfit", "targets": targets, "pooler": False}]}, family)
    assert trainable - {n for n, p in without.named_parameters() if p.requires_grad} == (
        {"bert.pooler.dense.bias"} if family == "bert" else set())


# 7. The equations of (IA)³, DoRA, rsLoRA and VeRA, on one linear site each.

def site(model, path):
    return model.get_submodule(f"bert.encoder.layer.0.{path}")


def test_ia3_rescales_keys_values_and_the_ffn_inner_activation():
    model = perturbed(built({"methods": [{"method": "ia3"}]}))
    x, inner = torch.randn(2, 5, 32), torch.randn(2, 5, 64)
    key, ffn_out = site(model, "attention.self.key"), site(model, "output.dense")
    torch.testing.assert_close(key(x), key.scale * F.linear(x, key.base_layer.weight, key.base_layer.bias))
    base = ffn_out.base_layer  # (l_ff ⊙ γ(W_1 x)) W_2: the FFN output layer of a rescaled inner activation
    torch.testing.assert_close(ffn_out(inner), F.linear(ffn_out.scale * inner, base.weight, base.bias))
    assert site(model, "attention.output.dense").__class__ is torch.nn.Linear  # the attention output is not scaled


def test_dora_is_magnitude_times_the_normalised_direction():
    model = perturbed(built({"methods": [{"method": "lora", "rank": 4, "alpha": 8, "dora": True}]}))
    layer = site(model, "attention.self.value")
    W, b = layer.base_layer.weight, layer.base_layer.bias
    V = W + (8 / 4) * layer.lora_B.weight @ layer.lora_A.weight  # W + s·B·A
    W_dora = layer.magnitude[:, None] * V / V.norm(dim=1, keepdim=True)  # m · V / ||V||, one norm per output
    x = torch.randn(2, 5, 32)
    torch.testing.assert_close(layer(x), F.linear(x, W_dora, b))


def test_rslora_scales_by_alpha_over_the_root_of_the_rank():
    for rank in (1, 4, 16):
        spec = {"methods": [{"method": "lora", "rank": rank, "alpha": 8, "rslora": True}]}
        assert site(built(spec), "attention.self.query").scaling == pytest.approx(8 / math.sqrt(rank))


def test_vera_is_b_times_frozen_b_times_d_times_frozen_a():
    model = perturbed(built({"methods": [{"method": "vera", "rank": 6, "targets": ["query", "intermediate"]}]}))
    query, inner = site(model, "attention.self.query"), site(model, "intermediate.dense")
    assert query.projections is inner.projections  # one pair of random matrices for every layer and site
    A, B = query.projections.A, query.projections.B  # (r, largest in), (largest out, r)
    assert not A.requires_grad and not B.requires_grad
    x = torch.randn(2, 5, 32)
    for layer, out in ((query, 32), (inner, 64)):
        update = torch.diag(layer.lambda_b) @ B[:out] @ torch.diag(layer.lambda_d) @ A[:, :32]  # Λ_b B Λ_d A
        torch.testing.assert_close(layer(x), F.linear(x, layer.base_layer.weight + update, layer.base_layer.bias))


def _values_and_grads(layer, x, compute):
    """`compute(x)`'s output and the gradients of a fixed function of it for x and every trainable tensor."""
    x = x.clone().requires_grad_(True)
    out = compute(x)
    trainable = [p for p in layer.parameters() if p.requires_grad]
    grads = torch.autograd.grad((out * torch.linspace(-1, 1, out.shape[-1])).square().sum(), [x, *trainable])
    return out, grads


@pytest.mark.parametrize("tokens", [(2, 5), (4, 40)])  # rows through A and B; ΔW formed once (tested below)
@pytest.mark.parametrize("extra", [{}, {"dropout": 0.0, "gate": True}])
def test_vera_update_and_gradients_follow_the_equation_by_rows_or_by_weight(tokens, extra):
    model = perturbed(built({"methods": [{"method": "vera", "rank": 64, "targets": ["query"], **extra}]}))
    layer = site(model, "attention.self.query")
    x = torch.randn(*tokens, 32)
    assert layer.through_weight_pays(tokens[0] * tokens[1]) == (tokens == (4, 40))
    A, B, W, b = layer.projections.A, layer.projections.B, layer.base_layer.weight, layer.base_layer.bias

    def equation(x):
        update = layer.lambda_b * F.linear(layer.lambda_d * F.linear(x, A), B)  # b ⊙ B·(d ⊙ A·x)
        if layer.gate is not None:
            update = update * layer.gate(x)[:, None, :]
        return F.linear(x, W, b) + update

    got, got_grads = _values_and_grads(layer, x, layer)
    expected, expected_grads = _values_and_grads(layer, x, equation)
    torch.testing.assert_close(got, expected)
    for g, e in zip(got_grads, expected_grads):
        torch.testing.assert_close(g, e)


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_dora_gradients_hold_the_norm_constant(dropout):
    model = perturbed(built({"methods": [{"method": "lora", "rank": 4, "alpha": 8, "dora": True,
                                          "dropout": dropout}]})).train()
    layer = site(model, "attention.self.value")
    W, b = layer.base_layer.weight, layer.base_layer.bias
    x = torch.randn(2, 5, 32)

    def equation(x):  # m / sg(||V||) · V·x + bias, V = W + s·B·A, the update seeing the LoRA dropout's mask
        V = W + 2 * layer.lora_B.weight @ layer.lora_A.weight
        scale = layer.magnitude / V.norm(dim=1).detach()
        dropped = x if dropout == 0 else layer.dropout(x)
        return F.linear(x, W, b) + (scale - 1) * F.linear(dropped, W) + scale * F.linear(dropped, V - W)

    torch.manual_seed(5)
    got, got_grads = _values_and_grads(layer, x, layer)
    torch.manual_seed(5)
    expected, expected_grads = _values_and_grads(layer, x, equation)
    torch.testing.assert_close(got, expected)
    for g, e in zip(got_grads, expected_grads):
        torch.testing.assert_close(g, e)

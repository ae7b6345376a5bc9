"""The delta library's behaviour, method by method, on tiny random BERT and RoBERTa models."""

from __future__ import annotations


import pytest
import torch
from conftest import assert_padding_changes_nothing, tiny_batch, tiny_model

from autopelt import delta
from autopelt.delta.modules.mixture import MixtureLinear

CASES = {
    "lora": {"methods": [{"method": "lora", "rank": 4}]},
    "lora_all_sites_some_layers": {"methods": [{"method": "lora", "rank": 2, "dropout": 0.1, "layers": [1],
        "targets": ["query", "key", "value", "attention_output", "intermediate", "output"]}]},
    "lora_gated": {"methods": [{"method": "lora", "rank": 4, "gate": True}]},
    "houlsby": {"methods": [{"method": "houlsby", "bottleneck": 8}]},
    "pfeiffer_gelu": {"methods": [{"method": "pfeiffer", "bottleneck": 8, "activation": "gelu"}]},
    "adapter_gated": {"methods": [{"method": "adapter", "bottleneck": 8, "gate": True}]},
    "pfeiffer_gated": {"methods": [{"method": "pfeiffer", "bottleneck": 8, "gate": True}]},
    "ffn_gated": {"methods": [{"method": "adapter", "placement": "ffn", "bottleneck": 8, "gate": True}]},
    "phm_adapter": {"methods": [{"method": "phm_adapter", "bottleneck": 8, "n": 4}]},
    "compacter": {"methods": [{"method": "compacter", "bottleneck": 8, "n": 4}]},
    "compacter++_rank2": {"methods": [{"method": "compacter++", "bottleneck": 8, "n": 2, "phm_rank": 2}]},
    "prefix": {"methods": [{"method": "prefix", "length": 3, "reparam_hidden": 16}]},
    "prefix_direct_gated": {"methods": [{"method": "prefix", "length": 3, "reparam_hidden": 0, "gate": True}]},
    "prefix_split_gate": {"methods": [{"method": "prefix", "length": 3, "reparam_hidden": 16, "gate": True,
                                       "split_gate": True}]},
    "prompt": {"methods": [{"method": "prompt", "length": 4}]},
    "bitfit": {"methods": [{"method": "bitfit"}]},
    "bitfit_subset": {"methods": [{"method": "bitfit", "targets": ["query", "layernorm"], "layers": [0]}]},
    "bitfit_no_pooler": {"methods": [{"method": "bitfit", "pooler": False}]},
    "adamix_adapter": {"methods": [{"method": "adamix", "experts": 3, "delta": {"method": "adapter", "bottleneck": 8}}]},
    "adamix_adapter_unshared": {"methods": [{"method": "adamix", "experts": 3, "share_up": False,
                                             "delta": {"method": "pfeiffer", "bottleneck": 8}}]},
    "adamix_lora": {"methods": [{"method": "adamix", "experts": 2, "delta": {"method": "lora", "rank": 4}}]},
    "adamix_houlsby_independent": {"methods": [{"method": "adamix", "experts": 2, "expert_init": "independent",
                                                "delta": {"method": "houlsby", "bottleneck": 8}}]},
    "unipelt_apl": {"methods": [{"method": "pfeiffer", "bottleneck": 8, "gate": True},
                                {"method": "prefix", "length": 3, "reparam_hidden": 16, "gate": True},
                                {"method": "lora", "rank": 4, "gate": True}]},
    "prefix+lora+compacter+bitfit": {"methods": [
        {"method": "prefix", "length": 2, "reparam_hidden": 8, "layers": [1]},
        {"method": "lora", "rank": 2, "targets": ["value", "output"]},
        {"method": "compacter", "bottleneck": 8, "n": 4, "layers": [0]},
        {"method": "bitfit", "targets": ["output"]}]},
    "lora+adapter_same_site+prompt": {"methods": [
        {"method": "lora", "rank": 2, "targets": ["output"]},
        {"method": "adapter", "placement": "ffn", "bottleneck": 4},
        {"method": "prompt", "length": 2}]},
    "lora+houlsby+bitfit_layernorm": {"methods": [
        {"method": "lora", "rank": 2, "targets": ["attention_output"]}, {"method": "houlsby", "bottleneck": 4},
        {"method": "bitfit", "targets": ["layernorm", "output"]}]},
    "pfeiffer+bitfit_layernorm": {"methods": [
        {"method": "pfeiffer", "bottleneck": 4}, {"method": "bitfit", "targets": ["layernorm"]}]},
    "rslora": {"methods": [{"method": "lora", "rank": 4, "rslora": True}]},
    "rslora_gated": {"methods": [{"method": "lora", "rank": 4, "rslora": True, "gate": True}]},
    "dora": {"methods": [{"method": "lora", "rank": 4, "dora": True}]},
    "dora_rslora_all_sites_some_layers": {"methods": [{"method": "lora", "rank": 2, "dora": True, "rslora": True,
        "dropout": 0.1, "layers": [0], "targets": ["query", "key", "value", "attention_output", "intermediate",
                                                   "output"]}]},
    "ia3": {"methods": [{"method": "ia3"}]},
    "ia3_all_sites_some_layers": {"methods": [{"method": "ia3", "layers": [1], "targets": [
        "query", "key", "value", "attention_output", "intermediate", "output"]}]},
    "vera": {"methods": [{"method": "vera", "rank": 8}]},
    "vera_gated_every_shape": {"methods": [{"method": "vera", "rank": 40, "dropout": 0.1, "gate": True,
                                            "targets": ["query", "intermediate", "output"], "projection_seed": 3}]},
    "prefix_shifted": {"methods": [{"method": "prefix", "length": 3, "reparam_hidden": 16, "shift_positions": True}]},
    "dora+vera+ia3+ffn_adapter_same_site": {"methods": [
        {"method": "lora", "rank": 2, "dora": True, "targets": ["value", "output"]},
        {"method": "vera", "rank": 4, "targets": ["value", "output"]},
        {"method": "ia3", "targets": ["value", "output"]},
        {"method": "adapter", "placement": "ffn", "bottleneck": 4}]},
    "unipelt_apl+vera_gated+ia3": {"methods": [
        {"method": "pfeiffer", "bottleneck": 8, "gate": True},
        {"method": "prefix", "length": 3, "reparam_hidden": 16, "gate": True},
        {"method": "lora", "rank": 4, "gate": True, "rslora": True},
        {"method": "vera", "rank": 8, "gate": True, "targets": ["key", "value"]},
        {"method": "ia3", "targets": ["key", "output"]}]},
}
FAMILIES = ("bert", "roberta")


def changes_output_at_init(name: str) -> bool:
    """Prefixes and prompts add attention targets at once; every other method starts as the identity."""
    return "prefix" in name or "prompt" in name or name.startswith("unipelt")


def build(name: str, family: str, seed: int = 0):
    model = tiny_model(family, seed=0)
    delta.apply_delta(model, CASES[name], seed=seed)
    return model


def train_step(model, steps: int = 1, lr: float = 1e-2):
    """A few AdamW steps on random labels; AdaMix routed from an explicit generator."""
    model.train()
    optimiser = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    generator = torch.Generator().manual_seed(1)
    for step in range(steps):
        delta.route_all(model, generator)
        batch = tiny_batch(seed=step)
        loss = model(**batch, labels=torch.tensor([0, 1, 1])).loss
        loss.backward()
        optimiser.step()
        optimiser.zero_grad()
    return model.eval()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", CASES)
def test_identity_at_init_when_zero_initialised(name, family):
    base = tiny_model(family)
    batch = tiny_batch()
    expected = base(**batch).logits
    got = build(name, family)(**batch).logits
    if changes_output_at_init(name):
        assert not torch.allclose(got, expected, atol=1e-6)  # a prefix or prompt changes attention at once
    else:
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", CASES)
def test_a_step_changes_only_the_delta_and_head(name, family):
    model = build(name, family)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    train_step(model)
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed, "nothing trained"
    assert changed <= trainable
    for n, p in model.named_parameters():
        if n not in trainable:
            assert torch.equal(p, before[n]), f"frozen {n} moved"
    assert any(n.startswith("classifier") for n in changed)
    assert any(not n.startswith("classifier") for n in changed), "only the head trained"


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", CASES)
def test_analytic_count_equals_counted(name, family):
    model = build(name, family)
    count = delta.count_parameters(CASES[name], model.config)
    assert count.trainable == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert count.stored == sum(t.numel() for t in delta.delta_state(model).values())
    assert count.base == sum(p.numel() for p in tiny_model(family).parameters())


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", CASES)
def test_save_load_round_trip_gives_the_same_logits(name, family, tmp_path):
    model = train_step(build(name, family), steps=2)
    batch = tiny_batch()
    expected = model(**batch).logits
    delta.save_delta(model, CASES[name], tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["delta.json", "delta.safetensors"]
    fresh = tiny_model(family, seed=0)
    torch.nn.init.normal_(fresh.classifier.out_proj.weight if family == "roberta" else fresh.classifier.weight)
    delta.load_delta(fresh, tmp_path)
    torch.testing.assert_close(fresh.eval()(**batch).logits, expected, rtol=1e-5, atol=1e-5)


MERGEABLE = ["lora", "lora_all_sites_some_layers", "adamix_lora", "prefix+lora+compacter+bitfit", "rslora", "dora",
             "dora_rslora_all_sites_some_layers", "ia3", "ia3_all_sites_some_layers", "vera",
             "dora+vera+ia3+ffn_adapter_same_site"]


@pytest.mark.parametrize("name", MERGEABLE)
def test_merged_equals_unmerged(name):
    model = train_step(build(name, "bert"), steps=2)
    batch = tiny_batch()
    weights = {n: p.detach().clone() for n, p in model.named_parameters()}
    expected = model(**batch).logits
    delta.merge(model)
    from autopelt.delta.inject import MERGEABLE as MERGEABLE_MODULES

    wrappers = [m for m in model.modules() if isinstance(m, MERGEABLE_MODULES)]
    assert wrappers and all(m.merged for m in wrappers), "every delta on a linear folds into it"
    assert any(not torch.equal(p, weights[n]) for n, p in model.named_parameters() if not p.requires_grad)
    torch.testing.assert_close(model(**batch).logits, expected, rtol=1e-5, atol=1e-5)
    delta.unmerge(model)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p, weights[n], rtol=0, atol=1e-6)


def test_gated_lora_cannot_merge_and_model_merge_leaves_it_alone():
    from autopelt.delta.modules.lora import LoRALinear

    model = train_step(build("lora_gated", "bert"))
    batch = tiny_batch()
    expected = model(**batch).logits
    with pytest.raises(ValueError, match="gated"):
        next(m for m in model.modules() if isinstance(m, LoRALinear)).merge()
    delta.merge(model)
    torch.testing.assert_close(model(**batch).logits, expected, rtol=0, atol=0)


def _perturb_deltas(model, seed=3, gates=False):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.requires_grad and not name.startswith("classifier") and (gates or ".gate." not in name):
                p.add_(torch.randn(p.shape, generator=generator) * 0.5)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", ["adapter_gated", "lora_gated", "rslora_gated", "vera_gated_every_shape"])
def test_gate_forced_to_zero_gives_the_base_output(name, family):
    batch = tiny_batch()
    expected = tiny_model(family)(**batch).logits
    model = build(name, family)
    _perturb_deltas(model)
    assert not torch.allclose(model(**batch).logits, expected, atol=1e-4)  # the delta matters ...
    from autopelt.delta.modules.gate import Gate

    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, Gate):
                module.linear.weight.zero_()
                module.linear.bias.fill_(-1e4)
    torch.testing.assert_close(model(**batch).logits, expected, rtol=0, atol=1e-6)  # ... until its gate shuts


def test_a_rescaling_delta_over_a_gated_one_stays_unmerged():
    """(IA)³ rescales all it wraps: over a gated LoRA (which never merges) folding it into the weight would rescale W
    without the LoRA branch, so `merge` leaves both, and the logits, as they are."""
    from autopelt.delta.modules.ia3 import IA3Linear

    spec = {"methods": [{"method": "lora", "rank": 2, "gate": True, "targets": ["value"]},
                        {"method": "ia3", "targets": ["key", "value"]}]}
    model = delta.apply_delta(tiny_model(), spec)
    _perturb_deltas(model, gates=True)
    batch = tiny_batch()
    expected = model(**batch).logits
    delta.merge(model)
    merged = {name.rsplit(".", 1)[-1]: m.merged for name, m in model.named_modules() if isinstance(m, IA3Linear)}
    assert merged == {"key": True, "value": False}
    torch.testing.assert_close(model(**batch).logits, expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="merges only once"):
        next(m for m in model.modules() if isinstance(m, IA3Linear) and not m.merged).merge()


def test_vera_matrices_come_from_the_seed_and_are_not_saved(tmp_path):
    from safetensors.torch import load_file

    from autopelt.delta.modules.vera import SharedProjections

    def projections(model):
        (shared,) = {id(m): m for m in model.modules() if isinstance(m, SharedProjections)}.values()
        return shared

    spec = CASES["vera_gated_every_shape"]
    model = train_step(build("vera_gated_every_shape", "bert"))
    shared = projections(model)
    assert (tuple(shared.A.shape), tuple(shared.B.shape)) == ((40, 64), (64, 40))  # the largest site's sizes
    delta.save_delta(model, spec, tmp_path)
    saved = load_file(str(tmp_path / "delta.safetensors"))
    assert not any(v.shape in (shared.A.shape, shared.B.shape) for v in saved.values())
    assert all(k.endswith(("lambda_b", "lambda_d")) or ".gate." in k or k.startswith("classifier") for k in saved)
    fresh = delta.load_delta(tiny_model(seed=1), tmp_path)
    assert torch.equal(projections(fresh).A, shared.A) and torch.equal(projections(fresh).B, shared.B)
    other = {"methods": [{**spec["methods"][0], "projection_seed": 4}]}
    assert not torch.equal(projections(delta.apply_delta(tiny_model(), other)).A, shared.A)


def test_gate_values_are_readable_per_method_and_layer():
    assert set(delta.gate_values(build("unipelt_apl+vera_gated+ia3", "bert"), tiny_batch())) == {
        "adapter", "prefix", "lora", "vera"}
    model = build("unipelt_apl", "bert")
    values = delta.gate_values(model, tiny_batch())
    assert set(values) == {"adapter", "prefix", "lora"}
    assert set(values["adapter"]) == {"0", "1"}
    assert all(0.0 < v < 1.0 for kind in values.values() for v in kind.values())


def test_adamix_merged_weights_are_the_mean_of_the_experts():
    model = train_step(build("adamix_adapter_unshared", "bert"), steps=3)
    mixtures = [m for m in model.modules() if isinstance(m, MixtureLinear)]
    assert mixtures and all(m.experts == 3 for m in mixtures)
    for m in mixtures:
        torch.testing.assert_close(m.stored_state()["weight"], m.weight.mean(0))
        torch.testing.assert_close(m.stored_state()["bias"], m.bias.mean(0))
    assert any(not torch.equal(m.weight[0], m.weight[1]) for m in mixtures), "experts should differ after training"


def test_adamix_routing_is_reproducible_from_the_seed():
    def routes(seed):
        model = build("adamix_adapter_unshared", "bert")
        generator = torch.Generator().manual_seed(seed)
        draws = []
        for _ in range(20):
            delta.route_all(model, generator)
            draws.append(tuple(m.active for m in model.modules() if isinstance(m, MixtureLinear)))
        return draws

    assert routes(7) == routes(7)
    assert routes(7) != routes(8)
    assert len({d for step in routes(7) for d in step}) == 3  # every expert gets used


def test_adamix_training_uses_one_expert_and_eval_the_average():
    model = train_step(build("adamix_adapter", "bert"), steps=3)
    batch = tiny_batch()
    mixture = next(m for m in model.modules() if isinstance(m, MixtureLinear))
    x = torch.randn(2, 5, mixture.weight.shape[-1])
    mixture.train()
    mixture.active = 2
    torch.testing.assert_close(mixture(x), x @ mixture.weight[2].T + mixture.bias[2])
    mixture.eval()
    torch.testing.assert_close(mixture(x), x @ mixture.weight.mean(0).T + mixture.bias.mean(0))
    assert model(**batch).logits.shape == (3, 2)


def test_consistency_loss_is_a_symmetric_divergence():
    a, b = torch.randn(4, 3), torch.randn(4, 3)
    assert float(delta.consistency_loss(a, a)) == pytest.approx(0.0, abs=1e-7)
    assert float(delta.consistency_loss(a, b)) > 0
    assert float(delta.consistency_loss(a, b)) == pytest.approx(float(delta.consistency_loss(b, a)), rel=1e-6)


def _adapter_weights_without_biases(model) -> int:
    return sum(p.numel() for n, p in model.named_parameters()
               if p.requires_grad and ".adapter." in n and not n.endswith("bias"))


@pytest.mark.parametrize("n,k", [(2, 8), (4, 8), (8, 16)])
def test_compacter_and_phm_match_their_closed_forms(n, k):
    d, layers = 32, 2  # the tiny config's hidden size and depth
    compacter = build_spec({"methods": [{"method": "compacter", "bottleneck": k, "n": n}]})
    assert _adapter_weights_without_biases(compacter) == 4 * layers * (k + d) + n ** 3
    plus_plus = build_spec({"methods": [{"method": "compacter++", "bottleneck": k, "n": n}]})
    assert _adapter_weights_without_biases(plus_plus) == 2 * layers * (k + d) + n ** 3
    phm = build_spec({"methods": [{"method": "phm_adapter", "bottleneck": k, "n": n}]})
    projections = 2 * 2 * layers  # down + up, two adapters per layer
    assert _adapter_weights_without_biases(phm) == projections * (k * d // n + n ** 3)


def build_spec(spec, family="bert"):
    model = tiny_model(family)
    delta.apply_delta(model, spec)
    return model


def test_phm_weight_is_the_kronecker_sum():
    from autopelt.delta.modules.phm import PHMLinear, new_rule

    g = torch.Generator().manual_seed(0)
    layer = PHMLinear(8, 12, new_rule(4, g), None, g)
    expected = sum(torch.kron(layer.rule[i], layer.B[i]) for i in range(4))
    torch.testing.assert_close(layer.weight(), expected)
    low_rank = PHMLinear(8, 12, new_rule(4, g), 1, g)
    B = low_rank.s @ low_rank.t
    torch.testing.assert_close(low_rank.weight(), sum(torch.kron(low_rank.rule[i], B[i]) for i in range(4)))


def test_compacter_shares_one_rule_across_layers_and_positions():
    model = build_spec({"methods": [{"method": "compacter", "bottleneck": 8, "n": 4}]})
    from autopelt.delta.modules.phm import PHMLinear

    rules = {id(m.rule) for m in model.modules() if isinstance(m, PHMLinear)}
    assert len(rules) == 1
    phm = build_spec({"methods": [{"method": "phm_adapter", "bottleneck": 8, "n": 4}]})
    assert len({id(m.rule) for m in phm.modules() if isinstance(m, PHMLinear)}) == 8


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("name", ["prefix", "prompt", "prefix+lora+compacter+bitfit", "lora+adapter_same_site+prompt",
                                  "unipelt_apl", "gated_adapter+prompt", "prefix_shifted", "vera_gated_every_shape",
                                  "dora+vera+ia3+ffn_adapter_same_site", "unipelt_apl+vera_gated+ia3"])
def test_padding_does_not_change_a_sequence_result(name, attn):
    """A row's logits are the same alone and right-padded inside a longer batch (masks handled, gates included)."""
    model = tiny_model("bert", attn_implementation=attn)
    spec = CASES.get(name) or {"methods": [{"method": "adapter", "bottleneck": 8, "gate": True},
                                           {"method": "prompt", "length": 4}]}
    delta.apply_delta(model, spec)
    _perturb_deltas(model, gates=True)
    model.eval()
    assert_padding_changes_nothing(model)


def test_gates_see_the_padding_mask_only_during_a_pass():
    from autopelt.delta.modules.gate import Gate

    model = build("unipelt_apl", "bert").eval()
    gates = [m for m in model.modules() if isinstance(m, Gate)]
    assert len({id(g.padding) for g in gates}) == 1  # one mask per model, shared
    seen = []
    gates[0].register_forward_hook(lambda gate, args, out: seen.append(gate.padding.current))
    batch = tiny_batch(batch_size=3, seq_len=9, padded=True)
    model(**batch)
    assert torch.equal(seen[0], batch["attention_mask"])
    assert gates[0].padding.current is None


def test_prefix_keys_are_visible_to_padded_rows_too():
    from autopelt.delta.modules.prefix import extend_mask

    bool_mask = torch.tensor([[[[True, False]]]])
    assert extend_mask(bool_mask, 2).tolist() == [[[[True, True, True, False]]]]
    additive = torch.tensor([[[[0.0, -1e9]]]])
    assert extend_mask(additive, 1).tolist() == [[[[0.0, 0.0, -1e9]]]]
    assert extend_mask(None, 3) is None


def test_sizes_of_saved_prefix_are_the_prefix_matrices_only(tmp_path):
    model = build("prefix", "bert")
    delta.save_delta(model, CASES["prefix"], tmp_path)
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "delta.safetensors"))
    prefix = [v for k, v in saved.items() if "prefix" in k]
    assert [tuple(v.shape) for v in prefix] == [(2, 2, 3, 32)]  # (layers, key/value, L, H)
    assert not any("mlp" in k or "embedding" in k for k in saved)

"""The one place that changes a model: build a spec's modules around the frozen base modules.

Methods are injected in a fixed order (BitFit, LoRA, VeRA, (IA)³, adapters, prefix, prompt), so module paths, and
with them the names in a saved delta, depend only on the spec. On one linear, LoRA wraps the linear itself (DoRA needs
its weight), VeRA wraps that, and (IA)³, which rescales everything under it, wraps both.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from autopelt.delta.modules.adapter import AdapterWrapper, Bottleneck, PostNormAdapter
from autopelt.delta.modules.decoder import (CachePrefix, LastToken, LayerGates, LeadingPrompt, PrefixHidden,
                                            T5CachePrefix)
from autopelt.delta.modules.gate import Gate, PaddingMask, init_linear_, masked_mean
from autopelt.delta.modules.ia3 import IA3Linear
from autopelt.delta.modules.lora import DoRALinear, LoRALinear
from autopelt.delta.modules.mixture import MixtureLinear, init_experts_
from autopelt.delta.modules.phm import PHMLinear, new_rule
from autopelt.delta.modules.prefix import PositionShift, PrefixEncoder, PrefixSelfAttention, T5PrefixAttention
from autopelt.delta.modules.prompt import EncoderPrompt, SoftPrompt
from autopelt.delta.modules.vera import SharedProjections, VeRALinear
from autopelt.delta.sites import Architecture, Stack, architecture_of, chosen_layers, linear_shape
from autopelt.delta.spec import (
    BIAS_SITES, AdaMixConfig, AdapterConfig, BitFitConfig, DeltaSpec, IA3Config, LoRAConfig, PrefixConfig,
    PromptConfig, VeRAConfig, parse_spec,
)
from autopelt.errors import UserError

ORDER = ("bitfit", "lora", "vera", "ia3", "adapter", "prefix", "prompt")
MERGEABLE = (LoRALinear, VeRALinear, IA3Linear)


@dataclass(frozen=True)
class Mixture:
    """How an AdaMix entry builds its delta's projections: `experts` of each, the up-projection shared or not."""

    experts: int = 1
    share_up: bool = True
    copy: bool = True  # every expert starts as a copy of one draw

    @classmethod
    def of(cls, config) -> Mixture:
        if not isinstance(config, AdaMixConfig):
            return cls()
        return cls(config.experts, config.share_up, config.expert_init == "copy")

    def count(self, up: bool) -> int:
        return 1 if up and self.share_up else self.experts


def apply_delta(model: nn.Module, spec, seed: int = 0) -> nn.Module:
    """Freeze `model`, add the delta of `spec` (its weights drawn from `seed`), leave the head trainable."""
    spec = parse_spec(spec)
    arch = architecture_of(model.config)
    check_fits(spec, model.config)
    generator = torch.Generator().manual_seed(seed)
    model.requires_grad_(False)
    for config in sorted(spec.methods, key=lambda m: ORDER.index(DeltaSpec._family(m))):
        inner = config.delta if isinstance(config, AdaMixConfig) else config
        BUILDERS[type(inner)](model, arch, inner, generator, Mixture.of(config))
    _share_padding_mask(model, arch)
    head = getattr(model, arch.head, None)  # None on a language model: its LM head is part of the frozen base
    if arch.causal and head is not None:
        _read_last_token(model, arch)
    if spec.pooling == "mean":
        _pool_mean(model, arch)
    if head is not None:
        head.requires_grad_(True)
    return model


def _read_last_token(model: nn.Module, arch: Architecture) -> None:
    """A decoder classifier's head reads the last real token (hooks registered after any prefix's or prompt's)."""
    last = LastToken()
    backbone = arch.backbone_of(model)
    backbone.register_forward_pre_hook(last.capture, with_kwargs=True)
    backbone.register_forward_hook(last.release, with_kwargs=True)


def _pool_mean(model: nn.Module, arch: Architecture) -> None:
    """Let the head read the mean of the last layer's token states over real tokens: as BERT's pooler output
    (its dense layer and tanh are skipped, so nothing in it trains, BitFit's bias included), or as the first token
    RoBERTa's head reads. Hooks only, so the model's modules and parameter names stay as they are."""
    padding = PaddingMask()
    backbone = arch.backbone_of(model)
    backbone.register_forward_pre_hook(padding.capture, with_kwargs=True)  # after a soft prompt's: its tokens count
    if arch.pooler is not None:
        backbone.register_forward_hook(padding.release)
        pooler = backbone.get_submodule(arch.pooler.rpartition(".")[0])
        pooler.requires_grad_(False)
        pooler.register_forward_hook(lambda module, args, output: masked_mean(args[0], padding.current))
    else:  # the head runs after the backbone's pass: the mask is kept until the next pass replaces it
        model.get_submodule(arch.head).register_forward_pre_hook(
            lambda module, args: (masked_mean(args[0], padding.current)[:, None], *args[1:]))


def _share_padding_mask(model: nn.Module, arch: Architecture) -> None:
    """Give the gates the padding mask of each pass (hooks registered after the soft prompt's, so it is in). On an
    encoder-decoder the encoder's: the decoder's gates are per token."""
    gates = [module for module in model.modules() if isinstance(module, Gate)]
    if not gates:
        return
    padding = PaddingMask()
    for gate in gates:
        gate.padding = padding
    encoder_decoder = getattr(model.config, "is_encoder_decoder", False)
    backbone = model.get_encoder() if encoder_decoder else arch.backbone_of(model)
    backbone.register_forward_pre_hook(padding.capture, with_kwargs=True)
    backbone.register_forward_hook(padding.release)


def check_fits(spec: DeltaSpec, config) -> None:
    """Errors a spec has only against a given model (sizes that must divide, layers that must exist)."""
    arch = architecture_of(config)
    if spec.pooling == "mean" and arch.reads_one_token:
        token = "decoder's state at the last <eos>" if arch.family == "t5" else "last token"
        raise UserError(f"mean pooling is for encoders: a {arch.family} classifier's head reads the {token} "
                        "(use --pooling cls)")
    for method in spec.methods:
        inner = method.delta if isinstance(method, AdaMixConfig) else method
        _check_applies(inner, arch)
        chosen_layers(getattr(inner, "layers", None), arch.num_layers(config))
        if hasattr(inner, "targets") and not isinstance(inner, BitFitConfig):
            arch.sites(inner.targets)
        if isinstance(inner, AdapterConfig) and inner.projection != "dense":
            if config.hidden_size % inner.n:
                raise UserError(f"adapter.n = {inner.n} must divide the model's hidden size {config.hidden_size}")
        if isinstance(inner, LoRAConfig):
            smallest = min(min(linear_shape(config, site)) for site in arch.sites(inner.targets))
            if inner.rank > smallest:
                raise UserError(f"lora.rank = {inner.rank} exceeds the smallest adapted dimension {smallest}")


def _check_applies(method, arch: Architecture) -> None:
    """A one-line error for a method this family cannot take (the search spaces skip it, see `applies`)."""
    reason = why_not(method, arch)
    if reason:
        raise UserError(f"{method.method} cannot apply to {arch.family}: {reason}")


def why_not(method, arch: Architecture) -> str | None:
    """Why `method` (a config) cannot apply to models of this family; None when it can."""
    if isinstance(method, BitFitConfig) and arch.no_bias:
        return arch.no_bias
    if method.method in arch.unsupported:
        return arch.unsupported[method.method]
    if isinstance(method, PrefixConfig) and method.shift_positions and arch.family == "t5" and method.layers:
        return "peft's T5 prefix (prefix.shift_positions) fills every decoder layer's cache; leave prefix.layers out"
    return None


def merge(model: nn.Module) -> nn.Module:
    """Fold every ungated LoRA, DoRA and VeRA, and every (IA)³ over merged deltas, into its base weight (AdaMix
    experts are averaged in eval mode anyway). Innermost first: a rescaling wrapper needs what it wraps merged."""
    for module in reversed(list(model.modules())):
        if isinstance(module, MERGEABLE) and module.can_merge():
            module.merge()
    return model


def unmerge(model: nn.Module) -> nn.Module:
    for module in model.modules():  # outermost first, the reverse of merging
        if isinstance(module, MERGEABLE):
            module.unmerge()
    return model


def _replace(layer: nn.Module, path: str, build) -> None:
    parent_path, _, name = path.rpartition(".")
    parent = layer.get_submodule(parent_path) if parent_path else layer
    base = getattr(parent, name)
    new = build(base)
    device = next(layer.parameters()).device  # the base may hold none (a dropout)
    setattr(parent, name, new.to(device))


def _linear(in_features, out_features, generator, mixture: Mixture = Mixture(), up=False, bias=True) -> nn.Module:
    """A down-projection (Kaiming-uniform) or an up-projection (zero): one linear, or AdaMix's experts of it."""
    experts = mixture.count(up)
    if experts > 1:
        mixed = MixtureLinear(in_features, out_features, experts, bias=bias)
        init_experts_(mixed, generator, zero=up, copy=mixture.copy)
        return mixed
    linear = nn.Linear(in_features, out_features, bias=bias)
    init_linear_(linear, generator, zero=up)
    return linear


def _gate(in_features, heads, kind, layer, generator, per_token=False) -> Gate:
    gate = Gate(in_features, heads, kind, layer, per_token)
    init_linear_(gate.linear, generator)
    return gate


def _per_token(arch: Architecture, stack: Stack) -> bool:
    """A gate in a causal stack (a decoder, T5's decoder) is computed per token: a mean over the sequence would let
    a token read the ones after it."""
    return arch.causal or stack.causal


def _site_layers(model, arch: Architecture, cfg) -> list[tuple[int, nn.Module, Stack, str]]:
    """(layer index, layer, its stack, site) for each chosen layer and target site it has, layer by layer."""
    entries = arch.layer_entries(model)
    sites = arch.sites(cfg.targets)
    return [(i, entries[i][0], entries[i][1], site) for i in chosen_layers(cfg.layers, len(entries))
            for site in sites if site in entries[i][1].linears]


def _build_lora(model, arch: Architecture, cfg: LoRAConfig, generator, mixture: Mixture) -> None:
    for i, layer, stack, site in _site_layers(model, arch, cfg):
        in_f, out_f = linear_shape(model.config, site)
        lora_A = _linear(in_f, cfg.rank, generator, mixture, bias=False)
        lora_B = _linear(cfg.rank, out_f, generator, mixture, up=True, bias=False)
        gate = _gate(in_f, 1, "lora", i, generator, _per_token(arch, stack)) if cfg.gate else None
        _replace(layer, stack.linears[site], lambda base: _lora(base, cfg, lora_A, lora_B, gate))


def _lora(base: nn.Module, cfg: LoRAConfig, lora_A, lora_B, gate: Gate | None) -> LoRALinear:
    if cfg.dora:  # never gated (the spec refuses it)
        return DoRALinear(base, lora_A, lora_B, cfg.scaling, cfg.dropout)
    return LoRALinear(base, lora_A, lora_B, cfg.scaling, cfg.dropout, gate)


def _build_vera(model, arch: Architecture, cfg: VeRAConfig, generator, _: Mixture) -> None:
    shapes = [linear_shape(model.config, site) for site in arch.sites(cfg.targets)]
    largest_in, largest_out = max(s[0] for s in shapes), max(s[1] for s in shapes)  # as peft's VeRA sizes them
    projections = SharedProjections(cfg.rank, largest_in, largest_out, cfg.projection_seed)
    for i, layer, stack, site in _site_layers(model, arch, cfg):
        in_f, out_f = linear_shape(model.config, site)
        gate = _gate(in_f, 1, "vera", i, generator, _per_token(arch, stack)) if cfg.gate else None
        _replace(layer, stack.linears[site],
                 lambda base: VeRALinear(base, projections, in_f, out_f, cfg.d_initial, cfg.dropout, gate))


def _build_ia3(model, arch: Architecture, cfg: IA3Config, generator, _: Mixture) -> None:
    for _, layer, stack, site in _site_layers(model, arch, cfg):
        in_f, out_f = linear_shape(model.config, site)
        on_input = site == "output"  # the FFN output layer: its input is the inner activation (l_ff)
        _replace(layer, stack.linears[site], lambda base: IA3Linear(base, in_f if on_input else out_f, on_input))


def _adapter_projection(cfg: AdapterConfig, in_f, out_f, generator, rule, mixture: Mixture, up: bool) -> nn.Module:
    if cfg.projection == "dense":
        return _linear(in_f, out_f, generator, mixture, up)
    if cfg.projection == "phm":
        return PHMLinear(in_f, out_f, new_rule(cfg.n, generator), None, generator, up)
    return PHMLinear(in_f, out_f, rule, cfg.phm_rank, generator, up)


def adapter_positions(cfg: AdapterConfig, arch: Architecture, stack: Stack) -> list[tuple[str, type[nn.Module]]]:
    """(path inside a layer, wrapper) of each adapter a layer of `stack` gets under `cfg.placement`."""
    if cfg.placement == "houlsby":  # after each sublayer's dropout, before its LayerNorm (pre-norm: its residual)
        return [(stack.dropouts[site], AdapterWrapper) for site in ("attention_output", "output")]
    if cfg.placement == "pfeiffer" and not arch.pre_norm:  # on the FFN's normalised sum, through its LayerNorm
        return [(stack.layernorms["output"], PostNormAdapter)]
    if cfg.placement == "pfeiffer":  # pre-norm: the FFN's output joins the residual un-normalised, as AdapterHub's
        return [(stack.dropouts["output"], AdapterWrapper)]
    return [(stack.linears["output"], AdapterWrapper)]  # ffn: on the FFN projection, before its dropout


def _build_adapter(model, arch: Architecture, cfg: AdapterConfig, generator, mixture: Mixture) -> None:
    entries = arch.layer_entries(model)
    hidden = model.config.hidden_size
    rule = new_rule(cfg.n, generator) if cfg.projection == "compacter" else None  # one rule for the model
    for i in chosen_layers(cfg.layers, len(entries)):
        layer, stack = entries[i]
        for path, wrapper in adapter_positions(cfg, arch, stack):
            down = _adapter_projection(cfg, hidden, cfg.bottleneck, generator, rule, mixture, up=False)
            up = _adapter_projection(cfg, cfg.bottleneck, hidden, generator, rule, mixture, up=True)
            gate = _gate(hidden, 1, "adapter", i, generator, _per_token(arch, stack)) if cfg.gate else None
            adapter = Bottleneck(down, up, cfg.activation)
            _replace(layer, path, lambda base: wrapper(base, adapter, gate))


def _build_prefix(model, arch: Architecture, cfg: PrefixConfig, generator, _: Mixture) -> None:
    if arch.causal:
        return _build_cache_prefix(model, arch, cfg, generator)
    if getattr(model.config, "is_encoder_decoder", False):
        return _build_t5_prefix(model, arch, cfg, generator)
    entries = arch.layer_entries(model)
    rows = chosen_layers(cfg.layers, len(entries))
    hidden = model.config.hidden_size
    encoder = PrefixEncoder(len(rows), cfg.length, hidden, cfg.reparam_hidden, generator)
    for row, i in enumerate(rows):
        gate = _gate(hidden, 2 if cfg.split_gate else 1, "prefix", i, generator) if cfg.gate else None
        layer, stack = entries[i]
        _replace(layer, stack.self_attention, lambda base: PrefixSelfAttention(base, encoder, row, gate))
    if cfg.shift_positions:
        embeddings = arch.backbone_of(model).get_submodule(arch.embeddings)
        embeddings.register_forward_pre_hook(PositionShift(cfg.length), with_kwargs=True)


def key_width(config) -> tuple[int, int]:
    """(heads, head size) of one layer's keys: fewer heads than the queries' under grouped-query attention."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return heads, getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _build_cache_prefix(model, arch: Architecture, cfg: PrefixConfig, generator) -> None:
    heads, head_dim = key_width(model.config)
    entries = arch.layer_entries(model)
    layers = chosen_layers(cfg.layers, len(entries))
    encoder = PrefixEncoder(len(layers), cfg.length, heads * head_dim, cfg.reparam_hidden, generator)
    backbone = arch.backbone_of(model)
    device = next(backbone.parameters()).device
    backbone.add_module("prefix_encoder", encoder.to(device))
    gates = LayerGates(len(layers), 2 if cfg.split_gate else 1, layers) if cfg.gate else None
    if gates is not None:
        backbone.add_module("prefix_gates", gates.to(device))
    hook = CachePrefix(encoder, heads, head_dim, cfg.shift_positions, layers, len(entries), gates)
    backbone.register_forward_pre_hook(hook, with_kwargs=True)
    for i, (layer, stack) in enumerate(entries):
        if i not in layers:
            _replace(layer, stack.self_attention, lambda base: PrefixHidden(base, cfg.length))


def _build_t5_prefix(model, arch: Architecture, cfg: PrefixConfig, generator) -> None:
    """A row of prefix keys and values for each chosen layer's attentions: the encoder's self-attention, the decoder's
    self-attention and cross-attention (AdapterHub's T5 prefix-tuning); with `shift_positions`, peft's: the
    decoder's self-attention alone, through its cache."""
    if cfg.shift_positions:
        return _build_t5_cache_prefix(model, cfg, generator)
    entries = arch.layer_entries(model)
    sites = [(i, path) for i in chosen_layers(cfg.layers, len(entries)) for path in entries[i][1].attentions]
    encoder = PrefixEncoder(len(sites), cfg.length, model.config.num_heads * model.config.d_kv, cfg.reparam_hidden,
                            generator)
    gates = LayerGates(len(sites), 2 if cfg.split_gate else 1, [i for i, _ in sites]) if cfg.gate else None
    if gates is not None:
        model.add_module("prefix_gates", gates.to(next(model.parameters()).device))
    for row, (i, path) in enumerate(sites):
        _replace(entries[i][0], path, lambda base: T5PrefixAttention(base, encoder, row, gates))


def _build_t5_cache_prefix(model, cfg: PrefixConfig, generator) -> None:
    config = model.config
    layers, start = int(config.num_decoder_layers), int(config.num_layers)
    encoder = PrefixEncoder(layers, cfg.length, config.num_heads * config.d_kv, cfg.reparam_hidden, generator)
    device = next(model.parameters()).device
    model.add_module("prefix_encoder", encoder.to(device))
    gates = None
    if cfg.gate:
        gates = LayerGates(layers, 2 if cfg.split_gate else 1, list(range(start, start + layers))).to(device)
        model.add_module("prefix_gates", gates)
    hook = T5CachePrefix(encoder, config.num_heads, config.d_kv, gates)
    model.get_decoder().register_forward_pre_hook(hook, with_kwargs=True)


def _build_prompt(model, arch: Architecture, cfg: PromptConfig, generator, _: Mixture) -> None:
    backbone = arch.backbone_of(model)
    vocabulary = backbone.get_input_embeddings().weight
    tokens = torch.randint(vocabulary.shape[0], (cfg.length,), generator=generator)
    prompt = SoftPrompt(vocabulary.detach()[tokens.to(vocabulary.device)].float())  # start from real words
    backbone.add_module("soft_prompt", prompt)
    if getattr(model.config, "is_encoder_decoder", False):
        hooks = EncoderPrompt(prompt)
        model.get_encoder().register_forward_pre_hook(hooks.encoder, with_kwargs=True)
        model.get_decoder().register_forward_pre_hook(hooks.decoder, with_kwargs=True)
        return
    hook = LeadingPrompt(prompt) if arch.causal else prompt.hook
    backbone.register_forward_pre_hook(hook, with_kwargs=True)


def _build_bitfit(model, arch: Architecture, cfg: BitFitConfig, generator, _: Mixture) -> None:
    entries = arch.layer_entries(model)
    backbone = arch.backbone_of(model)
    targets = cfg.targets or BIAS_SITES
    sites = {arch.aliases.get(t, t) for t in targets}
    for i in chosen_layers(cfg.layers, len(entries)):
        layer, stack = entries[i]
        paths = [stack.linears[t] for t in sorted(sites) if t in stack.linears]
        paths += list(stack.layernorms.values()) if "layernorm" in targets else []
        for path in paths:
            layer.get_submodule(path).bias.requires_grad_(True)
    if "embeddings" in targets and arch.embeddings_layernorm is not None:
        backbone.get_submodule(arch.embeddings_layernorm).bias.requires_grad_(True)
    if cfg.pooler and arch.pooler is not None:
        backbone.get_submodule(arch.pooler).bias.requires_grad_(True)


BUILDERS = {
    LoRAConfig: _build_lora, AdapterConfig: _build_adapter, PrefixConfig: _build_prefix,
    PromptConfig: _build_prompt, BitFitConfig: _build_bitfit, VeRAConfig: _build_vera, IA3Config: _build_ia3,
}

"""The one place that changes a model: build a spec's modules around the frozen base modules.

Each method builds its own modules (its registry entry's `build`, given a `Build`); the methods are built in the
order their entries give (BitFit, LoRA, VeRA, (IA)³, adapters, prefix, prompt), so module paths, and with them the
names in a saved delta, depend only on the spec. On one linear, LoRA wraps the linear itself (DoRA needs its
weight), VeRA wraps that, and (IA)³, which rescales everything under it, wraps both.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from autopelt.delta.modules.decoder import LastToken
from autopelt.delta.modules.gate import Gate, PaddingMask, init_linear_, masked_mean
from autopelt.delta.modules.ia3 import IA3Linear
from autopelt.delta.modules.lora import LoRALinear
from autopelt.delta.modules.mixture import MixtureLinear, init_experts_
from autopelt.delta.modules.vera import VeRALinear
from autopelt.delta.registry import ENTRIES, Mixture, innermost, method_of
from autopelt.delta.sites import Architecture, Stack, chosen_layers
from autopelt.delta.families import architecture_of
from autopelt.delta.spec import DeltaSpec, parse_spec
from autopelt.errors import UserError

MERGEABLE = (LoRALinear, VeRALinear, IA3Linear)


@dataclass(frozen=True)
class Build:
    """What a method's `build` is given: the model, its family, the generator its weights are drawn from and the
    mixture it is built under (AdaMix's experts; one otherwise), with the helpers that draw and place modules."""

    model: nn.Module
    arch: Architecture
    generator: torch.Generator
    mixture: Mixture = Mixture()

    @property
    def config(self):
        """The model's transformers config."""
        return self.model.config

    def mixed(self, mixture: Mixture) -> Build:
        """This build under `mixture`: a wrapper (AdaMix) builds its delta through it."""
        return dataclasses.replace(self, mixture=mixture)

    def linear(self, in_features: int, out_features: int, up: bool = False, bias: bool = True) -> nn.Module:
        """A down-projection (Kaiming-uniform) or an up-projection (zero): one linear, or the mixture's experts."""
        experts = self.mixture.count(up)
        if experts > 1:
            mixed = MixtureLinear(in_features, out_features, experts, bias=bias)
            init_experts_(mixed, self.generator, zero=up, copy=self.mixture.copy)
            return mixed
        linear = nn.Linear(in_features, out_features, bias=bias)
        init_linear_(linear, self.generator, zero=up)
        return linear

    def gate(self, in_features: int, heads: int, kind: str, layer: int, stack: Stack | None = None) -> Gate:
        """A UniPELT gate on layer `layer`; per token in a causal stack (given `stack`), where a mean over the
        sequence would let a token read the ones after it."""
        gate = Gate(in_features, heads, kind, layer, stack is not None and (self.arch.causal or stack.causal))
        init_linear_(gate.linear, self.generator)
        return gate

    def replace(self, layer: nn.Module, path: str, build) -> None:
        """Put `build(base)` where the module at `path` inside `layer` was."""
        parent_path, _, name = path.rpartition(".")
        parent = layer.get_submodule(parent_path) if parent_path else layer
        new = build(getattr(parent, name))
        device = next(layer.parameters()).device  # the base may hold none (a dropout)
        setattr(parent, name, new.to(device))

    def site_layers(self, cfg) -> list[tuple[int, nn.Module, Stack, str]]:
        """(layer index, layer, its stack, site) for each of `cfg.layers` and each of its target sites the layer's
        stack has, layer by layer."""
        entries = self.arch.layer_entries(self.model)
        sites = self.arch.sites(cfg.targets)
        return [(i, entries[i][0], entries[i][1], site) for i in chosen_layers(cfg.layers, len(entries))
                for site in sites if site in entries[i][1].linears]


def apply_delta(model: nn.Module, spec, seed: int = 0) -> nn.Module:
    """Freeze `model`, add the delta of `spec` (its weights drawn from `seed`), leave the head trainable.

    Returns:
        `model` itself, changed in place.
    Raises:
        UserError: the spec is invalid, or does not fit this model (`check_fits`).
    """
    spec = parse_spec(spec)
    arch = architecture_of(model.config)
    check_fits(spec, model.config)
    at = Build(model, arch, torch.Generator().manual_seed(seed))
    model.requires_grad_(False)
    for config in sorted(spec.methods, key=lambda m: ENTRIES[innermost(m).method].order):
        method_of(config).build(at, config)
    _share_padding_mask(model, arch)
    read_head_input(model, spec, arch)
    if getattr(model, arch.head, None) is not None:  # None on a language model: its LM head is part of the base
        for part in arch.head_parts:
            model.get_submodule(part).requires_grad_(True)
    return model


def read_head_input(model: nn.Module, spec: DeltaSpec, arch: Architecture) -> None:
    """Hook what the task head reads as `spec` says: a decoder's last real token, the mean under mean pooling
    (`apply_delta`; a pack's shared model, delta/packing.py, reads as its members do)."""
    head = getattr(model, arch.head, None)
    if arch.causal and head is not None:
        _read_last_token(model, arch)
    if spec.pooling == "mean":
        _pool_mean(model, arch)


def _read_last_token(model: nn.Module, arch: Architecture) -> None:
    """A decoder classifier's head reads the last real token (hooks registered after any prefix's or prompt's)."""
    last = LastToken()
    backbone = arch.backbone_of(model)
    backbone.register_forward_pre_hook(last.capture, with_kwargs=True)
    backbone.register_forward_hook(last.release, with_kwargs=True)


def _pool_mean(model: nn.Module, arch: Architecture) -> None:
    """Let the head read the mean of the last layer's token states over real tokens: as BERT's pooler output
    (its dense layer and tanh are skipped, so nothing in it trains, BitFit's bias included), as the first token
    a head that reads the sequence takes (RoBERTa's, DeBERTa's pooler), or as the vector a head that is given the
    first token's state reads (DistilBERT's, ModernBERT's, ALBERT's after its frozen pooler). Hooks only, so the
    model's modules and parameter names stay as they are."""
    padding = PaddingMask()
    backbone = arch.backbone_of(model)
    backbone.register_forward_pre_hook(padding.capture, with_kwargs=True)  # after a soft prompt's: its tokens count
    if arch.pooler is not None:
        backbone.register_forward_hook(padding.release)
        pooler = backbone.get_submodule(arch.pooler.rpartition(".")[0])
        pooler.requires_grad_(False)
        pooler.register_forward_hook(lambda module, args, output: masked_mean(args[0], padding.current))
        return
    states = {}  # the last pass's token states, for a head given only the first token's (B, H)
    backbone.register_forward_hook(lambda module, args, output: states.update(last=output[0]))

    def mean_instead(module, args):  # the head runs after the backbone's pass: the mask is kept until the next one
        read = args[0]
        if read.dim() == 3:  # (B, T, H): the head takes the first token itself
            return (masked_mean(read, padding.current)[:, None], *args[1:])
        return (masked_mean(states["last"], padding.current).to(read.dtype), *args[1:])  # (B, H)

    model.get_submodule(arch.head_parts[0]).register_forward_pre_hook(mean_instead)


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
    """Errors a spec has only against a given model (sizes that must divide, layers and sites that must exist).

    Raises:
        UserError: the first such error, in one line.
    """
    arch = architecture_of(config)
    if spec.pooling == "mean" and arch.reads_one_token:
        token = "decoder's state at the last <eos>" if len(arch.stacks) == 2 else "last token"
        raise UserError(f"mean pooling is for encoders: a {arch.family} classifier's head reads the {token} "
                        "(use --pooling cls)")
    for method in spec.methods:
        inner = innermost(method)
        reason = why_not(inner, arch)
        if reason:  # the search spaces skip such a method (space_models.py)
            raise UserError(f"{inner.method} cannot apply to {arch.family}: {reason}")
        chosen_layers(getattr(inner, "layers", None), arch.num_layers(config))
        method_of(inner).fits(inner, config, arch)


def why_not(method, arch: Architecture) -> str | None:
    """Why `method` (a config) cannot apply to models of this family; None when it can."""
    if method.method in arch.unsupported:
        return arch.unsupported[method.method]
    return method_of(method).refuses(method, arch)


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

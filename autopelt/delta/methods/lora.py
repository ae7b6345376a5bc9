"""LoRA (Hu et al. 2021), with rsLoRA's and DoRA's forms as fields: W + s·B·A on chosen linear layers."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar

from autopelt.delta.config import LINEAR_SITES, MethodConfig, require
from autopelt.delta.fields import BOOL, LAYER_INDICES, POSITIVE_INT, POSITIVE_NUMBER, PROBABILITY, declare, site_list
from autopelt.delta.registry import Method, Stack, register
from autopelt.delta.families import linear_shape, linears_of
from autopelt.errors import UserError


@dataclass(frozen=True)
class LoRAConfig(MethodConfig):
    method: ClassVar[str] = "lora"
    summary: ClassVar[str] = "low-rank update W + (alpha/r)·B·A on chosen linear layers (Hu et al. 2021)"

    rank: int = declare("rank r of the update", 8, POSITIVE_INT, abbrev="r")
    alpha: float = declare("scaling numerator: the update is multiplied by alpha/rank (ignored when gated)", 16.0,
                           POSITIVE_NUMBER)
    targets: tuple[str, ...] = declare(f"linear layers to adapt, among {', '.join(LINEAR_SITES)}", ("query", "value"),
                                       site_list(LINEAR_SITES))
    dropout: float = declare("dropout on the LoRA branch input", 0.0, PROBABILITY)
    gate: bool = declare("UniPELT gate G_L = sigmoid(W·h_in) replaces alpha/rank", False, BOOL)
    layers: tuple[int, ...] | None = declare("layer indices to adapt; null = all", None, LAYER_INDICES)
    rslora: bool = declare("rsLoRA (Kalajdzievski 2023): scale by alpha/sqrt(rank) instead of alpha/rank (ignored "
                           "when gated)", False, BOOL)
    dora: bool = declare("DoRA (Liu et al. 2024): W' = m·(W + s·B·A)/||W + s·B·A||, one learned magnitude m per "
                         "output feature, the norm per row and held constant for the gradient; not with gate", False,
                         BOOL)

    def check(self) -> None:
        require(self, "dora", not (self.dora and self.gate),
                "false with gate: true (UniPELT's gate replaces the scale, which DoRA normalises inside the weight)")

    @property
    def scaling(self) -> float:
        return self.alpha / (self.rank ** 0.5 if self.rslora else self.rank)

    def describe(self) -> str:
        name = ("rs" if self.rslora else "") + ("dora" if self.dora else "lora")
        return f"{name} r{self.rank}" + self.gated_suffix()


def build(at, cfg: LoRAConfig) -> None:
    """Wrap each target linear in the chosen layers: A and B (AdaMix's experts of them under a mixture)."""
    from autopelt.delta.modules.lora import DoRALinear, LoRALinear

    for i, layer, stack, site in at.site_layers(cfg):
        in_f, out_f = linear_shape(at.config, site)
        lora_A = at.linear(in_f, cfg.rank, bias=False)
        lora_B = at.linear(cfg.rank, out_f, up=True, bias=False)
        gate = at.gate(in_f, 1, "lora", i, stack) if cfg.gate else None
        if cfg.dora:  # never gated (the config refuses it)
            at.replace(layer, stack.linears[site], lambda base: DoRALinear(base, lora_A, lora_B, cfg.scaling,
                                                                           cfg.dropout))
        else:
            at.replace(layer, stack.linears[site], lambda base: LoRALinear(base, lora_A, lora_B, cfg.scaling,
                                                                           cfg.dropout, gate))


def count(cfg: LoRAConfig, shape) -> tuple[int, int]:
    """r·(in + out) per linear (the mixture's experts of A, and of B unless shared), a gate's in + 1, DoRA's
    magnitude per output feature; stored: one expert."""
    experts, up = shape.mixture.count(up=False), shape.mixture.count(up=True)
    trainable = stored = 0
    for _, in_f, out_f, times in linears_of(shape.config, shape.arch, cfg.targets, cfg.layers):
        extra = (in_f + 1 if cfg.gate else 0) + (out_f if cfg.dora else 0)
        trainable += (cfg.rank * (in_f * experts + out_f * up) + extra) * times
        stored += (cfg.rank * (in_f + out_f) + extra) * times
    return trainable, stored


def fits(cfg: LoRAConfig, config, arch) -> None:
    smallest = min(min(linear_shape(config, site)) for site in arch.sites(cfg.targets))
    if cfg.rank > smallest:
        raise UserError(f"lora.rank = {cfg.rank} exceeds the smallest adapted dimension {smallest}")


def peft(cfg: LoRAConfig, target):
    import peft

    return peft.LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, use_rslora=cfg.rslora,
                           use_dora=cfg.dora, target_modules=target.sites(cfg.layers, cfg.targets), bias=target.bias,
                           **target.with_head)


def soup_stack(cfg: LoRAConfig, members: int) -> Stack:
    """`members` LoRAs stacked by rank: A's rows, B's columns; the stacked scale is alpha over members·r (its square
    root for rsLoRA), so each member's B is multiplied by s/s' = members (its square root)."""
    ratio = math.sqrt(members) if cfg.rslora else members
    return Stack(dataclasses.replace(cfg, rank=cfg.rank * members), ratio, "lora_A.weight", "lora_B.weight")


METHOD = register(Method(LoRAConfig, build, count, order=10, fits=fits, peft=peft, peft_bias=True,
                         peft_names={"lora_magnitude_vector.weight": "magnitude"}, soup="ranks", soup_stack=soup_stack,
                         soup_refuses=lambda cfg: "a gated LoRA or DoRA is not linear in its parameters"
                         if cfg.gate or cfg.dora else None,
                         gate_row=2))  # UniPELT's order of its gates: adapter, prefix, LoRA

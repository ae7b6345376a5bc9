"""VeRA (Kopiczko et al. 2024): W + diag(b)·B·diag(d)·A, A and B frozen, random and shared by every layer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from autopelt.delta.config import LINEAR_SITES, MethodConfig
from autopelt.delta.fields import (
    BOOL, LAYER_INDICES, NON_NEGATIVE_INT, NON_ZERO_NUMBER, POSITIVE_INT, PROBABILITY, declare, site_list,
)
from autopelt.delta.registry import Method, register
from autopelt.delta.families import linear_shape, linears_of


@dataclass(frozen=True)
class VeRAConfig(MethodConfig):
    method: ClassVar[str] = "vera"
    summary: ClassVar[str] = ("W + diag(b)·B·diag(d)·A with A, B frozen random matrices shared by all layers, "
                              "b and d trained (Kopiczko et al. 2024)")

    rank: int = declare("rank r of the shared matrices A (r x in) and B (out x r)", 256, POSITIVE_INT, abbrev="r")
    targets: tuple[str, ...] = declare(f"linear layers to adapt, among {', '.join(LINEAR_SITES)}", ("query", "value"),
                                       site_list(LINEAR_SITES))
    d_initial: float = declare("initial value of every entry of d (b starts at zero; d = 0 would never learn)", 0.1,
                               NON_ZERO_NUMBER)
    dropout: float = declare("dropout on the VeRA branch input", 0.0, PROBABILITY)
    # not drawn by search spaces: a seed is neither a size nor a placement
    projection_seed: int = declare("seed the shared A and B are drawn from (Kaiming-uniform, as peft's "
                                   "projection_prng_key); they are regenerated from it, never saved", 0,
                                   NON_NEGATIVE_INT, search=False)
    gate: bool = declare("UniPELT gate G = sigmoid(W·h_in) scales the update", False, BOOL)
    layers: tuple[int, ...] | None = declare("layer indices to adapt; null = all", None, LAYER_INDICES)


def build(at, cfg: VeRAConfig) -> None:
    """Wrap each target linear in the chosen layers (over a LoRA there); A and B sized for the largest target, as
    peft's VeRA sizes them."""
    from autopelt.delta.modules.vera import SharedProjections, VeRALinear

    shapes = [linear_shape(at.config, site) for site in at.arch.sites(cfg.targets)]
    largest_in, largest_out = max(s[0] for s in shapes), max(s[1] for s in shapes)
    projections = SharedProjections(cfg.rank, largest_in, largest_out, cfg.projection_seed)
    for i, layer, stack, site in at.site_layers(cfg):
        in_f, out_f = linear_shape(at.config, site)
        gate = at.gate(in_f, 1, "vera", i, stack) if cfg.gate else None
        at.replace(layer, stack.linears[site],
                   lambda base: VeRALinear(base, projections, in_f, out_f, cfg.d_initial, cfg.dropout, gate))


def count(cfg: VeRAConfig, shape) -> tuple[int, int]:
    """b and d per linear (r + out), a gate's in + 1; the shared A and B are regenerated from the seed."""
    n = sum((cfg.rank + out_f + (in_f + 1 if cfg.gate else 0)) * times
            for _, in_f, out_f, times in linears_of(shape.config, shape.arch, cfg.targets, cfg.layers))
    return n, n


def fits(cfg: VeRAConfig, config, arch) -> None:
    arch.sites(cfg.targets)


def peft(cfg: VeRAConfig, target):
    """peft regenerates A and B from the same seed, as autopelt does."""
    import peft

    return peft.VeraConfig(r=cfg.rank, target_modules=target.sites(cfg.layers, cfg.targets),
                           projection_prng_key=cfg.projection_seed, save_projection=False, vera_dropout=cfg.dropout,
                           d_initial=cfg.d_initial, bias=target.bias, **target.with_head)


METHOD = register(Method(VeRAConfig, build, count, order=20, fits=fits, peft=peft, peft_bias=True,
                         peft_names={"vera_lambda_b": "lambda_b", "vera_lambda_d": "lambda_d"}))

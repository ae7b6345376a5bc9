"""A delta method written the way a new one is: this one file, and nothing else, makes `toyshift` a method that a
spec parses, a model takes, counting counts, a saved delta holds and a search space draws
(tests/test_delta_registry.py).

`toyshift` adds a learned vector to the output of chosen linear layers: y = W·x + b + s, s starting at zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from autopelt.delta.config import LINEAR_SITES, MethodConfig
from autopelt.delta.fields import LAYER_INDICES, declare, site_list
from autopelt.delta.registry import Method, register
from autopelt.delta.families import linear_shape, linears_of


@dataclass(frozen=True)
class ToyShiftConfig(MethodConfig):
    method: ClassVar[str] = "toyshift"
    summary: ClassVar[str] = "a learned vector added to chosen linear layers' outputs (a test's method)"

    targets: tuple[str, ...] = declare("linear layers to shift", ("value",), site_list(LINEAR_SITES))
    layers: tuple[int, ...] | None = declare("layer indices to shift; null = all", None, LAYER_INDICES)


class ShiftLinear(nn.Module):
    """base(x) + shift; the shift starts at zero, so a new one is the identity."""

    def __init__(self, base_layer: nn.Module, features: int):
        super().__init__()
        self.base_layer = base_layer
        self.shift = nn.Parameter(torch.zeros(features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base_layer(x) + self.shift


def build(at, cfg: ToyShiftConfig) -> None:
    for _, layer, stack, site in at.site_layers(cfg):
        features = linear_shape(at.config, site)[1]
        at.replace(layer, stack.linears[site], lambda base: ShiftLinear(base, features))


def count(cfg: ToyShiftConfig, shape) -> tuple[int, int]:
    n = sum(out_f * times for _, _, out_f, times in linears_of(shape.config, shape.arch, cfg.targets, cfg.layers))
    return n, n


def fits(cfg: ToyShiftConfig, config, arch) -> None:
    arch.sites(cfg.targets)


# after (IA)³ (30), before adapters (40): on a linear LoRA also adapts, the shift wraps the LoRA
METHOD = register(Method(ToyShiftConfig, build, count, order=35, fits=fits,
                         peft="peft has no toyshift (a test's method)"))

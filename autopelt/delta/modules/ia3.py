"""(IA)³ (Liu et al. 2022): a learned vector rescales a linear's output (keys, values), or its input where that input
is the FFN's inner activation: (l_ff ⊙ γ(W_1·x))·W_2 is the FFN output layer applied to a rescaled input."""

from __future__ import annotations

import torch
from torch import nn

from autopelt.delta.modules.stack import ExposesWeight, base_linear, merged_below, weight_of


class IA3Linear(ExposesWeight, nn.Module):
    """y = l ⊙ base(x), or y = base(l ⊙ x) with `on_input`. `scale` starts at one: a new (IA)³ is the identity."""

    def __init__(self, base_layer: nn.Module, features: int, on_input: bool):
        super().__init__()
        self.base_layer, self.on_input = base_layer, on_input
        self.scale = nn.Parameter(torch.ones(features))  # (in,) or (out,)
        self.merged = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.merged:
            return self.base_layer(x)
        if self.on_input:
            return self.base_layer(x * self.scale)
        return self.base_layer(x) * self.scale

    def can_merge(self) -> bool:
        return merged_below(self)  # it rescales all it wraps, so that must be in the weight first

    def merge(self) -> None:
        if not self.can_merge():
            raise ValueError("(IA)³ merges only once every delta under it on the same linear has merged")
        if not self.merged:
            self._rescale(self.scale)
            self.merged = True

    def unmerge(self) -> None:
        if self.merged:
            self._rescale(1.0 / self.scale)
            self.merged = False

    def _rescale(self, factor: torch.Tensor) -> None:
        linear = base_linear(self)
        with torch.no_grad():
            if self.on_input:
                weight_of(linear).mul_(factor[None, :])
            else:
                weight_of(linear).mul_(factor[:, None])
                if linear.bias is not None:
                    linear.bias.mul_(factor)

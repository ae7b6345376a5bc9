"""UniPELT's gate: one generic idea, used by adapters, prefixes and LoRA alike."""

from __future__ import annotations

import torch
from torch import nn


class Gate(nn.Module):
    """G = sigmoid(W·h) averaged over the sequence: `heads` values in (0, 1) per example.

    The average runs over every position, padding included, as in UniPELT's reference code.
    `kind` and `layer` name what the gate scales, so gate values can be read per method and layer.
    """

    def __init__(self, in_features: int, heads: int, kind: str, layer: int):
        super().__init__()
        self.linear = nn.Linear(in_features, heads)
        self.kind, self.layer = kind, layer

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, heads)
        return torch.sigmoid(self.linear(hidden)).mean(dim=1)


def init_linear_(linear: nn.Module, generator: torch.Generator, zero: bool = False) -> None:
    """Kaiming-uniform weights (torch's default for nn.Linear) from an explicit generator, zero biases."""
    with torch.no_grad():
        if zero:
            linear.weight.zero_()
        else:
            fan_in = linear.weight.shape[-1]
            bound = (1.0 / fan_in) ** 0.5  # kaiming_uniform with a=sqrt(5), as nn.Linear does
            linear.weight.uniform_(-bound, bound, generator=generator)
        if getattr(linear, "bias", None) is not None:
            linear.bias.zero_()

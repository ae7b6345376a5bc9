"""VeRA (Kopiczko et al. 2024): y = W·x + b ⊙ B·(d ⊙ A·dropout(x)), with A (r x in) and B (out x r) frozen, random and
shared by every adapted layer, and only the vectors b (out) and d (r) trained.

A and B are drawn from a seed exactly as peft draws them (one CPU generator seeded with `projection_prng_key`,
Kaiming-uniform A then B, each as large as the largest adapted layer and sliced per layer), so a delta stores the
seed instead of the matrices and peft regenerates the same ones.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from autopelt.delta.modules.gate import Gate
from autopelt.delta.modules.stack import AdditiveMerge, merged_below


def kaiming_uniform(shape: tuple[int, int], generator: torch.Generator) -> torch.Tensor:
    """U(-b, b) with b = sqrt(3)·sqrt(2)/sqrt(fan_in): peft's VeRA `_kaiming_init`."""
    bound = math.sqrt(3.0) * math.sqrt(2.0) / math.sqrt(shape[1])
    return torch.empty(shape).uniform_(-bound, bound, generator=generator)


class SharedProjections(nn.Module):
    """The frozen A and B, one pair per model. Buffers that are not saved: `seed` rebuilds them."""

    def __init__(self, rank: int, in_features: int, out_features: int, seed: int):
        super().__init__()
        generator = torch.Generator(device="cpu").manual_seed(seed)
        self.register_buffer("A", kaiming_uniform((rank, in_features), generator), persistent=False)
        self.register_buffer("B", kaiming_uniform((out_features, rank), generator), persistent=False)


class VeRALinear(AdditiveMerge, nn.Module):
    """Wraps a linear site. b starts at zero (a new VeRA is the identity), d at `d_initial`."""

    cannot_merge = "a gated VeRA, or one over an unmerged delta, cannot be merged into the weights"

    def __init__(self, base_layer: nn.Module, projections: SharedProjections, in_features: int, out_features: int,
                 d_initial: float, dropout: float = 0.0, gate: Gate | None = None):
        super().__init__()
        self.base_layer, self.projections, self.gate = base_layer, projections, gate
        self.in_features, self.out_features = in_features, out_features
        rank = projections.A.shape[0]
        self.lambda_d = nn.Parameter(torch.full((rank,), float(d_initial)))
        self.lambda_b = nn.Parameter(torch.zeros(out_features))
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.merged = False

    def _A(self) -> torch.Tensor:  # (r, in): this layer's slice of the shared A
        return self.projections.A[:, : self.in_features]

    def _B(self) -> torch.Tensor:  # (out, r)
        return self.projections.B[: self.out_features]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result = self.base_layer(x)
        if self.merged:
            return result
        update = self.lambda_b * F.linear(self.lambda_d * F.linear(self.dropout(x), self._A()), self._B())
        if self.gate is not None:
            update = update * self.gate.scale(x)
        return result + update

    def delta_weight(self) -> torch.Tensor:  # (out, in)
        return (self.lambda_b[:, None] * self._B()) @ (self.lambda_d[:, None] * self._A())

    def can_merge(self) -> bool:
        return self.gate is None and merged_below(self)  # a DoRA under it normalises the weight it would change

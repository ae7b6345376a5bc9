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
        if self.merged:
            return self.base_layer(x)
        tokens = x.numel() // max(x.shape[-1], 1)
        if not self.through_weight_pays(tokens):
            update = self.lambda_b * F.linear(self.lambda_d * F.linear(self.dropout(x), self._A()), self._B())
        elif self._one_matmul(x):
            base = self.base_layer  # (W + ΔW)·x + bias
            return F.linear(x, base.weight + self.delta_weight(), base.bias)
        else:
            update = F.linear(self.dropout(x), self.delta_weight())
        if self.gate is not None:
            update = update * self.gate.scale(x)
        return self.base_layer(x) + update

    def _one_matmul(self, x: torch.Tensor) -> bool:
        """The update can fold into the frozen linear's matmul: nothing between (no gate, dropout or wrapper), and
        no autocast, which would round W + ΔW to the low precision at W's scale and lose a small ΔW."""
        return (self.gate is None and isinstance(self.dropout, nn.Identity) and type(self.base_layer) is nn.Linear
                and self.base_layer.weight.dtype == x.dtype and not torch.is_autocast_enabled(x.device.type))

    def through_weight_pays(self, tokens: int) -> bool:
        """Whether forming ΔW = (b ⊙ B)·(d ⊙ A) (out x in) once per forward costs less than taking `tokens` rows
        through A and B (r wide each): r·(in + out) per token against in·out per token plus r·in·out per
        forward. VeRA's ranks (256-1024) on a training batch take the weight; a few tokens take the rows. Both
        compute the same update; docs/speed.md has the measured step times."""
        rank = self.lambda_d.shape[0]
        per_token = rank * (self.in_features + self.out_features)
        return tokens * per_token > self.in_features * self.out_features * (tokens + rank)

    def delta_weight(self) -> torch.Tensor:  # (out, in)
        return (self.lambda_b[:, None] * self._B()) @ (self.lambda_d[:, None] * self._A())

    def can_merge(self) -> bool:
        return self.gate is None and merged_below(self)  # a DoRA under it normalises the weight it would change

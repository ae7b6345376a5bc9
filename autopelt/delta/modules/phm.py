"""Parameterised hypercomplex multiplication layers (PHM, Zhang et al. 2021) and Compacter's variant.

W = sum_i A_i ⊗ B_i with A_i (n x n) and B_i (in/n x out/n). PHM learns every B_i in full; Compacter
learns B_i = s_i t_i^T of low rank and shares the A_i ("the rule") across all layers.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def new_rule(n: int, generator: torch.Generator) -> nn.Parameter:
    """A (n, n, n) with entries of variance 1/n, so that W has the variance of its B factors."""
    return nn.Parameter(torch.randn(n, n, n, generator=generator) / math.sqrt(n))


class PHMLinear(nn.Module):
    """A linear layer whose weight is a sum of Kronecker products. `rule` may be shared between layers."""

    def __init__(self, in_features: int, out_features: int, rule: nn.Parameter, rank: int | None,
                 generator: torch.Generator, zero: bool = False):
        super().__init__()
        n = rule.shape[0]
        p, q = in_features // n, out_features // n
        self.rule = rule
        std = math.sqrt(2.0 / (p + q))  # Glorot-normal for B
        if rank is None:  # PHM: full B_i
            self.B = nn.Parameter(torch.randn(n, p, q, generator=generator) * (0.0 if zero else std))
            self.s = self.t = None
        else:  # Compacter: B_i = s_i t_i^T, the product's entries again with Glorot variance
            factor_std = math.sqrt(std / math.sqrt(rank))
            self.B = None
            self.s = nn.Parameter(torch.randn(n, p, rank, generator=generator) * factor_std)
            self.t = nn.Parameter(torch.randn(n, rank, q, generator=generator) * (0.0 if zero else factor_std))
        self.bias = nn.Parameter(torch.zeros(out_features))

    def weight(self) -> torch.Tensor:  # (in, out)
        B = self.B if self.B is not None else self.s @ self.t  # (n, p, q)
        n, p, q = B.shape
        # W[a*p + b, c*q + d] = sum_i A[i, a, c] * B[i, b, d]: the Kronecker sum without n full products
        return torch.einsum("iac,ibd->abcd", self.rule, B).reshape(n * p, n * q)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight().T, self.bias)

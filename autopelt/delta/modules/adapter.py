"""Bottleneck adapters: x + G_A(x) · up(act(down(x))), placed on a sublayer's output path.

A sublayer's output is LayerNorm(dropout(dense(h)) + residual). Houlsby's adapter and AdaMix's expert soup take
a value of that path as their input and add to it (`AdapterWrapper`, around the dense layer or the dropout);
Pfeiffer's takes the normalised sum and hands the sum back to the same LayerNorm (`PostNormAdapter`).
"""

from __future__ import annotations

import torch
from torch import nn

from autopelt.delta.modules.gate import Gate
from autopelt.delta.modules.stack import ExposesWeight

ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh, "swish": nn.SiLU}


class Bottleneck(nn.Module):
    """f(x) = up(act(down(x))). `down`/`up` are linears, PHM layers or AdaMix mixtures."""

    def __init__(self, down: nn.Module, up: nn.Module, activation: str):
        super().__init__()
        self.down, self.act, self.up = down, ACTIVATIONS[activation](), up

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(self.act(self.down(x)))

    def gated(self, x: torch.Tensor, gate: Gate | None) -> torch.Tensor:
        out = self(x)
        return out if gate is None else out * gate.scale(x)


class AdapterWrapper(ExposesWeight, nn.Module):
    """Wraps a module of the output path (the dense layer, or its dropout): y = base(x); y + G_A(y)·adapter(y)."""

    def __init__(self, base_layer: nn.Module, adapter: Bottleneck, gate: Gate | None = None):
        super().__init__()
        self.base_layer, self.adapter, self.gate = base_layer, adapter, gate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base_layer(x)  # (B, T, H): h_FN, before or after the sublayer's dropout
        return y + self.adapter.gated(y, self.gate)


class PostNormAdapter(nn.Module):
    """Wraps a sublayer's LayerNorm (Pfeiffer): z = h + residual; LN(z + G_A(n)·adapter(n)) with n = LN(z).

    That is AdapterHub's Pfeiffer configuration (original_ln_before, residual_before_ln, original_ln_after):
    the adapter reads the normalised sum and its output joins h and the residual under the same LayerNorm.
    """

    def __init__(self, base_layer: nn.Module, adapter: Bottleneck, gate: Gate | None = None):
        super().__init__()
        self.base_layer, self.adapter, self.gate = base_layer, adapter, gate

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        normed = self.base_layer(z)  # (B, T, H): LN(h_FN + residual), the adapter's and the gate's input
        return self.base_layer(z + self.adapter.gated(normed, self.gate))

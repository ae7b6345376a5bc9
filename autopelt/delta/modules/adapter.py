"""Bottleneck adapters: h + G_A(h) · up(act(down(h))), placed on a sublayer's output projection."""

from __future__ import annotations

import torch
from torch import nn

from autopelt.delta.modules.gate import Gate

ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh, "swish": nn.SiLU}


class Bottleneck(nn.Module):
    """f(h) = up(act(down(h))). `down`/`up` are linears, PHM layers or AdaMix mixtures."""

    def __init__(self, down: nn.Module, up: nn.Module, activation: str):
        super().__init__()
        self.down, self.act, self.up = down, ACTIVATIONS[activation](), up

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.up(self.act(self.down(h)))


class AdapterWrapper(nn.Module):
    """Wraps a sublayer's output projection: y = base(x); y + G_A(y)·adapter(y), before dropout and LayerNorm."""

    def __init__(self, base_layer: nn.Module, adapter: Bottleneck, gate: Gate | None = None):
        super().__init__()
        self.base_layer, self.adapter, self.gate = base_layer, adapter, gate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.base_layer(x)  # (B, T, H): the sublayer output, h_FN for the FFN adapter
        out = self.adapter(h)
        if self.gate is not None:
            out = out * self.gate(h)[:, None, :]
        return h + out

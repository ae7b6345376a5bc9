"""LoRA: y = W·x + scale · B·A·dropout(x), with scale = alpha/r, or UniPELT's gate G_L(x)."""

from __future__ import annotations

import torch
from torch import nn

from autopelt.delta.modules.gate import Gate
from autopelt.delta.modules.mixture import MixtureLinear


class LoRALinear(nn.Module):
    """Wraps a frozen nn.Linear (`base_layer`); `lora_A`/`lora_B` may be linears or AdaMix mixtures."""

    def __init__(self, base_layer: nn.Module, lora_A: nn.Module, lora_B: nn.Module, scaling: float,
                 dropout: float = 0.0, gate: Gate | None = None):
        super().__init__()
        self.base_layer, self.lora_A, self.lora_B = base_layer, lora_A, lora_B
        self.scaling = scaling
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.gate = gate
        self.merged = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result = self.base_layer(x)
        if self.merged:
            return result
        scale = self.gate(x)[:, None, :] if self.gate is not None else self.scaling  # (B, 1, 1) or float
        return result + self.lora_B(self.lora_A(self.dropout(x))) * scale

    def delta_weight(self) -> torch.Tensor:  # (out, in)
        return _weight(self.lora_B) @ _weight(self.lora_A) * self.scaling

    def merge(self) -> None:
        if self.gate is not None:
            raise ValueError("a gated LoRA depends on its input and cannot be merged into the weights")
        if not self.merged:
            with torch.no_grad():
                self._base_linear().weight += self.delta_weight()
            self.merged = True

    def unmerge(self) -> None:
        if self.merged:
            with torch.no_grad():
                self._base_linear().weight -= self.delta_weight()
            self.merged = False

    def _base_linear(self) -> nn.Linear:
        base = self.base_layer
        while not isinstance(base, nn.Linear):  # another delta may wrap the linear first
            base = base.base_layer
        return base


def _weight(projection: nn.Module) -> torch.Tensor:
    return projection.merged()[0] if isinstance(projection, MixtureLinear) else projection.weight

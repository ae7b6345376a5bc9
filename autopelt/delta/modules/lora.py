"""LoRA: y = W·x + scale · B·A·dropout(x), with scale = alpha/r (alpha/sqrt(r) for rsLoRA) or UniPELT's gate G_L(x);
and DoRA, the same update under a learned magnitude per output feature."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from autopelt.delta.modules.gate import Gate
from autopelt.delta.modules.mixture import MixtureLinear
from autopelt.delta.modules.stack import AdditiveMerge, weight_of


class LoRALinear(AdditiveMerge, nn.Module):
    """Wraps a frozen nn.Linear (`base_layer`); `lora_A`/`lora_B` may be linears or AdaMix mixtures."""

    cannot_merge = "a gated LoRA depends on its input and cannot be merged into the weights"

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
        return result + self.additive_update(x)

    def additive_update(self, x: torch.Tensor) -> torch.Tensor:
        """What the unmerged LoRA adds to the base layer's output on `x` (a packed pass adds it to some rows)."""
        scale = self.gate.scale(x) if self.gate is not None else self.scaling  # (B, 1, 1) or float
        return self.lora_B(self.lora_A(self.dropout(x))) * scale

    def delta_weight(self) -> torch.Tensor:  # (out, in)
        return _weight(self.lora_B) @ _weight(self.lora_A) * self.scaling

    def can_merge(self) -> bool:
        return self.gate is None  # an additive update folds in whatever wraps the linear under it


class DoRALinear(LoRALinear):
    """DoRA (Liu et al. 2024): y = m / ||W + s·B·A|| ⊙ (W + s·B·A)·x + bias, the norm taken per output feature (a row
    of W) and, as the paper's section 4.3 and peft do, held constant for the gradient. `magnitude` starts at ||W||,
    so a new DoRA is the identity. Wraps the nn.Linear itself: LoRA is injected before any other wrapper."""

    additive_update = None  # its magnitude rescales the base's output too: no update that adds alone

    def __init__(self, base_layer: nn.Module, lora_A: nn.Linear, lora_B: nn.Linear, scaling: float,
                 dropout: float = 0.0):
        super().__init__(base_layer, lora_A, lora_B, scaling, dropout)
        with torch.no_grad():
            self.magnitude = nn.Parameter(self.weight_norm())  # (out,)
        self.merged_norm: torch.Tensor | None = None

    def weight_norm(self) -> torch.Tensor:  # (out,)
        return torch.linalg.vector_norm(weight_of(self.base_layer) + self.delta_weight().detach(), dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.merged:
            return self.base_layer(x)
        # scale·(W·x + s·B·A·x) + bias, written as t + bias + (scale - 1)·t with t = W·x + s·B·A·x: few passes over
        # the activations, and the per-feature factor kept as scale - 1, which bf16 holds (a bf16 scale near 1
        # would round a small learned change of the magnitude away)
        excess = self.magnitude / self.weight_norm().detach() - 1  # (out,)
        base = self.base_layer
        if isinstance(self.dropout, nn.Identity) or not self.training:
            t = torch.add(F.linear(x, weight_of(base)), self.lora_B(self.lora_A(x)), alpha=self.scaling)
            excess = excess.to(t.dtype)
            return torch.addcmul(t if base.bias is None else t + base.bias.to(t.dtype), t, excess)
        result, x = base(x), self.dropout(x)
        plain = F.linear(x, weight_of(base))  # W·dropout(x), as the update sees it
        lora_scale = ((excess + 1) * self.scaling).to(result.dtype)
        return torch.addcmul(torch.addcmul(result, plain, excess.to(result.dtype)), self.lora_B(self.lora_A(x)),
                             lora_scale)

    def can_merge(self) -> bool:
        return True

    def merge(self) -> None:
        if not self.merged:
            with torch.no_grad():
                self.merged_norm = self.weight_norm()
                factor = (self.magnitude / self.merged_norm)[:, None]
                weight_of(self.base_layer).copy_(factor * (weight_of(self.base_layer) + self.delta_weight()))
            self.merged = True

    def unmerge(self) -> None:
        if self.merged:
            with torch.no_grad():
                factor = (self.magnitude / self.merged_norm)[:, None]
                weight_of(self.base_layer).copy_(weight_of(self.base_layer) / factor - self.delta_weight())
            self.merged, self.merged_norm = False, None


def _weight(projection: nn.Module) -> torch.Tensor:
    return projection.merged()[0] if isinstance(projection, MixtureLinear) else projection.weight

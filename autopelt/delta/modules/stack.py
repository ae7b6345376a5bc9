"""A linear site may carry several deltas, each wrapping the one before (LoRA, VeRA, IA3, then an adapter), every
wrapper holding what it wraps as `base_layer`."""

from __future__ import annotations

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

LINEARS = (nn.Linear, Conv1D)  # GPT-2's Conv1D is a linear whose weight is stored (in, out)


def base_linear(module: nn.Module) -> nn.Module:
    """The frozen linear (nn.Linear or Conv1D) at the bottom of a stack of wrappers."""
    while not isinstance(module, LINEARS):
        module = module.base_layer
    return module


def weight_of(linear: nn.Module) -> torch.Tensor:
    """A linear's weight as (out, in), whatever way it is stored: a view, so in-place changes reach the layer."""
    return linear.weight.T if isinstance(linear, Conv1D) else linear.weight


def merged_below(module: nn.Module) -> bool:
    """Whether every wrapper under `module` has folded itself into the base linear: only then does the linear's
    weight stand for what `module` wraps, and can a wrapper that rescales it (DoRA, IA3) merge too."""
    layer = module.base_layer
    while not isinstance(layer, LINEARS):
        if not getattr(layer, "merged", False):
            return False
        layer = layer.base_layer
    return True


class ExposesWeight:
    """A wrapper's `weight` is its base linear's, as stored: modeling code that reads a layer's weight (T5 reads
    `wo.weight.dtype`) sees the layer it wrapped."""

    @property
    def weight(self) -> torch.Tensor:
        try:
            return base_linear(self).weight
        except AttributeError:
            raise AttributeError(f"{type(self).__name__} wraps no linear layer, so it has no weight") from None


class AdditiveMerge(ExposesWeight):
    """`merge`/`unmerge` for a wrapper whose update adds `delta_weight()` to the base linear's weight (LoRA, VeRA);
    the wrapper says when it `can_merge` and, in `cannot_merge`, why not."""

    cannot_merge = "this delta cannot be merged into the weights"

    def merge(self) -> None:
        if not self.can_merge():
            raise ValueError(self.cannot_merge)
        if not self.merged:
            with torch.no_grad():
                weight_of(base_linear(self)).add_(self.delta_weight())
            self.merged = True

    def unmerge(self) -> None:
        if self.merged:
            with torch.no_grad():
                weight_of(base_linear(self)).sub_(self.delta_weight())
            self.merged = False

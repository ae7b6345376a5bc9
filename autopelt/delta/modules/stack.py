"""A linear site may carry several deltas, each wrapping the one before (LoRA, VeRA, IA3, then an adapter), every
wrapper holding what it wraps as `base_layer`."""

from __future__ import annotations

import torch
from torch import nn


def base_linear(module: nn.Module) -> nn.Linear:
    """The frozen nn.Linear at the bottom of a stack of wrappers."""
    while not isinstance(module, nn.Linear):
        module = module.base_layer
    return module


def merged_below(module: nn.Module) -> bool:
    """Whether every wrapper under `module` has folded itself into the base linear: only then does the linear's
    weight stand for what `module` wraps, and can a wrapper that rescales it (DoRA, IA3) merge too."""
    layer = module.base_layer
    while not isinstance(layer, nn.Linear):
        if not getattr(layer, "merged", False):
            return False
        layer = layer.base_layer
    return True


class AdditiveMerge:
    """`merge`/`unmerge` for a wrapper whose update adds `delta_weight()` to the base linear's weight (LoRA, VeRA);
    the wrapper says when it `can_merge` and, in `cannot_merge`, why not."""

    cannot_merge = "this delta cannot be merged into the weights"

    def merge(self) -> None:
        if not self.can_merge():
            raise ValueError(self.cannot_merge)
        if not self.merged:
            with torch.no_grad():
                base_linear(self).weight += self.delta_weight()
            self.merged = True

    def unmerge(self) -> None:
        if self.merged:
            with torch.no_grad():
                base_linear(self).weight -= self.delta_weight()
            self.merged = False

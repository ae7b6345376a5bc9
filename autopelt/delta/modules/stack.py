"""A linear site may carry several deltas, each wrapping the one before (LoRA, VeRA, IA3, then an adapter), every
wrapper holding what it wraps as `base_layer`."""

from __future__ import annotations

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

"""UniPELT's gate: one generic idea, used by adapters, prefixes and LoRA alike."""

from __future__ import annotations

import contextlib

import torch
from torch import nn


class PaddingMask:
    """The padding mask of the forward pass under way, for the gates of one model to average over real tokens.

    Forward hooks on the backbone set it (after any soft prompt is inserted, so its shape is the hidden
    states') and clear it when the pass ends; a gate called outside a backbone pass sees None.
    """

    def __init__(self):
        self.current: torch.Tensor | None = None

    def capture(self, backbone: nn.Module, args: tuple, kwargs: dict) -> None:
        mask = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)
        self.current = mask if mask is not None and mask.dim() == 2 else None

    def release(self, *_) -> None:
        self.current = None

    def recomputing(self) -> tuple[contextlib.AbstractContextManager, contextlib.AbstractContextManager]:
        """torch.utils.checkpoint's `context_fn` (forward, recomputation): a checkpointed layer recomputed in the
        backward pass, when its pass has ended and cleared the mask, sees the mask that pass had."""
        mask = self.current

        @contextlib.contextmanager
        def as_in_its_pass():
            saved, self.current = self.current, mask
            try:
                yield
            finally:
                self.current = saved

        return contextlib.nullcontext(), as_in_its_pass()


class Gate(nn.Module):
    """G = sigmoid(W·h) averaged over the sequence: `heads` values in (0, 1) per example.

    The average runs over real tokens when the model's `padding` mask is known (so a gated delta gives the same
    output however a batch is padded); UniPELT's reference code averages over padding too, padded to 128.
    `kind` and `layer` name what the gate scales, so gate values can be read per method and layer.
    On a decoder the gate is `per_token`: an average over the sequence would let a token see the ones after it.
    """

    def __init__(self, in_features: int, heads: int, kind: str, layer: int, per_token: bool = False):
        super().__init__()
        self.linear = nn.Linear(in_features, heads)
        self.kind, self.layer, self.per_token = kind, layer, per_token
        self.padding: PaddingMask | None = None  # shared by a model's gates; set by apply_delta

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, heads), or (B, T, heads) per token
        values = torch.sigmoid(self.linear(hidden))
        return values if self.per_token else masked_mean(values, self.padding.current if self.padding else None)

    def scale(self, hidden: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, 1 or T, heads), to multiply by
        values = self(hidden)
        return values if self.per_token else values[:, None, :]


def masked_mean(values: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """(B, T, ...) -> (B, ...): the mean over real tokens, or over all when the mask does not fit."""
    if mask is None or mask.shape != values.shape[:2]:
        return values.mean(dim=1)
    weights = mask.to(values.dtype).reshape(*mask.shape, *[1] * (values.dim() - 2))
    return (values * weights).sum(dim=1) / weights.sum(dim=1).clamp_min(1.0)


def init_linear_(linear: nn.Module, generator: torch.Generator, zero: bool = False) -> None:
    """Kaiming-uniform weights (torch's default for nn.Linear) from an explicit generator, zero biases."""
    with torch.no_grad():
        if zero:
            linear.weight.zero_()
        else:
            fan_in = linear.weight.shape[-1]
            bound = (1.0 / fan_in) ** 0.5  # kaiming_uniform with a=sqrt(5), as nn.Linear does
            linear.weight.uniform_(-bound, bound, generator=generator)
        if getattr(linear, "bias", None) is not None:
            linear.bias.zero_()

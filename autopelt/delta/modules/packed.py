"""Packed trials: several deltas trained in one pass of a shared frozen model, each on its own rows.

The batches of the members are concatenated along the batch dimension; `PackRows` says which rows are whose for
the pass under way, and at every module where some member's delta differs from the frozen model, a `RowRouted`
applies each member's own module to that member's rows. Rows never mix anywhere else in a transformer (attention
reads its own row, LayerNorm its own token), so each member's outputs are its own model's on its rows.
"""

from __future__ import annotations

import torch
from torch import nn


class PackRows:
    """Which rows of the pass under way belong to which member: `(member, rows)` pairs, the rows contiguous and in
    member order, set by the training loop before each forward (`assign`)."""

    def __init__(self) -> None:
        self.slices: list[tuple[int, slice]] = []

    def assign(self, sizes: list[tuple[int, int]]) -> None:
        """`sizes`: (member, its row count) in the order its rows lie in the batch."""
        start, self.slices = 0, []
        for member, count in sizes:
            self.slices.append((member, slice(start, start + count)))
            start += count


class RowRouted(nn.Module):
    """In place of one module of the frozen model: member i's module (its delta around the shared base, or the
    shared base itself) applied to member i's rows. The module's input and output hold the rows in dimension 0.

    Where the members that change this module do so by adding an update to the base module's output (an ungated
    LoRA: `additive_update`), the base runs once on all rows and each such member adds its update to its rows."""

    def __init__(self, base: nn.Module, members: list[nn.Module], rows: PackRows):
        super().__init__()
        self.base, self.members, self.rows = base, nn.ModuleList(members), rows
        self.updates = [_update_of(module, base) for module in members]  # None: the member's module runs whole

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if args or kwargs:
            raise TypeError("a packed site takes one input tensor (a method that passes more cannot pack)")
        slices = self.rows.slices
        if any(self.updates[i] is None for i, _ in slices):
            return torch.cat([self.members[i](x[rows]) for i, rows in slices], dim=0)
        out = self.base(x)
        parts = [out[rows] if self.updates[i] is True else out[rows] + self.updates[i](x[rows]) for i, rows in slices]
        return torch.cat(parts, dim=0)


def _update_of(module: nn.Module, base: nn.Module):
    """True where `module` computes what the base does; its `additive_update` where it adds that to the base's
    output (an unmerged, ungated LoRA around the base); None otherwise."""
    if _same_as(module, base):
        return True
    update = getattr(module, "additive_update", None)
    if update is not None and _same_as(getattr(module, "base_layer", None), base):
        return update
    return None


def _same_as(module: nn.Module | None, base: nn.Module) -> bool:
    """`base` itself, or a copy of its class holding the very same parameters and no others (a member's copy of the
    frozen model, with nothing of its own there)."""
    if module is None or type(module) is not type(base):
        return False
    ours, theirs = list(module.parameters()), list(base.parameters())
    return len(ours) == len(theirs) and all(a is b for a, b in zip(ours, theirs))

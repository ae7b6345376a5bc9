"""Several deltas on one frozen model, each trained on its own rows of one shared pass (train/packed.py).

Each member gets its own model: a copy of the model's modules that holds the very same frozen tensors, with the
member's delta built into it by `apply_delta` (its seed), and copies of the tensors it trains or that are its
own (the task head; BitFit's biases). A member's model is exactly the model a trial of its delta alone would
train; it is what the member evaluates and saves. The shared model then gets, at every module where some
member's model differs from it (the delta sites, the head), a `RowRouted` that sends each member's rows through
that member's module; everywhere else one pass serves every row (the multi-LoRA packing of mLoRA/ASPEN and
PLoRA, for any method whose modules take a site's input alone).

Refused: a method whose registry entry says it cannot pack (`unpackable`: prefix, prompt, AdaMix), a gated
delta (UniPELT's gates read the padding mask of the whole pass), and members whose heads read differently.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable, Sequence

from torch import nn

from autopelt.delta.families import architecture_of
from autopelt.delta.inject import apply_delta, read_head_input
from autopelt.delta.modules.packed import PackRows, RowRouted
from autopelt.delta.registry import innermost, method_of
from autopelt.delta.spec import DeltaSpec, parse_spec
from autopelt.errors import UserError


@dataclass
class Pack:
    """The shared model (routers at `sites`), each member's own model, and the rows of the pass under way."""

    model: nn.Module
    members: list[nn.Module]
    rows: PackRows
    sites: tuple[str, ...]


def packing_refusal(spec) -> str | None:
    """Why trials of `spec` cannot share a pass with others (a one-line reason), or None."""
    spec = parse_spec(spec)
    for config in spec.methods:
        reason = method_of(config).unpackable or method_of(innermost(config)).unpackable
        if reason:
            return f"{config.method} cannot train packed: {reason}"
        inner = innermost(config)
        if getattr(inner, "gate", False) or getattr(inner, "split_gate", False):
            return f"a gated {inner.method} cannot train packed: its gate reads the padding mask of the whole pass"
    return None


def pack_deltas(model: nn.Module, specs: Sequence, seeds: Sequence[int],
                prepare: Callable[[nn.Module, int], None] | None = None) -> Pack:
    """Build each spec's delta (drawn from its seed) into a member model sharing `model`'s frozen tensors, and put
    routers into `model` where members differ from it. `prepare(member_model, i)` runs on each member once its own
    tensors are copied (the trial draws its head there). `model` is frozen and changed in place.

    Raises:
        UserError: a spec cannot pack (`packing_refusal`), the members' heads read differently, or a spec does
        not fit the model (`apply_delta`).
    """
    parsed = [parse_spec(spec) for spec in specs]
    for spec in parsed:
        reason = packing_refusal(spec)
        if reason:
            raise UserError(reason)
    if len({spec.pooling for spec in parsed}) > 1:
        raise UserError("packed trials share their head's reading: give them one pooling")
    model.requires_grad_(False)
    arch = architecture_of(model.config)
    rows = PackRows()
    members, sites = [], set()
    for i, (spec, seed) in enumerate(zip(parsed, seeds)):
        member, changed = _member(model, spec, seed, arch)
        if prepare is not None:
            prepare(member, i)
        members.append(member)
        sites |= changed
    sites = _topmost(sites)
    for path in sorted(sites):
        parent_path, _, name = path.rpartition(".")
        parent = model.get_submodule(parent_path) if parent_path else model
        routed = RowRouted(getattr(parent, name), [member.get_submodule(path) for member in members], rows)
        setattr(parent, name, routed)
    read_head_input(model, parsed[0], arch)
    return Pack(model, members, rows, tuple(sorted(sites)))


def _member(model: nn.Module, spec: DeltaSpec, seed: int, arch) -> tuple[nn.Module, set[str]]:
    """A member's model (the shared frozen tensors, its own delta, head and trained tensors) and the paths of the
    modules of `model` it differs at."""
    shared = {id(t): t for t in (*model.parameters(), *model.buffers())}
    member = copy.deepcopy(model, memo=dict(shared))
    before = dict(member.named_modules())
    apply_delta(member, spec, seed=seed)
    head = tuple(part + "." for part in arch.head_parts) if getattr(model, arch.head, None) is not None else ()
    owned = set()
    for path, module in member.named_modules():
        for name, param in list(module.named_parameters(recurse=False)):
            in_head = f"{path}.".startswith(head) if head else False
            if id(param) in shared and (param.requires_grad or in_head):
                own = nn.Parameter(param.detach().clone(), requires_grad=param.requires_grad)
                setattr(module, name, own)
                param.requires_grad_(False)  # the shared tensor stays frozen for the others
                owned.add(path)
    changed = {path for path, module in member.named_modules() if path in before and before[path] is not module}
    return member, changed | owned


def _topmost(paths: set[str]) -> set[str]:
    """The paths none of whose ancestors is among them."""
    return {path for path in paths if not any(path.startswith(other + ".") for other in paths if other != path)}

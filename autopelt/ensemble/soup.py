"""A soup: same-structure LoRA deltas averaged into one delta, one forward pass at inference.

What is exact and what is not: each LoRA site's effective update ΔW = s·B·A is averaged exactly, with the
ensemble's weights w_i: the soup's A stacks the members' A's by rows and its B their w_i·(s/s')·B_i by columns, so
s'·B'·A' = Σ w_i·s·B_i·A_i with rank Σ r_i (s' the scale of that rank: alpha/r', or alpha/sqrt(r') for rsLoRA).
Merged into the weights, as `autopelt predict` does, it costs nothing at inference. Every other tensor (the task
head, BitFit biases, a pooler) is the weighted average of the members' parameters: a model soup (Wortsman et
al. 2022), not the average of the members' outputs, because the network is not linear in its weights; so the
soup only approximates the ensemble of Caruana et al. 2004, and bench/ensemble_loo.py cannot simulate it from
predictions alone. Only plain LoRA (and BitFit beside it) is souped: a gated LoRA, DoRA, adapters, prefixes and
(IA)³ act on the input or normalise the weight, so their parameters' average is not their updates' average.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from autopelt.errors import UserError

def why_not_soup(specs: list[dict]) -> str | None:
    """Why these members (their stored specs) cannot be souped, or None when they can: one structure whose
    methods all average (their registry entries' `soup`), with a low-rank one among them (`"ranks"`: a LoRA)."""
    from autopelt.delta import parse_spec
    from autopelt.delta.registry import method_of

    if len(specs) < 2:
        return "one member: nothing to average"
    if any(spec != specs[0] for spec in specs[1:]):
        return "the members differ in structure (a soup averages deltas of one structure)"
    methods = parse_spec(specs[0]).methods
    souped = [method_of(m).soup for m in methods]
    if "ranks" not in souped or None in souped:
        return f"only LoRA (with BitFit) deltas are souped, not {'+'.join(m.method for m in methods)}"
    return next((why for m in methods if (why := method_of(m).soup_refuses(m))), None)


def soup_state(spec: dict, states: list[dict], weights) -> tuple[dict, dict]:
    """(the soup's spec, its state) from members of one structure `spec`, their states and weights (sum 1).

    Raises:
        UserError: the members cannot be souped (`why_not_soup`) or their states differ in tensors.
    """
    from autopelt.delta import parse_spec

    reason = why_not_soup([spec] * max(len(states), 2)) if len(states) > 1 else "one member: nothing to average"
    if reason:
        raise UserError(f"no soup: {reason}")
    if any(set(state) != set(states[0]) for state in states[1:]):
        raise UserError("no soup: the members' saved tensors differ although their specs agree")
    weights = [float(w) for w in np.asarray(weights, dtype=np.float64) / np.sum(weights)]
    from autopelt.delta.registry import method_of

    parsed = parse_spec(spec)
    stacks = [method_of(m).soup_stack(m, len(states)) if method_of(m).soup == "ranks" else None
              for m in parsed.methods]
    soup = {name: _souped(name, [state[name].float() for state in states], weights, stacks) for name in states[0]}
    methods = tuple(stack.config if stack else m for m, stack in zip(parsed.methods, stacks))
    return dataclasses.replace(parsed, methods=methods).to_dict(), soup


def _souped(name: str, tensors: list, weights: list[float], stacks: list):
    """One tensor of the soup: a low-rank factor stacked as its method's entry says (registry.Stack), any other
    tensor the members' weighted average."""
    import torch

    for stack in filter(None, stacks):
        if name.endswith(stack.down):
            return torch.cat(tensors, dim=0)  # (members·r, in)
        if name.endswith(stack.up):
            return torch.cat([t * (w * stack.ratio) for t, w in zip(tensors, weights)], dim=1)  # (out, members·r)
    return sum(t * w for t, w in zip(tensors, weights))


def soup_folders(member_dirs: list, weights, out_dir) -> Path:
    """Write the soup of the saved deltas in `member_dirs` as one delta folder `out_dir` (loadable by
    `autopelt predict --delta` and `autopelt.load`, one forward pass); returns it.

    Raises:
        UserError: a member is unreadable, the members cannot be souped, or they disagree on their head.
    """
    import json

    from safetensors.torch import load_file, save_file

    from autopelt.delta.io import FORMAT, SPEC_FILE, WEIGHTS_FILE, read_delta_header
    from autopelt.files import write_atomic

    headers = [read_delta_header(d) for d in member_dirs]
    reason = why_not_soup([h["spec"] for h in headers])
    if reason:
        raise UserError(f"no soup: {reason}")
    states = []
    for folder in member_dirs:
        try:
            states.append(load_file(str(Path(folder) / WEIGHTS_FILE)))
        except Exception as error:  # safetensors raises several types for a bad file
            raise UserError(f"cannot read {Path(folder) / WEIGHTS_FILE}: {error}") from None
    spec, state = soup_state(headers[0]["spec"], states, weights)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    header = {**headers[0], "format": FORMAT, "spec": spec, "trained_spec": spec,
              "soup": {"members": [str(d) for d in member_dirs], "weights": [float(w) for w in weights]}}
    write_atomic(out / WEIGHTS_FILE, lambda path: save_file({k: v.contiguous() for k, v in state.items()}, str(path),
                                                            metadata={"format": FORMAT}))
    write_atomic(out / SPEC_FILE, json.dumps(header, indent=2, default=str))
    return out

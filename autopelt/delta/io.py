"""Saving and loading a delta: `delta.json` (the stored spec and metadata) + `delta.safetensors`. No pickle.

What is saved is a delta's inference form: the prefix matrices without their reparameterisation MLP, and
each AdaMix mixture merged into one module. Its spec (`stored_spec`) builds exactly that form.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from autopelt.delta.inject import apply_delta
from autopelt.delta.registry import method_of
from autopelt.delta.families import architecture_of
from autopelt.delta.spec import DeltaSpec, parse_spec
from autopelt.errors import UserError
from autopelt.files import write_atomic

FORMAT = "autopelt-delta/2"  # 2: the methods' reference forms (format 1 was never released)
SPEC_FILE, WEIGHTS_FILE = "delta.json", "delta.safetensors"


def stored_spec(spec) -> DeltaSpec:
    """The spec of a delta's inference form: each method's `stored` form (its registry entry's)."""
    spec = parse_spec(spec)
    return DeltaSpec(tuple(method_of(method).stored(method) for method in spec.methods), spec.pooling)


def delta_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every trainable tensor of a delta'd model in inference form, by parameter name (shared ones once)."""
    state: dict[str, torch.Tensor] = {}
    covered: set[str] = set()
    for name, module in model.named_modules():
        if hasattr(module, "stored_state"):
            prefix = f"{name}." if name else ""
            state.update({prefix + k: v for k, v in module.stored_state().items()})
            covered.update(prefix + k for k, _ in module.named_parameters())
    for name, param in model.named_parameters():
        if param.requires_grad and name not in covered:
            state[name] = param
    return {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in state.items()}


def save_delta(model: nn.Module, spec, out_dir, metadata: dict | None = None) -> Path:
    """Write the delta of `model` (built from `spec`) to `out_dir`, atomically file by file."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    header = {"format": FORMAT, "spec": stored_spec(spec).to_dict(), "trained_spec": parse_spec(spec).to_dict(),
              "num_labels": model.config.num_labels, "problem_type": model.config.problem_type,
              "model_type": model.config.model_type, **(metadata or {})}
    write_atomic(out / WEIGHTS_FILE, lambda path: save_file(delta_state(model), str(path), metadata={"format": FORMAT}))
    write_atomic(out / SPEC_FILE, json.dumps(header, indent=2, default=str))
    return out


def read_delta_header(delta_dir) -> dict:
    """The header of a saved delta (format 2; a folder of another format is a one-line error)."""
    path = Path(delta_dir) / SPEC_FILE
    if not path.is_file():
        raise UserError(f"{delta_dir} is not an autopelt delta folder (no {SPEC_FILE}); pass an export folder")
    try:
        header = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise UserError(f"cannot read {path}: {error}") from None
    if header.get("format") != FORMAT:
        raise UserError(f"{path} is not an autopelt delta (format {header.get('format')!r}, expected {FORMAT})")
    return header


def add_bias(linear: nn.Linear) -> nn.Linear:
    """Give a Linear without a bias a zero one (its weight's dtype, device and trainability), in place."""
    weight = linear.weight
    linear.bias = nn.Parameter(torch.zeros(linear.out_features, dtype=weight.dtype, device=weight.device),
                               requires_grad=weight.requires_grad)
    return linear


def restore_head_biases(model: nn.Module, weights: dict) -> None:
    """Give the task head's Linear layers the biases a saved delta holds and a fresh model lacks (a regression's
    output layer is given one in training: train/backbone.py's center_regression_head)."""
    head = architecture_of(model.config).head
    for name in weights:
        if name.startswith(head + ".") and name.endswith(".bias"):
            module = model.get_submodule(name.removesuffix(".bias"))
            if isinstance(module, nn.Linear) and module.bias is None:
                add_bias(module)


def load_delta(model: nn.Module, delta_dir, seed: int = 0) -> nn.Module:
    """Add a saved delta to a freshly loaded base model (with a task head of the saved size)."""
    header = read_delta_header(delta_dir)
    weights_path = Path(delta_dir) / WEIGHTS_FILE
    try:
        weights = load_file(str(weights_path))
    except Exception as error:  # safetensors raises several types for a bad file
        raise UserError(f"cannot read {weights_path}: {error}") from None
    apply_delta(model, header["spec"], seed=seed)
    restore_head_biases(model, weights)
    expected = delta_state(model)
    if set(weights) != set(expected):
        missing = sorted(set(expected) - set(weights)) or sorted(set(weights) - set(expected))
        raise UserError(f"{weights_path} does not match its spec (first mismatch: {missing[0]})")
    wrong = next((name for name in sorted(weights) if weights[name].shape != expected[name].shape), None)
    if wrong:
        raise UserError(f"{weights_path} does not match its spec ({wrong}: saved {tuple(weights[wrong].shape)}, "
                        f"built {tuple(expected[wrong].shape)})")
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, tensor in weights.items():
            params[name].copy_(tensor)
    return model


"""How a model's tensors are stored for mixed precision: the frozen linears in the compute dtype, the rest in fp32.
Used where a model is loaded (autopelt/models.py) and where a trial trains it (autopelt/train)."""

from __future__ import annotations

import torch
from torch import nn


def cast_frozen_weights(model: nn.Module, dtype: torch.dtype | None, frozen=None) -> int:
    """Store every frozen linear weight (and frozen bias) in `dtype`, once, so that autocast does not cast it again
    on every call (its cast cache keeps only tensors that require grad). Exact: autocast would compute the same
    cast each time. Trainable parameters stay fp32. Returns the number of tensors cast."""
    if dtype is None:
        return 0
    frozen = frozen or (lambda param: not param.requires_grad)
    cast = 0
    with torch.no_grad():
        for module in model.modules():
            if type(module) is not nn.Linear:  # plain linears only: a delta's own layers stay as they are
                continue
            for param in (module.weight, module.bias):
                if param is not None and frozen(param) and param.dtype != dtype:
                    param.data = param.data.to(dtype)
                    cast += 1
    return cast


def settle_dtypes(model: nn.Module, dtype: torch.dtype | None, frozen=None) -> int:
    """Mixed precision's storage, whatever the checkpoint or the load stored: every frozen plain linear's weight in
    `dtype` (what autocast computes it in; `cast_frozen_weights`), everything else in fp32: the trainable parameters
    (master weights: the delta, the head, BitFit's biases, with fp32 optimiser state), and the frozen norms,
    embeddings, biases and buffers that autocast reads in fp32 (an embedding tied to a linear, a language model's
    head, stays with the linear). `frozen(param)` says what is frozen (default: not requires_grad; a model just
    loaded has everything trainable). A linear's frozen bias goes to `dtype` too, as `cast_frozen_weights` does,
    once the delta is in. Returns the number of tensors changed."""
    frozen = frozen or (lambda param: not param.requires_grad)
    low = {id(m.weight) for m in model.modules() if type(m) is nn.Linear and frozen(m.weight)} if dtype else set()
    changed = 0
    with torch.no_grad():
        for param in model.parameters():
            if param.is_floating_point() and id(param) not in low and param.dtype != torch.float32:
                param.data = param.data.float()
                changed += 1
        for module in model.modules():
            for name, buffer in module.named_buffers(recurse=False):
                if buffer.is_floating_point() and buffer.dtype != torch.float32:
                    setattr(module, name, buffer.float())
                    changed += 1
    if dtype is None:
        return changed
    return changed + cast_frozen_weights(model, dtype, frozen)

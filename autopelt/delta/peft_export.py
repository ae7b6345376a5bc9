"""Export a delta as a peft adapter folder: LoRA (rsLoRA, DoRA), (IA)³, VeRA or prefix-tuning, with the task head,
and BitFit's biases beside LoRA or VeRA as peft trains them (its `bias` setting). Each method's registry entry
gives its peft config, or why it has none; what is here holds for every method.

peft builds its own adapter around a fresh copy of the base model, our trained tensors are copied into it by
name, and peft writes the folder itself: the format is peft's by construction, not by imitation. A delta peft
cannot express is refused with a one-line reason (`peft_reason`), never skipped in silence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from autopelt.delta.io import delta_state, stored_spec
from autopelt.delta.registry import method_of
from autopelt.delta.families import ARCHITECTURES
from autopelt.delta.sites import Architecture, chosen_layers
from autopelt.delta.families import architecture_of
from autopelt.delta.spec import DeltaSpec, MethodConfig
from autopelt.errors import UserError

def peft_reason(spec, model_type: str | None = None) -> str | None:
    """Why the delta has no peft form on a model of `model_type` (None: an encoder), in one line; None when it has
    one."""
    try:
        peft_form(spec, model_type)
    except UserError as error:
        return str(error)
    return None


def peft_expressible(spec, model_type: str | None = None) -> bool:
    return peft_reason(spec, model_type) is None


def peft_form(spec, model_type: str | None = None) -> tuple[MethodConfig, str]:
    """The one method of the delta's inference form that peft loads, and peft's `bias` setting that trains exactly
    the delta's biases.

    Raises:
        UserError: the delta has no peft form on a model of `model_type` (None: an encoder), in one line.
    """
    stored = stored_spec(spec)
    if stored.pooling != "cls":
        raise UserError(f"this delta ({stored.summary()}) has no peft form: a peft folder holds no pooling, and "
                        "loaded with peft the model's head would read its first token; train it with --pooling cls "
                        "for one")
    beside = [m for m in stored.methods if method_of(m).peft_beside]  # BitFit: another method's `bias` setting
    methods = [m for m in stored.methods if not method_of(m).peft_beside]
    if len(methods) != 1:
        what = (method_of(beside[0]).peft if not methods else
                f"a peft adapter folder holds one method, and this delta combines {len(methods)}")
        raise UserError(f"this delta ({stored.summary()}) has no peft form: {what}")
    method = methods[0]
    reason = _unexpressible(method, ARCHITECTURES.get(model_type))
    if reason:
        raise UserError(f"this delta's {method.describe()} has no peft form: {reason}")
    bias = "none"
    for other in beside:
        bias = method_of(other).peft_beside(other, method)
    return method, bias


def _unexpressible(method: MethodConfig, arch: Architecture | None) -> str | None:
    entry = method_of(method)
    if getattr(method, "gate", False):
        return "peft has no UniPELT gate"
    if isinstance(entry.peft, str):
        return entry.peft
    return entry.peft_refuses(method, arch)


@dataclass(frozen=True)
class PeftTarget:
    """What a method's `peft` is given: the model's transformers config and family, whether it is the language
    model (no task head), and the `bias` setting its BitFit asks for."""

    config: Any
    arch: Architecture
    lm: bool
    bias: str = "none"

    @property
    def task(self) -> dict:
        """peft's `task_type` for this model."""
        return {"task_type": peft_task(self.config, self.lm)}

    @property
    def with_head(self) -> dict:
        """`task`, and the task head in `modules_to_save` (a classifier's)."""
        return {**self.task, **({} if self.lm else {"modules_to_save": list(self.arch.head_parts)})}

    def sites(self, layers, sites) -> str:
        """A full-match regex for exactly these sites in these layers, stack by stack (peft reads a string as a
        regex)."""
        config, arch = self.config, self.arch
        chosen, start, parts = set(chosen_layers(layers, arch.num_layers(config))), 0, []
        for stack in arch.stacks:
            size = int(getattr(config, stack.size))
            indices = "|".join(str(i - start) for i in range(start, start + size) if i in chosen)
            paths = "|".join(re.escape(stack.linears[site]) for site in arch.sites(sites) if site in stack.linears)
            if indices and paths:
                parts.append(rf"{re.escape(stack.layers)}\.({indices})\.({paths})")
            start += size
        return rf".*({'|'.join(parts)})"


def peft_task(config, lm: bool):
    import peft

    if not lm:
        return peft.TaskType.SEQ_CLS
    return peft.TaskType.SEQ_2_SEQ_LM if getattr(config, "is_encoder_decoder", False) else peft.TaskType.CAUSAL_LM


def peft_config(spec: DeltaSpec, config, lm: bool = False):
    """The peft config of the delta's peft form on a model of transformers config `config` (with `lm`, its language
    model, which has no task head to save).

    Raises:
        UserError: the delta has no peft form (`peft_form`).
    """
    method, bias = peft_form(spec, config.model_type)
    return method_of(method).peft(method, PeftTarget(config, architecture_of(config), lm, bias))


def export_peft(model: nn.Module, spec, out_dir, base_model_name: str | None = None) -> Path:
    """Write a peft adapter folder that `PeftModel.from_pretrained(base, out_dir)` loads."""
    from peft import get_peft_model

    from autopelt.delta.sites import model_class

    method, _ = peft_form(spec, model.config.model_type)  # a one-line UserError when peft cannot hold this delta
    entry = method_of(method)
    spec = stored_spec(spec)
    lm = getattr(model, architecture_of(model.config).head, None) is None  # a language model: no task head
    config = peft_config(spec, model.config, lm)
    config.base_model_name_or_path = base_model_name
    with torch.device("meta"):  # peft only needs the structure; every saved tensor is copied from ours
        skeleton = model_class(model.config, lm).from_config(model.config)
    _check_head(model, skeleton, lm)
    peft_model = get_peft_model(skeleton, config)
    ours = _inference_state(model)
    ours.update(entry.peft_tensors(model) if entry.peft_tensors else {})
    for name, param in list(peft_model.named_parameters()):  # peft may save frozen tensors too (biases, the head)
        # prompt learning: peft holds the model itself as base_model, with no tuner model between
        source = ours.get(_our_name(name, entry.peft_names), ours.get(_plain(name.removeprefix("base_model."))))
        if source is None:
            raise RuntimeError(f"peft parameter {name} has no counterpart in the autopelt model")
        _set_parameter(peft_model, name, source.reshape(param.shape))  # peft's IA3 vectors are (n, 1) or (1, n)
    peft_model.save_pretrained(str(out_dir))
    return Path(out_dir)


def _check_head(model: nn.Module, skeleton: nn.Module, lm: bool) -> None:
    """Refuse a head with a tensor that the model class's own head lacks: peft would load the delta without it."""
    if lm:
        return
    head = architecture_of(model.config).head
    theirs = {name for name, _ in skeleton.named_parameters()}
    extra = sorted(name for name, _ in model.named_parameters() if name.startswith(head + ".") and name not in theirs)
    if extra:
        raise UserError(f"this delta's head holds {extra[0]}, which {type(skeleton).__name__}'s head has not (a "
                        "regression's output bias, started at the labels' mean), so peft would load it without "
                        "it; load the delta with autopelt")


def _inference_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor of our model by its name without wrappers, AdaMix mixtures as their merged expert."""
    state = {name: p.detach().to("cpu") for name, p in model.named_parameters()}
    state.update(delta_state(model))
    return {_plain(name): tensor for name, tensor in state.items()}


def _plain(name: str) -> str:
    return name.replace(".base_layer.", ".")


def _our_name(peft_name: str, names: dict[str, str]) -> str:
    """Our name for a peft tensor; `names`: the method's own (its entry's `peft_names`)."""
    name = _plain(peft_name.removeprefix("base_model.").removeprefix("model."))
    name = re.sub(r"\.(modules_to_save\.default|original_module)\.", ".", name)
    name = re.sub(r"\.default(\.|$)", r"\1", name)
    for theirs, ours in names.items():
        if name.endswith("." + theirs):
            return name.removesuffix(theirs) + ours
    return name


def _set_parameter(model: nn.Module, name: str, value: torch.Tensor) -> None:
    module_name, _, attr = name.rpartition(".")
    module = model.get_submodule(module_name)
    setattr(module, attr, nn.Parameter(value.clone(), requires_grad=True))

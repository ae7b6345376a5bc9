"""Export a LoRA delta (+ BitFit biases, + the head) as a peft adapter folder.

peft builds its own adapter around a fresh copy of the base model, our trained tensors are copied into it by
name, and peft writes the folder itself: the format is peft's by construction, not by imitation.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import nn

from autopelt.delta.io import delta_state, stored_spec
from autopelt.delta.sites import architecture_of, chosen_layers
from autopelt.delta.spec import BIAS_SITES, BitFitConfig, DeltaSpec, LoRAConfig
from autopelt.errors import UserError


def peft_expressible(spec) -> bool:
    """True when the delta's inference form is ungated LoRA, optionally with BitFit, and peft trains the same biases."""
    try:
        peft_bias(spec)
    except UserError:
        return False
    return True


def peft_bias(spec) -> str:
    """peft's `bias` setting that trains exactly the delta's biases; a one-line UserError when none does.

    peft trains every bias ("all"), the biases of the LoRA layers ("lora_only") or none; a BitFit entry must train
    one of those sets. The spec alone decides, so a BitFit without the pooler's bias is refused even for RoBERTa,
    which has no pooler.
    """
    methods = stored_spec(spec).methods
    loras = [m for m in methods if isinstance(m, LoRAConfig) and not m.gate]
    if not loras or not all(isinstance(m, BitFitConfig) or m in loras for m in methods):
        raise UserError(f"this delta ({stored_spec(spec).summary()}) has no peft form: only ungated LoRA, "
                        "optionally with BitFit, exports to peft")
    bitfit = next((m for m in methods if isinstance(m, BitFitConfig)), None)
    if bitfit is None:
        return "none"
    every_site = bitfit.targets is None or set(bitfit.targets) == set(BIAS_SITES)
    if every_site and bitfit.layers is None and bitfit.pooler:
        return "all"
    lora = loras[0]
    if set(bitfit.targets or BIAS_SITES) == set(lora.targets) and bitfit.layers == lora.layers and not bitfit.pooler:
        return "lora_only"
    raise UserError(f"this delta's {bitfit.describe()} has no peft form: peft trains every bias (bitfit with "
                    "targets and layers null, pooler true), those of the LoRA layers (bitfit with the LoRA's targets "
                    "and layers, pooler false) or none")


def peft_config(spec: DeltaSpec, config):
    from peft import LoraConfig, TaskType

    arch = architecture_of(config)
    lora = next(m for m in spec.methods if isinstance(m, LoRAConfig))
    layers = "|".join(str(i) for i in chosen_layers(lora.layers, config.num_hidden_layers))
    paths = "|".join(re.escape(arch.linears[t]) for t in lora.targets)
    return LoraConfig(
        r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout, task_type=TaskType.SEQ_CLS,
        target_modules=rf".*{re.escape(arch.layers)}\.({layers})\.({paths})",  # a full-match regex: exact sites
        bias=peft_bias(spec),
        modules_to_save=[arch.head],
    )


def export_peft(model: nn.Module, spec, out_dir, base_model_name: str | None = None) -> Path:
    """Write a peft adapter folder that `PeftModel.from_pretrained(base, out_dir)` loads."""
    from peft import get_peft_model
    from transformers import AutoModelForSequenceClassification

    peft_bias(spec)  # a one-line UserError when peft would train other tensors than the delta did
    spec = stored_spec(spec)
    config = peft_config(spec, model.config)
    config.base_model_name_or_path = base_model_name
    with torch.device("meta"):  # peft only needs the structure; every saved tensor is copied from ours
        skeleton = AutoModelForSequenceClassification.from_config(model.config)
    peft_model = get_peft_model(skeleton, config)
    ours = _inference_state(model)
    for name, _ in list(peft_model.named_parameters()):  # peft may save frozen tensors too (biases, the head)
        source = ours.get(_our_name(name))
        if source is None:
            raise RuntimeError(f"peft parameter {name} has no counterpart in the autopelt model")
        _set_parameter(peft_model, name, source)
    peft_model.save_pretrained(str(out_dir))
    return Path(out_dir)


def _inference_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor of our model by name, AdaMix mixtures as their merged expert."""
    state = {name: p.detach().to("cpu") for name, p in model.named_parameters()}
    state.update(delta_state(model))
    return state


def _our_name(peft_name: str) -> str:
    name = peft_name.removeprefix("base_model.model.")
    name = name.replace(".lora_A.default.", ".lora_A.").replace(".lora_B.default.", ".lora_B.")
    return re.sub(r"\.(modules_to_save\.default|original_module)\.", ".", name)


def _set_parameter(model: nn.Module, name: str, value: torch.Tensor) -> None:
    module_name, _, attr = name.rpartition(".")
    module = model.get_submodule(module_name)
    setattr(module, attr, nn.Parameter(value.clone(), requires_grad=True))

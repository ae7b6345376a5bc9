"""Export a delta as a peft adapter folder: LoRA (rsLoRA, DoRA), (IA)³, VeRA or prefix-tuning, with the task head,
and BitFit's biases beside LoRA or VeRA as peft trains them (its `bias` setting).

peft builds its own adapter around a fresh copy of the base model, our trained tensors are copied into it by
name, and peft writes the folder itself: the format is peft's by construction, not by imitation. A delta peft
cannot express is refused with a one-line reason (`peft_reason`), never skipped in silence.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from torch import nn

from autopelt.delta.io import delta_state, stored_spec
from autopelt.delta.modules.prefix import PrefixEncoder
from autopelt.delta.sites import architecture_of, chosen_layers
from autopelt.delta.spec import (
    BIAS_SITES, AdapterConfig, BitFitConfig, DeltaSpec, IA3Config, LoRAConfig, MethodConfig, PrefixConfig,
    PromptConfig, VeRAConfig,
)
from autopelt.errors import UserError

# peft's names for our delta tensors (after its adapter name is dropped): the one place the two namings meet
PEFT_NAMES = {"lora_magnitude_vector.weight": "magnitude", "ia3_l": "scale", "vera_lambda_b": "lambda_b",
              "vera_lambda_d": "lambda_d"}
PREFIX_EMBEDDING = "prompt_encoder.embedding.weight"


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


def _leading_prompt(model_type: str | None) -> bool:
    """Whether a soft prompt goes before the first token on this model, as peft's always does: on a decoder and on
    an encoder-decoder's encoder, not on an encoder (after [CLS])."""
    from autopelt.delta.sites import ARCHITECTURES

    arch = ARCHITECTURES.get(model_type)
    return arch is not None and (arch.causal or arch.family == "t5")


def peft_form(spec, model_type: str | None = None) -> tuple[MethodConfig, str]:
    """The one method of the delta's inference form that peft loads, and peft's `bias` setting that trains exactly
    the delta's biases; a one-line UserError when there is none."""
    stored = stored_spec(spec)
    if stored.pooling != "cls":
        raise UserError(f"this delta ({stored.summary()}) has no peft form: a peft folder holds no pooling, and "
                        "loaded with peft the model's head would read its first token; train it with --pooling cls "
                        "for one")
    methods = [m for m in stored.methods if not isinstance(m, BitFitConfig)]
    bitfit = next((m for m in stored.methods if isinstance(m, BitFitConfig)), None)
    if len(methods) != 1:
        what = ("peft has no BitFit of its own (its biases can go beside a LoRA or VeRA)" if not methods else
                "a peft adapter folder holds one method (LoRA, IA3, VeRA or prefix-tuning), and this delta combines "
                f"{len(methods)}")
        raise UserError(f"this delta ({stored.summary()}) has no peft form: {what}")
    method = methods[0]
    reason = _unexpressible(method, _leading_prompt(model_type), _encoder_decoder(model_type))
    if reason:
        raise UserError(f"this delta's {method.describe()} has no peft form: {reason}")
    return method, _bias(method, bitfit)


def _encoder_decoder(model_type: str | None) -> bool:
    from autopelt.delta.sites import ARCHITECTURES

    arch = ARCHITECTURES.get(model_type)
    return arch is not None and len(arch.stacks) == 2


def _unexpressible(method: MethodConfig, leading_prompt: bool, encoder_decoder: bool = False) -> str | None:
    if getattr(method, "gate", False):
        return "peft has no UniPELT gate"
    if isinstance(method, AdapterConfig):
        return "peft has no bottleneck adapters (AdapterHub has)"
    if isinstance(method, PromptConfig) and not leading_prompt:
        return "peft's prompt tuning puts the soft tokens before the first token, autopelt's after it"
    if isinstance(method, PrefixConfig) and encoder_decoder and not method.shift_positions:
        return ("peft's prefix-tuning on T5 reaches only the decoder's self-attention, this one (AdapterHub's) also "
                "the encoder's and the cross-attention (train with prefix.shift_positions: true for peft's)")
    if isinstance(method, PrefixConfig) and method.layers is not None:
        return "peft's prefix-tuning covers every layer"
    if isinstance(method, PrefixConfig) and not method.shift_positions:
        return ("peft's prefix-tuning moves the real tokens to positions L..L+T-1, this prefix kept them at 0..T-1 "
                "(train with prefix.shift_positions: true to export to peft)")
    return None


def _bias(method: MethodConfig, bitfit: BitFitConfig | None) -> str:
    """peft trains every bias ("all"), those of its adapted layers ("lora_only", "vera_only") or none."""
    if bitfit is None:
        return "none"
    if not isinstance(method, (LoRAConfig, VeRAConfig)):
        raise UserError(f"this delta's {bitfit.describe()} has no peft form: peft's {method.method} trains no biases "
                        "(modules_to_save would train whole layers)")
    every_site = bitfit.targets is None or set(bitfit.targets) == set(BIAS_SITES)
    if every_site and bitfit.layers is None and bitfit.pooler:
        return "all"
    if set(bitfit.targets or BIAS_SITES) == set(method.targets) and bitfit.layers == method.layers \
            and not bitfit.pooler:
        return f"{method.method}_only"
    raise UserError(f"this delta's {bitfit.describe()} has no peft form: peft trains every bias (bitfit with "
                    f"targets and layers null, pooler true), those of the {method.method} layers (bitfit with the "
                    f"{method.method}'s targets and layers, pooler false) or none")


def peft_task(config, lm: bool):
    import peft

    if not lm:
        return peft.TaskType.SEQ_CLS
    return peft.TaskType.SEQ_2_SEQ_LM if getattr(config, "is_encoder_decoder", False) else peft.TaskType.CAUSAL_LM


def peft_config(spec: DeltaSpec, config, lm: bool = False):
    """The peft config of the delta's peft form on a model of transformers config `config` (with `lm`, its language
    model, which has no task head to save)."""
    import peft

    method, bias = peft_form(spec, config.model_type)
    arch = architecture_of(config)
    task = {"task_type": peft_task(config, lm)}
    if isinstance(method, PrefixConfig):  # its saved form, the prefix matrices themselves
        sizes = {}
        if getattr(config, "is_encoder_decoder", False):  # peft would read the encoder's depth and d_model
            sizes = dict(num_layers=config.num_decoder_layers, num_attention_heads=config.num_heads,
                         token_dim=config.num_heads * config.d_kv)
        return peft.PrefixTuningConfig(num_virtual_tokens=method.length, prefix_projection=False, **sizes, **task)
    if isinstance(method, PromptConfig):  # on T5 the encoder's prompt alone (peft's default adds the decoder's rows)
        return peft.PromptTuningConfig(num_virtual_tokens=method.length, num_transformer_submodules=1, **task)
    targets = _sites(arch, config, method.layers, method.targets)
    if not lm:
        task["modules_to_save"] = [arch.head]
    if isinstance(method, IA3Config):  # the vector on `output` rescales its input: peft's feedforward module
        inputs = [site for site in arch.sites(method.targets) if site == "output"]
        return peft.IA3Config(target_modules=targets, **task,
                              feedforward_modules=_sites(arch, config, method.layers, inputs) if inputs else [])
    if isinstance(method, VeRAConfig):  # peft regenerates A and B from the same seed, as autopelt does
        return peft.VeraConfig(r=method.rank, target_modules=targets, projection_prng_key=method.projection_seed,
                               save_projection=False, vera_dropout=method.dropout, d_initial=method.d_initial,
                               bias=bias, **task)
    return peft.LoraConfig(r=method.rank, lora_alpha=method.alpha, lora_dropout=method.dropout,
                           use_rslora=method.rslora, use_dora=method.dora, target_modules=targets, bias=bias, **task)


def _sites(arch, config, layers, sites) -> str:
    """A full-match regex for exactly these sites in these layers, stack by stack (peft reads a string as a
    regex)."""
    chosen, start, parts = set(chosen_layers(layers, arch.num_layers(config))), 0, []
    for stack in arch.stacks:
        size = int(getattr(config, stack.size))
        indices = "|".join(str(i - start) for i in range(start, start + size) if i in chosen)
        paths = "|".join(re.escape(stack.linears[site]) for site in arch.sites(sites) if site in stack.linears)
        if indices and paths:
            parts.append(rf"{re.escape(stack.layers)}\.({indices})\.({paths})")
        start += size
    return rf".*({'|'.join(parts)})"


def export_peft(model: nn.Module, spec, out_dir, base_model_name: str | None = None) -> Path:
    """Write a peft adapter folder that `PeftModel.from_pretrained(base, out_dir)` loads."""
    from peft import get_peft_model

    from autopelt.delta.sites import model_class

    peft_form(spec, model.config.model_type)  # a one-line UserError when peft cannot hold this delta
    spec = stored_spec(spec)
    lm = getattr(model, architecture_of(model.config).head, None) is None  # a language model: no task head
    config = peft_config(spec, model.config, lm)
    config.base_model_name_or_path = base_model_name
    with torch.device("meta"):  # peft only needs the structure; every saved tensor is copied from ours
        skeleton = model_class(model.config, lm).from_config(model.config)
    peft_model = get_peft_model(skeleton, config)
    ours = _inference_state(model)
    for name, param in list(peft_model.named_parameters()):  # peft may save frozen tensors too (biases, the head)
        source = ours.get(_our_name(name), ours.get(_plain(name.removeprefix("base_model."))))  # prompt learning:
        # peft holds the model itself as base_model, with no tuner model between
        if source is None:
            raise RuntimeError(f"peft parameter {name} has no counterpart in the autopelt model")
        _set_parameter(peft_model, name, source.reshape(param.shape))  # peft's IA3 vectors are (n, 1) or (1, n)
    peft_model.save_pretrained(str(out_dir))
    return Path(out_dir)


def _inference_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor of our model by its name without wrappers, AdaMix mixtures as their merged expert, and a prefix
    as peft's embedding: per virtual token, each layer's key then value."""
    state = {name: p.detach().to("cpu") for name, p in model.named_parameters()}
    state.update(delta_state(model))
    state = {_plain(name): tensor for name, tensor in state.items()}
    encoder = next((m for m in model.modules() if isinstance(m, PrefixEncoder)), None)
    if encoder is not None:
        prefix = encoder.stored_state()["prefix"].detach().to("cpu")  # (layers, 2, L, H)
        state[PREFIX_EMBEDDING] = prefix.permute(2, 0, 1, 3).reshape(prefix.shape[2], -1)  # (L, layers·2·H)
    prompt = next((p for name, p in model.named_parameters() if name.endswith("soft_prompt.embedding")), None)
    if prompt is not None:
        state[PREFIX_EMBEDDING] = prompt.detach().to("cpu")  # (L, H)
    return state


def _plain(name: str) -> str:
    return name.replace(".base_layer.", ".")


def _our_name(peft_name: str) -> str:
    name = _plain(peft_name.removeprefix("base_model.").removeprefix("model."))
    name = re.sub(r"\.(modules_to_save\.default|original_module)\.", ".", name)
    name = re.sub(r"\.default(\.|$)", r"\1", name)
    for theirs, ours in PEFT_NAMES.items():
        if name.endswith("." + theirs):
            return name.removesuffix(theirs) + ours
    return name


def _set_parameter(model: nn.Module, name: str, value: torch.Tensor) -> None:
    module_name, _, attr = name.rpartition(".")
    module = model.get_submodule(module_name)
    setattr(module, attr, nn.Parameter(value.clone(), requires_grad=True))

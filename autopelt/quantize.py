"""QLoRA's base (Dettmers et al. 2023, "QLoRA: Efficient Finetuning of Quantized LLMs"): the frozen model stored in
4-bit NormalFloat (NF4) with double quantisation, computing in bf16, with a LoRA delta trained over it in fp32.

Where it runs: CUDA, bitsandbytes installed, a decoder (a small encoder gains nothing from it and its classifier
reads a pooled state autopelt's sites keep in full precision), and a delta of plain LoRA (its module calls the
quantised linear as it is; DoRA and the merge read the base weight as a matrix, which NF4 does not hold). `refusal`
says why not in one line before anything trains. The preparation peft's `prepare_model_for_kbit_training` does is
done by what loads any model for mixed precision (`dtypes.settle_dtypes`: everything that is not a quantised linear
in fp32); gradient checkpointing, where asked, keeps its own input gradients (train/backbone.py).
"""

from __future__ import annotations

import importlib.util

FOUR_BIT = "4bit"
COMPUTE_PRECISION = "bf16"  # what a 4-bit base computes in (bnb_4bit_compute_dtype), whatever --precision says
LORA_FAMILY = ("lora",)  # the methods that train over a quantised base


def refusal(config, spec: dict | None, cuda: bool) -> str | None:
    """Why `--quantize 4bit` cannot run for this model (its config), this delta (a spec dict; None: not known yet)
    and a machine with (`cuda`) or without a CUDA GPU; None where it can. The model and the delta are said first,
    then the machine."""
    return model_refusal(config) or (spec_refusal(spec) if spec is not None else None) or machine_refusal(cuda)


def model_refusal(config) -> str | None:
    """Why this model (its config) takes no 4-bit base: it is not a decoder."""
    from autopelt.delta.families import architecture_of

    if getattr(config, "is_encoder_decoder", False) or not architecture_of(config).causal:
        return (f"--quantize 4bit is for decoders (QLoRA), and this {config.model_type} model is not one; "
                f"leave --quantize out")
    return None


def machine_refusal(cuda: bool) -> str | None:
    """Why this machine cannot hold a 4-bit base: no CUDA GPU (`cuda` False), or no bitsandbytes."""
    if not cuda:
        return "--quantize 4bit needs a CUDA GPU (bitsandbytes' NF4 kernels), and this machine has none"
    if importlib.util.find_spec("bitsandbytes") is None:
        return "--quantize 4bit needs bitsandbytes: pip install 'autopelt[qlora]'"
    return None


def spec_refusal(spec: dict) -> str | None:
    """Why a delta cannot train over a 4-bit base (a method outside LoRA, or DoRA), else None."""
    methods = [entry.get("method") for entry in spec.get("methods", [])]
    others = sorted({str(m) for m in methods if m not in LORA_FAMILY})
    if others or not methods:
        return (f"--quantize 4bit trains LoRA alone over the 4-bit base, not {', '.join(others) or 'an empty delta'}; "
                f"use --method lora (or --space lora in a search)")
    if any(entry.get("dora") for entry in spec["methods"]):
        return "--quantize 4bit cannot train DoRA (it reads the base weight, which NF4 packs); use plain LoRA"
    return None


def load_arguments(device, skip: list[str]) -> dict:
    """from_pretrained's arguments for a 4-bit base on `device` (a CUDA device): NF4, double quantisation, bf16
    compute; the modules named in `skip` (a new task head) stay in full precision."""
    import torch
    from transformers import BitsAndBytesConfig

    config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                bnb_4bit_compute_dtype=torch.bfloat16, llm_int8_skip_modules=skip or None)
    return {"quantization_config": config, "device_map": {"": torch.device(device).index or 0}}


def check(settings, spec: dict, config, device) -> None:
    """UserError, one line, where a trial's `--quantize` cannot run on the model of `config` (`refusal`); nothing
    without it."""
    if not settings.quantize:
        return
    from autopelt.errors import UserError

    why = refusal(config, spec, getattr(device, "type", str(device)).startswith("cuda"))
    if why:
        raise UserError(why)


def search_refusal(config, space, cuda: bool) -> str | None:
    """Why a search cannot train its trials over a 4-bit base: `refusal` for the model and the machine, and a
    space that draws a method outside LoRA; None where it can (DoRA, where the space draws it, fails its trials
    with `spec_refusal`'s line)."""
    others = sorted(set(space.methods) - set(LORA_FAMILY))
    space_refusal = (f"--quantize 4bit trains LoRA alone, and space {space.name} also draws {', '.join(others)}; "
                     f"give --space lora") if others else None
    return model_refusal(config) or space_refusal or machine_refusal(cuda)

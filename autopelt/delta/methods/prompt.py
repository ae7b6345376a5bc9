"""Prompt tuning (Lester et al. 2021): L soft tokens inserted at the input embeddings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from autopelt.delta.config import MethodConfig
from autopelt.delta.fields import POSITIVE_INT, declare
from autopelt.delta.methods.prefix import PEFT_EMBEDDING
from autopelt.delta.registry import Method, register


@dataclass(frozen=True)
class PromptConfig(MethodConfig):
    method: ClassVar[str] = "prompt"
    summary: ClassVar[str] = "L soft tokens inserted after the first token at the input embeddings (Lester 2021)"

    length: int = declare("number of soft tokens L", 20, POSITIVE_INT, abbrev="L")


def build(at, cfg: PromptConfig) -> None:
    """Soft tokens drawn from real words' embeddings: after the first token on an encoder, before it on a decoder
    and on an encoder-decoder's encoder."""
    import torch

    from autopelt.delta.modules.decoder import LeadingPrompt
    from autopelt.delta.modules.prompt import EncoderPrompt, SoftPrompt

    model = at.model
    backbone = at.arch.backbone_of(model)
    vocabulary = backbone.get_input_embeddings().weight
    tokens = torch.randint(vocabulary.shape[0], (cfg.length,), generator=at.generator)
    prompt = SoftPrompt(vocabulary.detach()[tokens.to(vocabulary.device)].float())
    backbone.add_module("soft_prompt", prompt)
    if getattr(model.config, "is_encoder_decoder", False):
        hooks = EncoderPrompt(prompt)
        model.get_encoder().register_forward_pre_hook(hooks.encoder, with_kwargs=True)
        model.get_decoder().register_forward_pre_hook(hooks.decoder, with_kwargs=True)
        return
    hook = LeadingPrompt(prompt) if at.arch.causal else prompt.hook
    backbone.register_forward_pre_hook(hook, with_kwargs=True)


def count(cfg: PromptConfig, shape) -> tuple[int, int]:
    n = cfg.length * shape.arch.width(shape.config, shape.arch.input_width)  # as wide as the input embeddings
    return n, n


def peft(cfg: PromptConfig, target):
    """On T5 the encoder's prompt alone (peft's default adds the decoder's rows)."""
    import peft

    return peft.PromptTuningConfig(num_virtual_tokens=cfg.length, num_transformer_submodules=1, **target.task)


def peft_tensors(model) -> dict:
    """The soft tokens as peft's embedding, (L, H)."""
    prompt = next(p for name, p in model.named_parameters() if name.endswith("soft_prompt.embedding"))
    return {PEFT_EMBEDDING: prompt.detach().to("cpu")}


def peft_refuses(cfg: PromptConfig, arch) -> str | None:
    """peft's soft tokens go before the first token, as autopelt's do on a decoder and on T5's encoder."""
    if arch is None or not (arch.causal or arch.family == "t5"):
        return "peft's prompt tuning puts the soft tokens before the first token, autopelt's after it"
    return None


METHOD = register(Method(PromptConfig, build, count, order=60, peft=peft, peft_refuses=peft_refuses,
                         peft_tensors=peft_tensors,
                         unpackable="its tokens lengthen the sequence"))

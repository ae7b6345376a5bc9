"""Prompt tuning (Lester et al. 2021): L soft tokens at the input embeddings.

On an encoder they go right after the first token ([CLS]/<s>), which keeps the token the classification head
pools where pretraining put it; real tokens move L positions to the right, as in peft's prompt tuning. On an
encoder-decoder (T5, as the paper) they go before the encoder's first token, and the decoder's cross-attention
sees them, as peft's (`EncoderPrompt`); a decoder's are in modules/decoder.py (`LeadingPrompt`).
"""

from __future__ import annotations

import torch
from torch import nn


class SoftPrompt(nn.Module):
    def __init__(self, init: torch.Tensor):
        super().__init__()
        self.embedding = nn.Parameter(init.clone())  # (L, H)

    def insert(self, embeds: torch.Tensor) -> torch.Tensor:  # (B, T, H) -> (B, T + L, H)
        prompt = self.embedding.unsqueeze(0).expand(embeds.shape[0], -1, -1).to(embeds.dtype)
        return torch.cat([embeds[:, :1], prompt, embeds[:, 1:]], dim=1)

    def hook(self, backbone: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """A forward pre-hook on the backbone: token ids become embeddings with the prompt inside."""
        kwargs = dict(kwargs)
        input_ids = args[0] if args else kwargs.pop("input_ids", None)
        embeds = kwargs.pop("inputs_embeds", None)
        if embeds is None:
            embeds = backbone.get_input_embeddings()(input_ids)
        if kwargs.get("position_ids") is not None:
            raise ValueError("prompt tuning computes positions itself; do not pass position_ids")
        length = self.embedding.shape[0]
        kwargs["inputs_embeds"] = self.insert(embeds)
        kwargs["input_ids"] = None
        for name, fill in (("attention_mask", 1), ("token_type_ids", 0)):
            tensor = kwargs.get(name)
            if tensor is not None:
                pad = torch.full((tensor.shape[0], length), fill, dtype=tensor.dtype, device=tensor.device)
                kwargs[name] = torch.cat([tensor[:, :1], pad, tensor[:, 1:]], dim=1)
        return (), kwargs


class EncoderPrompt:
    """Prompt tuning on an encoder-decoder: pre-hooks on the encoder stack (the L soft tokens before the real ones,
    with ones before the attention mask) and on the decoder stack (ones before the cross-attention's mask, which
    the model passes unextended). T5's positions are relative, so none are shifted."""

    def __init__(self, prompt: SoftPrompt):
        self.prompt = prompt

    def encoder(self, stack: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        kwargs = dict(kwargs)
        if args:
            kwargs["input_ids"] = args[0]
        ids, embeds = kwargs.pop("input_ids", None), kwargs.pop("inputs_embeds", None)
        embeds = stack.get_input_embeddings()(ids) if embeds is None else embeds
        soft = self.prompt.embedding.unsqueeze(0).expand(embeds.shape[0], -1, -1).to(embeds.dtype)
        kwargs["inputs_embeds"] = torch.cat([soft, embeds], dim=1)
        mask = kwargs.get("attention_mask")
        if mask is not None:
            kwargs["attention_mask"] = _lead_with_ones(mask, self.prompt.embedding.shape[0])
        return (), kwargs

    def decoder(self, stack: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        mask, states = kwargs.get("encoder_attention_mask"), kwargs.get("encoder_hidden_states")
        length = self.prompt.embedding.shape[0]
        if mask is not None and states is not None and mask.shape[-1] == states.shape[1] - length:
            kwargs = {**kwargs, "encoder_attention_mask": _lead_with_ones(mask, length)}
        return args, kwargs


def _lead_with_ones(mask: torch.Tensor, length: int) -> torch.Tensor:
    return torch.cat([torch.ones_like(mask[:, :1]).expand(-1, length), mask], dim=-1)

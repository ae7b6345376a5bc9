"""Prompt tuning: L soft tokens inserted right after the first token ([CLS]/<s>) at the input embeddings.

Inserting after the first token keeps the token the classification head pools from where pretraining put
it. Real tokens move L positions to the right, as in peft's prompt tuning.
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

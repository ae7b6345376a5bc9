"""Prefixes, prompts and the classification read-out on a decoder (Llama family, GPT-2), where they go through the
model's own key/value cache and attention mask instead of a wrapped attention module.

Each is a forward pre-hook on the decoder's backbone. On a fresh pass (no cache yet, as in training or the first step
of generation) the prefix fills a new cache with its keys and values and the prompt puts its L soft tokens before
the real ones; on every pass the attention mask gets L leading ones and the positions follow the mask, so a left-
padded row (batched generation) sees the positions it would alone. This is how peft passes a prefix (as
`past_key_values`) and a prompt (before the first token); positions from the mask equal peft's arange on unpadded
and right-padded rows.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import DynamicCache

from autopelt.delta.modules.prefix import PrefixEncoder


def _cached(past) -> int:
    return 0 if past is None else int(past.get_seq_length())


def _inputs(backbone: nn.Module, args: tuple, kwargs: dict) -> dict:
    """The call's arguments as keywords (a backbone's first two positional ones are the ids and the mask)."""
    kwargs = dict(kwargs)
    for name, value in zip(("input_ids", "attention_mask"), args):
        kwargs[name] = value
    return kwargs


def _lead(kwargs: dict, length: int, tokens: int, shift: int, seen: int) -> None:
    """Give the mask `length` leading ones and the `tokens` new tokens positions counted over the real mask (or,
    without a mask, after the `seen` real tokens already in the cache), moved by `shift`."""
    mask = kwargs.get("attention_mask")
    if kwargs.get("position_ids") is None:
        if mask is not None:
            kwargs["position_ids"] = (mask.long().cumsum(-1) - 1).clamp_min(0)[:, -tokens:]
        else:
            device = _device(kwargs)
            kwargs["position_ids"] = torch.arange(seen, seen + tokens, device=device)[None]
    kwargs["position_ids"] = kwargs["position_ids"] + shift
    if mask is not None:
        ones = torch.ones(mask.shape[0], length, dtype=mask.dtype, device=mask.device)
        kwargs["attention_mask"] = torch.cat([ones, mask], dim=-1)


def _device(kwargs: dict) -> torch.device:
    ids = kwargs.get("input_ids")
    return (ids if ids is not None else kwargs["inputs_embeds"]).device


def _new_tokens(kwargs: dict) -> int:
    ids, embeds = kwargs.get("input_ids"), kwargs.get("inputs_embeds")
    return (ids if ids is not None else embeds).shape[1]


class LayerGates(nn.Module):
    """UniPELT's prefix gate on a decoder: sigmoid of a learned value per layer (and per keys/values when split),
    not of the layer's input. An average over the sequence would let a token see the ones after it, and a value per
    token cannot scale keys and values that every token shares in the cache."""

    def __init__(self, rows: int, heads: int, layers: list[int]):
        super().__init__()
        self.logit = nn.Parameter(torch.zeros(rows, heads))  # starts at 0.5, as a new UniPELT gate about does
        self.kind, self.layers = "prefix", layers

    def forward(self) -> torch.Tensor:  # (rows, heads)
        return torch.sigmoid(self.logit)


class CachePrefix:
    """Prefix-tuning on a decoder: layer l's prefix keys and values are the first L entries of its cache.

    `heads` x `head_dim` is the width of one layer's keys (grouped-query attention: fewer heads than the queries').
    With `shift` the real tokens take positions L..L+T-1, as peft's (transformers counts the prefix as past tokens).
    A prefix limited to some `layers` (of `num_layers`) fills the others' first L entries with zeros, which their
    attention never sees (`PrefixHidden`): every layer's cache and mask must be as long.
    """

    def __init__(self, encoder: PrefixEncoder, heads: int, head_dim: int, shift: bool, layers: list[int],
                 num_layers: int, gates: LayerGates | None = None):
        self.encoder, self.heads, self.head_dim, self.shift, self.gates = encoder, heads, head_dim, shift, gates
        self.layers, self.num_layers = layers, num_layers

    def __call__(self, backbone: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        kwargs = _inputs(backbone, args, kwargs)
        tokens = _new_tokens(kwargs)
        length = self.encoder.length
        cached = _cached(kwargs.get("past_key_values"))
        if cached == 0:
            kwargs["past_key_values"] = self.fill(kwargs.get("past_key_values"), self._batch(kwargs))
        _lead(kwargs, length, tokens, length if self.shift else 0, max(cached - length, 0))
        return (), kwargs

    @staticmethod
    def _batch(kwargs: dict) -> int:
        ids = kwargs.get("input_ids")
        return (ids if ids is not None else kwargs["inputs_embeds"]).shape[0]

    def fill(self, cache, batch: int):
        cache = cache if cache is not None else DynamicCache()
        gates = self.gates() if self.gates is not None else None  # (rows, 1 or 2)
        rows = {layer: row for row, layer in enumerate(self.layers)}
        placeholder = next(self.encoder.parameters()).new_zeros(batch, self.heads, self.encoder.length, self.head_dim)
        for layer in range(self.num_layers):
            row = rows.get(layer)
            if row is None:  # a layer without a prefix: placeholders, hidden from its attention
                cache.update(placeholder, placeholder, layer)
                continue
            key, value = _keys_values(self.encoder, row, self.heads, self.head_dim, batch)
            if gates is not None:
                key, value = key * gates[row, 0], value * gates[row, -1]
            cache.update(key, value, layer)
        return cache


def _keys_values(encoder: PrefixEncoder, row: int, heads: int, head_dim: int, batch: int):
    """A prefix row's keys and values, each (batch, heads, L, head_dim), as a cache holds them."""
    return tuple(p.view(1, -1, heads, head_dim).transpose(1, 2).expand(batch, -1, -1, -1) for p in encoder(row))


class T5CachePrefix:
    """peft's prefix-tuning on T5 (`prefix.shift_positions`), a pre-hook on the decoder stack: the prefix is the
    first L entries of the decoder's self-attention cache, so T5's relative positions count it as L past tokens and
    a decoder mask gets L leading ones; the encoder and the cross-attention see none.

    peft 0.21 splits its prefix rows four at a time into (self keys, self values, cross keys, cross values) per
    decoder layer and then drops the cross half, so decoder layer i reads row 2i mod N of its N rows (for an even N
    half the rows are read by no layer, and layers i and i + N/2 share one); this form reads the same rows, so that
    a peft folder holds it (docs/decoders.md). UniPELT's gate, which peft has not, is one per layer."""

    def __init__(self, encoder: PrefixEncoder, heads: int, head_dim: int, gates: LayerGates | None = None):
        self.encoder, self.heads, self.head_dim, self.gates = encoder, heads, head_dim, gates

    def __call__(self, decoder: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        from transformers import EncoderDecoderCache

        kwargs = dict(kwargs)
        past = kwargs.get("past_key_values")
        if past is None or past.self_attention_cache.get_seq_length() == 0:
            if past is None:
                past = EncoderDecoderCache(DynamicCache(), DynamicCache())
            self.fill(past.self_attention_cache, CachePrefix._batch(kwargs))
            kwargs["past_key_values"] = past
        mask = kwargs.get("attention_mask")
        if mask is not None:
            ones = torch.ones(mask.shape[0], self.encoder.length, dtype=mask.dtype, device=mask.device)
            kwargs["attention_mask"] = torch.cat([ones, mask], dim=-1)
        return args, kwargs

    def fill(self, cache, batch: int) -> None:
        rows = self.encoder.rows
        gates = self.gates() if self.gates is not None else None  # (rows, 1 or 2)
        for layer in range(rows):
            key, value = _keys_values(self.encoder, 2 * layer % rows, self.heads, self.head_dim, batch)
            if gates is not None:
                key, value = key * gates[layer, 0], value * gates[layer, -1]
            cache.update(key, value, layer)


class PrefixHidden(nn.Module):
    """Wraps the attention of a decoder layer that a layer-limited prefix leaves out: the first `length` entries of
    its cache (placeholders) and of its mask are dropped before it attends, so it computes what it would without
    any prefix, at the positions the prefix gives every layer."""

    def __init__(self, base_layer: nn.Module, length: int):
        super().__init__()
        self.base_layer, self.length = base_layer, length

    def forward(self, *args, **kwargs):
        mask = kwargs.get("attention_mask")
        if isinstance(mask, torch.Tensor):
            kwargs["attention_mask"] = mask[..., self.length:]
        if kwargs.get("past_key_values") is not None:
            kwargs["past_key_values"] = _WithoutLeading(kwargs["past_key_values"], self.length)
        return self.base_layer(*args, **kwargs)


class _WithoutLeading:
    """A cache as one layer sees it without its first `length` entries (what `update` returns; it stores all)."""

    def __init__(self, cache, length: int):
        self._cache, self._length = cache, length

    def update(self, keys: torch.Tensor, values: torch.Tensor, *args, **kwargs):
        keys, values = self._cache.update(keys, values, *args, **kwargs)
        return keys[:, :, self._length:], values[:, :, self._length:]

    def __getattr__(self, name: str):
        return getattr(self._cache, name)


class LeadingPrompt:
    """Prompt tuning on a decoder: the L soft tokens go before the real ones, as peft's."""

    def __init__(self, prompt: nn.Module):
        self.prompt = prompt

    def __call__(self, backbone: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        kwargs = _inputs(backbone, args, kwargs)
        tokens = _new_tokens(kwargs)
        length = self.prompt.embedding.shape[0]
        cached = _cached(kwargs.get("past_key_values"))
        if cached == 0:
            ids = kwargs.pop("input_ids", None)
            embeds = kwargs.get("inputs_embeds")
            embeds = backbone.get_input_embeddings()(ids) if embeds is None else embeds
            soft = self.prompt.embedding.unsqueeze(0).expand(embeds.shape[0], -1, -1).to(embeds.dtype)
            kwargs["inputs_embeds"] = torch.cat([soft, embeds], dim=1)
            kwargs["input_ids"] = None
            mask = kwargs.get("attention_mask")
            if mask is not None and kwargs.get("position_ids") is None:
                kwargs["position_ids"] = (mask.long().cumsum(-1) - 1).clamp_min(0)
            positions = kwargs.get("position_ids")
            if positions is not None:
                lead = torch.arange(length, device=positions.device).expand(positions.shape[0], -1)
                kwargs["position_ids"] = torch.cat([lead, positions + length], dim=-1)
            if mask is not None:
                kwargs["attention_mask"] = torch.cat([torch.ones_like(mask[:, :1]).expand(-1, length), mask], -1)
            types = kwargs.get("token_type_ids")  # GPT-2 reads them where a tokenizer gives them: type 0 leads
            if types is not None:
                kwargs["token_type_ids"] = torch.cat([torch.zeros_like(types[:, :1]).expand(-1, length), types], -1)
        else:
            _lead(kwargs, length, tokens, length, cached - length)
        return (), kwargs


class LastToken:
    """The read-out of a decoder classifier: the head reads the last real token's state, as
    LlamaForSequenceClassification means to; found from the attention mask (its pad-token search cannot see
    through a soft prompt), and moved to the last position, which is where that search lands when it fails."""

    def __init__(self):
        self.mask: torch.Tensor | None = None

    def capture(self, backbone: nn.Module, args: tuple, kwargs: dict) -> None:
        self.mask = _inputs(backbone, args, kwargs).get("attention_mask")

    def release(self, backbone: nn.Module, args: tuple, kwargs: dict, output):
        mask, self.mask = self.mask, None
        hidden = output.last_hidden_state  # (B, T, H)
        if mask is None:
            return output
        mask = mask[:, -hidden.shape[1]:]  # a prefix's leading ones stand for the cache, not for hidden states
        last = (mask.long() * torch.arange(1, mask.shape[1] + 1, device=mask.device)).argmax(-1)  # (B,)
        picked = hidden[torch.arange(hidden.shape[0], device=hidden.device), last]  # (B, H)
        output.last_hidden_state = torch.cat([hidden[:, :-1], picked[:, None]], dim=1)
        return output

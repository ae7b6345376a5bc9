"""Prefix-tuning: L trainable keys and values prepended to every attention layer's own.

During training the prefixes come from a small MLP over L embeddings (Li & Liang's reparameterisation);
what is saved is only the resulting 2 x N_layers prefix matrices.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.bert.modeling_bert import eager_attention_forward

from autopelt.delta.modules.gate import Gate


class PrefixEncoder(nn.Module):
    """Keys and values (each L x H) for `rows` attention layers, direct or through an MLP."""

    def __init__(self, rows: int, length: int, hidden: int, reparam_hidden: int, generator: torch.Generator):
        super().__init__()
        self.rows, self.length, self.hidden = rows, length, hidden
        if reparam_hidden > 0:
            self.embedding = nn.Parameter(torch.randn(length, hidden, generator=generator))
            self.mlp_in = nn.Linear(hidden, reparam_hidden)
            self.mlp_out = nn.Linear(reparam_hidden, rows * 2 * hidden)
            for linear in (self.mlp_in, self.mlp_out):
                bound = linear.weight.shape[1] ** -0.5
                with torch.no_grad():
                    linear.weight.uniform_(-bound, bound, generator=generator)
                    linear.bias.zero_()
            self.prefix = None
        else:
            self.prefix = nn.Parameter(0.02 * torch.randn(rows, 2, length, hidden, generator=generator))

    def forward(self, row: int) -> tuple[torch.Tensor, torch.Tensor]:  # two (L, H)
        if self.prefix is not None:
            return self.prefix[row, 0], self.prefix[row, 1]
        span = slice(row * 2 * self.hidden, (row + 1) * 2 * self.hidden)  # only this layer's output rows
        hidden = torch.tanh(self.mlp_in(self.embedding))  # (L, R)
        keys_values = F.linear(hidden, self.mlp_out.weight[span], self.mlp_out.bias[span])  # (L, 2H)
        return keys_values[:, : self.hidden], keys_values[:, self.hidden :]

    def stored_state(self) -> dict[str, torch.Tensor]:
        """The prefix matrices alone, as a direct (reparam_hidden=0) encoder holds them."""
        rows = [torch.stack(self(r)) for r in range(self.rows)]  # each (2, L, H)
        return {"prefix": torch.stack(rows)}  # (rows, 2, L, H)


class PositionShift:
    """A forward pre-hook on the embeddings: the real tokens take positions L..L+T-1, as they do when the prefix is
    passed as L past keys and values (peft's prefix-tuning: transformers then counts the prefix as past tokens)."""

    def __init__(self, length: int):
        self.length = length

    def __call__(self, embeddings: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        kwargs = dict(kwargs)
        kwargs["past_key_values_length"] = kwargs.get("past_key_values_length", 0) + self.length
        return args, kwargs


class PrefixSelfAttention(nn.Module):
    """Wraps a self-attention module whose query, key and value linears (`linears`: their attribute names) feed
    transformers' attention function, and attends over [prefix; keys]. The prefix is always visible, whatever the
    padding mask hides. BERT's module ends there; DistilBERT's and ALBERT's also hold what follows the attention
    (`tail`: TAILS), which runs after it as in the module's own forward."""

    def __init__(self, base_layer: nn.Module, encoder: PrefixEncoder, row: int, gate: Gate | None = None,
                 linears: tuple[str, str, str] = ("query", "key", "value"), tail: str = "bert"):
        super().__init__()
        self.base_layer, self.prefix_encoder, self.row, self.gate = base_layer, encoder, row, gate
        self.linears, self.tail = linears, TAILS[tail]

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                past_key_values=None, **kwargs):
        if past_key_values is not None:
            raise NotImplementedError("prefix-tuning is for encoders; a key/value cache is not supported")
        base = self.base_layer
        batch, length = hidden_states.shape[:2]
        query, key, value = (split_heads(getattr(base, name)(hidden_states), base.attention_head_size)
                             for name in self.linears)
        prefix_key, prefix_value = gated_prefix(self, hidden_states, base.attention_head_size, query.dtype)
        key = torch.cat([prefix_key, key], dim=2)
        value = torch.cat([prefix_value, value], dim=2)
        mask = extend_mask(attention_mask, prefix_key.shape[2])
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(base.config._attn_implementation, eager_attention_forward)
        dropout = getattr(base, "attention_dropout", None) or base.dropout  # ALBERT's name, BERT's and DistilBERT's
        output, weights = attention(base, query, key, value, mask, dropout=dropout.p if base.training else 0.0,
                                    scaling=base.scaling, **kwargs)
        output = output.reshape(batch, length, -1).contiguous()
        return (self.tail(base, hidden_states, output) if self.tail else output), weights


# What a self-attention module does after its attention function, by the family's `prefix_attention`
TAILS = {
    "bert": None,  # BertSelfAttention ends at the attention; its output projection is the next module's
    "distilbert": lambda base, hidden, output: base.out_lin(output),
    "albert": lambda base, hidden, output: base.LayerNorm(hidden + base.output_dropout(base.dense(output))),
}


class MPNetPrefixAttention(nn.Module):
    """Prefix-tuning on MPNet's self-attention (q, k, v, o and a relative position bias the encoder computes once
    for every layer), as T5PrefixAttention does on T5's: L keys and values before the attention's own, visible to
    every query whatever the padding mask hides. The prefix has no position: its columns of the position bias are
    zero, and the real tokens keep theirs. MPNet's attention computes in eager form whatever the model's attention
    implementation; so does this one. `gate`: UniPELT's, as in PrefixSelfAttention."""

    def __init__(self, base_layer: nn.Module, encoder: PrefixEncoder, row: int, gate: Gate | None = None):
        super().__init__()
        self.base_layer, self.prefix_encoder, self.row, self.gate = base_layer, encoder, row, gate

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_bias: torch.Tensor | None = None, output_attentions: bool = False, **kwargs):
        base = self.base_layer
        batch, length = hidden_states.shape[:2]
        head_dim = base.attention_head_size
        query, key, value = (split_heads(linear(hidden_states), head_dim) for linear in (base.q, base.k, base.v))
        prefix_key, prefix_value = gated_prefix(self, hidden_states, head_dim, query.dtype)
        prefixed = prefix_key.shape[2]
        key, value = torch.cat([prefix_key, key], dim=2), torch.cat([prefix_value, value], dim=2)
        scores = torch.matmul(query, key.transpose(-1, -2)) / math.sqrt(head_dim)
        if position_bias is not None:
            scores = scores + torch.cat([position_bias.new_zeros(*position_bias.shape[:-1], prefixed),
                                         position_bias], dim=-1)
        mask = extend_mask(attention_mask, prefixed)
        if mask is not None:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min) if mask.dtype == torch.bool \
                else scores + mask
        probs = base.dropout(nn.functional.softmax(scores, dim=-1))
        context = torch.matmul(probs, value).transpose(1, 2).reshape(batch, length, -1)
        output = base.o(context)
        return (output, probs) if output_attentions else (output,)


class DebertaPrefixAttention(nn.Module):
    """Prefix-tuning on DeBERTa-v2/v3's disentangled self-attention: L keys and values before the attention's own,
    visible to every query whatever the padding mask hides. The prefix has no position, so neither relative term
    (content to position, position to content) reaches it: its columns of the relative scores are zero, and the
    real tokens keep theirs. The scores are scaled as the module scales them (by the number of terms). `gate`:
    UniPELT's, as in PrefixSelfAttention."""

    def __init__(self, base_layer: nn.Module, encoder: PrefixEncoder, row: int, gate: Gate | None = None):
        super().__init__()
        self.base_layer, self.prefix_encoder, self.row, self.gate = base_layer, encoder, row, gate

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor, output_attentions: bool = False,
                query_states: torch.Tensor | None = None, relative_pos: torch.Tensor | None = None,
                rel_embeddings: torch.Tensor | None = None):
        base, heads = self.base_layer, self.base_layer.num_attention_heads
        batch, length = hidden_states.shape[:2]
        as_rows = lambda x: base.transpose_for_scores(x, heads)  # noqa: E731  (B·heads, T, d), as the module's
        query = as_rows(base.query_proj(hidden_states if query_states is None else query_states))
        key, value = as_rows(base.key_proj(hidden_states)), as_rows(base.value_proj(hidden_states))
        prefix_key, prefix_value = gated_prefix(self, hidden_states, query.shape[-1], query.dtype)
        prefixed = prefix_key.shape[2]
        prefix_key, prefix_value = (x.reshape(-1, prefixed, x.shape[-1]) for x in (prefix_key, prefix_value))
        terms = 1 + ("c2p" in base.pos_att_type) + ("p2c" in base.pos_att_type)
        scale = torch.sqrt(torch.tensor(query.shape[-1], dtype=torch.float) * terms).to(query.dtype)
        scores = torch.bmm(query, torch.cat([prefix_key, key], dim=1).transpose(-1, -2) / scale)
        if base.relative_attention:
            relative = base.disentangled_attention_bias(query, key, relative_pos, base.pos_dropout(rel_embeddings),
                                                        terms)
            scores = scores + torch.cat([relative.new_zeros(*relative.shape[:-1], prefixed), relative], dim=-1)
        scores = scores.view(-1, heads, scores.shape[-2], scores.shape[-1])
        mask = extend_mask(attention_mask.bool(), prefixed)
        probs = base.dropout(nn.functional.softmax(scores.masked_fill(~mask, torch.finfo(query.dtype).min), dim=-1))
        context = torch.bmm(probs.view(-1, probs.shape[-2], probs.shape[-1]), torch.cat([prefix_value, value], dim=1))
        context = context.view(batch, heads, length, -1).permute(0, 2, 1, 3).reshape(batch, length, -1)
        return context, (probs if output_attentions else None)


class ModernBertPrefixAttention(nn.Module):
    """Prefix-tuning on ModernBERT's attention (fused Wqkv, rotary positions on queries and keys, global or sliding
    window): L keys and values before the attention's own, visible to every query whatever the padding mask or the
    window hides. The prefix has no position: its keys are not rotated, and the real tokens keep theirs. The window
    is the model's mask under sdpa and eager (the attentions autopelt runs); flash attention, which would draw the
    window over the prefix too, is refused. `gate`: UniPELT's, as in PrefixSelfAttention."""

    def __init__(self, base_layer: nn.Module, encoder: PrefixEncoder, row: int, gate: Gate | None = None):
        super().__init__()
        self.base_layer, self.prefix_encoder, self.row, self.gate = base_layer, encoder, row, gate

    def forward(self, hidden_states: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor],
                attention_mask: torch.Tensor | None = None, **kwargs):
        from transformers.models.modernbert import modeling_modernbert as modernbert

        base = self.base_layer
        implementation = base.config._attn_implementation
        if "flash" in str(implementation):
            raise NotImplementedError(f"a ModernBERT prefix under {implementation}: its window would span the "
                                      "prefix; use sdpa or eager attention")
        batch, length = hidden_states.shape[:2]
        qkv = base.Wqkv(hidden_states).view(batch, length, 3, -1, base.head_dim)
        query, key, value = (x.transpose(1, 2) for x in qkv.unbind(dim=-3))
        query, key = modernbert.apply_rotary_pos_emb(query, key, *position_embeddings, unsqueeze_dim=1)
        prefix_key, prefix_value = gated_prefix(self, hidden_states, base.head_dim, query.dtype)
        key, value = torch.cat([prefix_key, key], dim=2), torch.cat([prefix_value, value], dim=2)
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, modernbert.eager_attention_forward)
        output, weights = attention(base, query, key, value, extend_mask(attention_mask, prefix_key.shape[2]),
                                    dropout=base.attention_dropout if base.training else 0.0,
                                    scaling=base.head_dim ** -0.5, **kwargs)
        return base.out_drop(base.Wo(output.reshape(batch, length, -1).contiguous())), weights


def gated_prefix(wrapper: nn.Module, hidden_states: torch.Tensor, head_dim: int,
                 dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """An encoder wrapper's row of prefix keys and values for the batch (two (B, heads, L, d) in `dtype`), scaled by
    its UniPELT gate where it has one: (B, 1), one gate for keys and values, or (B, 2) when split."""
    key, value = prefix_heads(wrapper.prefix_encoder, wrapper.row, hidden_states.shape[0], head_dim, dtype)
    if wrapper.gate is None:
        return key, value
    g = wrapper.gate(hidden_states)
    return key * g[:, 0, None, None, None], value * g[:, -1, None, None, None]


def split_heads(x: torch.Tensor, head_dim: int) -> torch.Tensor:
    """(B, T, heads * d) -> (B, heads, T, d)."""
    return x.view(x.shape[0], x.shape[1], -1, head_dim).transpose(1, 2)


def prefix_heads(encoder: PrefixEncoder, row: int, batch: int, head_dim: int,
                 dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One row's prefix keys and values split into heads for a batch: two (B, heads, L, d), in `dtype` if given."""
    key, value = (split_heads(p.unsqueeze(0), head_dim).expand(batch, -1, -1, -1) for p in encoder(row))
    return (key.to(dtype), value.to(dtype)) if dtype is not None else (key, value)


def extend_mask(mask: torch.Tensor | None, length: int) -> torch.Tensor | None:
    """Let every query see `length` extra leading keys, whatever form transformers gave the mask in."""
    if mask is None:
        return None
    shape = (*mask.shape[:-1], length)
    if mask.dtype == torch.bool:
        visible = torch.ones(shape, dtype=torch.bool, device=mask.device)
    elif mask.dtype.is_floating_point:  # additive mask: 0 where visible
        visible = torch.zeros(shape, dtype=mask.dtype, device=mask.device)
    else:  # 0/1 padding mask
        visible = torch.ones(shape, dtype=mask.dtype, device=mask.device)
    return torch.cat([visible, mask], dim=-1)


class T5PrefixAttention(nn.Module):
    """Prefix-tuning on one of T5's attentions (the encoder's self-attention, the decoder's self-attention or its
    cross-attention), as AdapterHub places it: L trainable keys and values before the attention's own, visible to
    every query whatever the padding or causal mask hides.

    T5 has relative positions only: the prefix has none, so its columns of the position bias are zero, and the real
    tokens keep their positions. The prefix never enters the key/value cache, so generation with the cache computes
    what a full pass does. The module returns the position bias of the real keys, which the next layers share.
    `gates` (decoders' `LayerGates`: one learned value per row, not a function of the input, which a decoder row
    would read ahead of its token) scales this row's keys and values when UniPELT gates the prefix."""

    def __init__(self, base_layer: nn.Module, encoder: PrefixEncoder, row: int, gates: nn.Module | None = None):
        super().__init__()
        self.base_layer, self.prefix_encoder, self.row = base_layer, encoder, row
        self.gates = [gates]  # one module for every row, registered once on the model: a list keeps it out of here

    def forward(self, hidden_states: torch.Tensor, mask: torch.Tensor | None = None, key_value_states=None,
                position_bias: torch.Tensor | None = None, past_key_values=None, **kwargs):
        from transformers.models.t5.modeling_t5 import eager_attention_forward as t5_eager

        base = self.base_layer
        batch, queries = hidden_states.shape[:2]
        split = lambda x: split_heads(x, base.key_value_proj_dim)  # noqa: E731
        past_seen = past_key_values.get_seq_length(base.layer_idx) if past_key_values is not None else 0
        past_seen = past_seen.clone() if isinstance(past_seen, torch.Tensor) else past_seen  # a static cache's
        # count is a tensor that `update` changes in place (T5Attention clones it too)
        cross = key_value_states is not None
        query = split(base.q(hidden_states))

        key, value = cached_keys(base, hidden_states, key_value_states, past_key_values, split, base.k, base.v)

        if position_bias is None:  # the real keys' bias, shared with the next layers as T5Attention shares it
            if base.has_relative_attention_bias:
                position_bias = base.compute_bias(queries, key.shape[2], device=query.device,
                                                  past_seen_tokens=past_seen)
            else:
                position_bias = torch.zeros(1, base.n_heads, queries, key.shape[2], device=query.device,
                                            dtype=query.dtype)
        if mask is None and base.is_causal and not cross:  # a causal pass transformers left to sdpa's is_causal
            mask = causal_mask(queries, key.shape[2], query)

        prefix_key, prefix_value = prefix_heads(self.prefix_encoder, self.row, batch, base.key_value_proj_dim,
                                                query.dtype)
        gates = self.gates[0]
        if gates is not None:
            values = gates()[self.row]  # (1,) or (2,): keys', values'
            prefix_key, prefix_value = prefix_key * values[0], prefix_value * values[-1]
        length = prefix_key.shape[2]
        bias = torch.cat([position_bias.new_zeros(*position_bias.shape[:-1], length), position_bias], dim=-1)
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(base.config._attn_implementation, t5_eager)
        output, weights = attention(base, query, torch.cat([prefix_key, key], dim=2),
                                    torch.cat([prefix_value, value], dim=2), extend_mask(mask, length),
                                    dropout=base.dropout if base.training else 0.0, scaling=base.scaling,
                                    position_bias=bias, is_causal=False, **kwargs)
        return base.o(output.reshape(batch, queries, -1).contiguous()), position_bias, weights


class BartPrefixAttention(nn.Module):
    """Prefix-tuning on one of BART's attentions (the encoder's self-attention, the decoder's self-attention or its
    cross-attention), as T5PrefixAttention on T5's: L trainable keys and values before the attention's own, visible
    to every query whatever the padding or causal mask hides. BART's positions are added to its embeddings, so the
    attention holds none to give the prefix. The prefix never enters the key/value cache. `gates`: as T5's."""

    def __init__(self, base_layer: nn.Module, encoder: PrefixEncoder, row: int, gates: nn.Module | None = None):
        super().__init__()
        self.base_layer, self.prefix_encoder, self.row = base_layer, encoder, row
        self.gates = [gates]  # one module for every row, registered once on the model: a list keeps it out of here

    def forward(self, hidden_states: torch.Tensor, key_value_states=None, past_key_values=None,
                attention_mask: torch.Tensor | None = None, **kwargs):
        from transformers.models.bart.modeling_bart import eager_attention_forward as bart_eager

        base = self.base_layer
        batch, queries = hidden_states.shape[:2]
        split = lambda x: split_heads(x, base.head_dim)  # noqa: E731
        cross = key_value_states is not None
        query = split(base.q_proj(hidden_states))
        key, value = cached_keys(base, hidden_states, key_value_states, past_key_values, split, base.k_proj,
                                 base.v_proj)
        mask = attention_mask
        if mask is None and base.is_causal and not cross:  # a causal pass transformers left to sdpa's is_causal
            mask = causal_mask(queries, key.shape[2], query)
        prefix_key, prefix_value = prefix_heads(self.prefix_encoder, self.row, batch, base.head_dim, query.dtype)
        gates = self.gates[0]
        if gates is not None:
            values = gates()[self.row]  # (1,) or (2,): keys', values'
            prefix_key, prefix_value = prefix_key * values[0], prefix_value * values[-1]
        length = prefix_key.shape[2]
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(base.config._attn_implementation, bart_eager)
        output, weights = attention(base, query, torch.cat([prefix_key, key], dim=2),
                                    torch.cat([prefix_value, value], dim=2), extend_mask(mask, length),
                                    dropout=base.dropout if base.training else 0.0, scaling=base.scaling,
                                    is_causal=False, **kwargs)
        return base.out_proj(output.reshape(batch, queries, -1).contiguous()), weights


def cached_keys(base: nn.Module, hidden_states: torch.Tensor, key_value_states, past_key_values, split, key_linear,
                value_linear) -> tuple[torch.Tensor, torch.Tensor]:
    """An encoder-decoder attention's own keys and values, through the key/value cache as the module itself goes:
    a cross-attention's are computed once per input and read from the cache after (T5Attention, BartAttention)."""
    from transformers.cache_utils import EncoderDecoderCache

    cross = key_value_states is not None
    cache, updated = past_key_values, False
    if isinstance(past_key_values, EncoderDecoderCache):
        updated = past_key_values.is_updated.get(base.layer_idx)
        cache = past_key_values.cross_attention_cache if cross else past_key_values.self_attention_cache
    if cross and past_key_values is not None and updated:
        return cache.layers[base.layer_idx].keys, cache.layers[base.layer_idx].values
    states = key_value_states if cross else hidden_states
    key, value = split(key_linear(states)), split(value_linear(states))
    if past_key_values is not None:
        key, value = cache.update(key, value, base.layer_idx)
        if cross and isinstance(past_key_values, EncoderDecoderCache):
            past_key_values.is_updated[base.layer_idx] = True
    return key, value


def causal_mask(queries: int, keys: int, like: torch.Tensor) -> torch.Tensor:
    """The additive causal mask (1, 1, queries, keys) of queries that end the keys, which eager and sdpa both read."""
    seen = torch.arange(keys, device=like.device)[None, :] <= torch.arange(queries, device=like.device)[:, None] \
        + keys - queries
    return torch.zeros(seen.shape, dtype=like.dtype, device=like.device).masked_fill(
        ~seen, torch.finfo(like.dtype).min)[None, None]

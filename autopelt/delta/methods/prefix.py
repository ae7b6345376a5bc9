"""Prefix-tuning (Li & Liang 2021): L trainable keys and values prepended in every attention layer, drawn through a
reparameterisation MLP while training; the prefix matrices alone are saved."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from autopelt.delta.config import MethodConfig
from autopelt.delta.fields import BOOL, LAYER_INDICES, NON_NEGATIVE_INT, POSITIVE_INT, declare
from autopelt.delta.registry import Method, register
from autopelt.delta.sites import chosen_layers

PEFT_EMBEDDING = "prompt_encoder.embedding.weight"  # where peft's prefix-tuning and prompt tuning keep theirs


@dataclass(frozen=True)
class PrefixConfig(MethodConfig):
    method: ClassVar[str] = "prefix"
    summary: ClassVar[str] = "L trainable key/value vectors prepended in every attention layer (Li & Liang 2021)"

    length: int = declare("prefix length L", 10, POSITIVE_INT, abbrev="L")
    reparam_hidden: int = declare("hidden size of the reparameterisation MLP used while training; 0 = none "
                                  "(only the prefix matrices are ever saved)", 512, NON_NEGATIVE_INT)
    gate: bool = declare("UniPELT gate G_P = sigmoid(W·h_in) scales the prefix keys and values", False, BOOL)
    split_gate: bool = declare("with gate: two gate values per layer, one for the keys and one for the values; "
                               "UniPELT scales both with one", False, BOOL)
    layers: tuple[int, ...] | None = declare("layer indices with a prefix; null = all", None, LAYER_INDICES)
    shift_positions: bool = declare("the real tokens take positions L..L+T-1, as when the prefix is passed as past "
                                    "keys and values (peft's prefix-tuning; needed for a peft export); false: 0..T-1, "
                                    "as UniPELT", False, BOOL)

    def describe(self) -> str:
        return f"prefix L{self.length}" + (" shifted" if self.shift_positions else "") + self.gated_suffix()

    def gated_suffix(self) -> str:
        return "(gated k,v)" if self.gate and self.split_gate else super().gated_suffix()


def key_width(config) -> tuple[int, int]:
    """(heads, head size) of one layer's keys: fewer heads than the queries' under grouped-query attention."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return heads, getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def build(at, cfg: PrefixConfig) -> None:
    """An encoder's self-attentions each read their row of the prefix, in the family's form of attention
    (`Architecture.prefix_attention`); a decoder's and peft's T5 form go through the key/value cache; AdapterHub's T5
    form (and BART's) wraps every attention."""
    from autopelt.delta.modules.prefix import (DebertaPrefixAttention, ModernBertPrefixAttention,
                                               MPNetPrefixAttention, PositionShift, PrefixEncoder, PrefixSelfAttention)

    if at.arch.causal:
        return _build_cache_prefix(at, cfg)
    if getattr(at.config, "is_encoder_decoder", False):
        return _build_t5_cache_prefix(at, cfg) if cfg.shift_positions else _build_encoder_decoder_prefix(at, cfg)
    entries = at.arch.layer_entries(at.model)
    rows = chosen_layers(cfg.layers, len(entries))
    hidden = at.config.hidden_size
    encoder = PrefixEncoder(len(rows), cfg.length, hidden, cfg.reparam_hidden, at.generator)
    form = at.arch.prefix_attention
    own = {"mpnet": MPNetPrefixAttention, "deberta": DebertaPrefixAttention,  # a family's own attention
           "modernbert": ModernBertPrefixAttention}.get(form)
    for row, i in enumerate(rows):
        gate = at.gate(hidden, 2 if cfg.split_gate else 1, "prefix", i) if cfg.gate else None
        layer, stack = entries[i]
        if own is not None:
            at.replace(layer, stack.self_attention, lambda base: own(base, encoder, row, gate))
            continue
        linears = tuple(stack.linears[role].removeprefix(stack.self_attention + ".")
                        for role in ("query", "key", "value"))
        at.replace(layer, stack.self_attention,
                   lambda base: PrefixSelfAttention(base, encoder, row, gate, linears, tail=form))
    if cfg.shift_positions:
        embeddings = at.arch.backbone_of(at.model).get_submodule(at.arch.embeddings)
        embeddings.register_forward_pre_hook(PositionShift(cfg.length), with_kwargs=True)


def _build_cache_prefix(at, cfg: PrefixConfig) -> None:
    from autopelt.delta.modules.decoder import CachePrefix, LayerGates, PrefixHidden
    from autopelt.delta.modules.prefix import PrefixEncoder

    heads, head_dim = key_width(at.config)
    entries = at.arch.layer_entries(at.model)
    layers = chosen_layers(cfg.layers, len(entries))
    encoder = PrefixEncoder(len(layers), cfg.length, heads * head_dim, cfg.reparam_hidden, at.generator)
    backbone = at.arch.backbone_of(at.model)
    device = next(backbone.parameters()).device
    backbone.add_module("prefix_encoder", encoder.to(device))
    gates = LayerGates(len(layers), 2 if cfg.split_gate else 1, layers) if cfg.gate else None
    if gates is not None:
        backbone.add_module("prefix_gates", gates.to(device))
    hook = CachePrefix(encoder, heads, head_dim, cfg.shift_positions, layers, len(entries), gates)
    backbone.register_forward_pre_hook(hook, with_kwargs=True)
    for i, (layer, stack) in enumerate(entries):
        if i not in layers:
            at.replace(layer, stack.self_attention, lambda base: PrefixHidden(base, cfg.length))


def encoder_decoder_width(config) -> int:
    """How wide one attention's keys are in an encoder-decoder: T5's heads x d_kv (not always d_model), BART's
    d_model."""
    return config.num_heads * config.d_kv if hasattr(config, "d_kv") else config.hidden_size


def _build_encoder_decoder_prefix(at, cfg: PrefixConfig) -> None:
    """A row of prefix keys and values for each chosen layer's attentions: the encoder's self-attention, the decoder's
    self-attention and cross-attention (AdapterHub's T5 prefix-tuning; BART's the same way)."""
    from autopelt.delta.modules.decoder import LayerGates
    from autopelt.delta.modules.prefix import BartPrefixAttention, PrefixEncoder, T5PrefixAttention

    config = at.config
    wrapper = {"t5": T5PrefixAttention, "bart": BartPrefixAttention}[at.arch.prefix_attention]
    entries = at.arch.layer_entries(at.model)
    sites = [(i, path) for i in chosen_layers(cfg.layers, len(entries)) for path in entries[i][1].attentions]
    encoder = PrefixEncoder(len(sites), cfg.length, encoder_decoder_width(config), cfg.reparam_hidden, at.generator)
    gates = LayerGates(len(sites), 2 if cfg.split_gate else 1, [i for i, _ in sites]) if cfg.gate else None
    if gates is not None:
        at.model.add_module("prefix_gates", gates.to(next(at.model.parameters()).device))
    for row, (i, path) in enumerate(sites):
        at.replace(entries[i][0], path, lambda base: wrapper(base, encoder, row, gates))


def _build_t5_cache_prefix(at, cfg: PrefixConfig) -> None:
    """peft's T5 prefix: the decoder's self-attention alone, through its cache."""
    from autopelt.delta.modules.decoder import LayerGates, T5CachePrefix
    from autopelt.delta.modules.prefix import PrefixEncoder

    config, model = at.config, at.model
    layers, start = int(config.num_decoder_layers), int(config.num_layers)
    encoder = PrefixEncoder(layers, cfg.length, config.num_heads * config.d_kv, cfg.reparam_hidden, at.generator)
    device = next(model.parameters()).device
    model.add_module("prefix_encoder", encoder.to(device))
    gates = None
    if cfg.gate:
        gates = LayerGates(layers, 2 if cfg.split_gate else 1, list(range(start, start + layers))).to(device)
        model.add_module("prefix_gates", gates)
    hook = T5CachePrefix(encoder, config.num_heads, config.d_kv, gates)
    model.get_decoder().register_forward_pre_hook(hook, with_kwargs=True)


def count(cfg: PrefixConfig, shape) -> tuple[int, int]:
    """2·L keys and values per row (a layer; on T5 an attention), a gate per row (an encoder's reads hidden + 1);
    the MLP trains but is not stored."""
    config, arch = shape.config, shape.arch
    rows = len(chosen_layers(cfg.layers, arch.num_layers(config)))
    width = config.hidden_size
    gates = rows * (width + 1) * (2 if cfg.split_gate else 1) if cfg.gate else 0
    if arch.causal:  # keys and values of one layer are as wide as its key projection's output
        heads, head_dim = key_width(config)
        width = heads * head_dim
        gates = rows * (2 if cfg.split_gate else 1) if cfg.gate else 0  # one value per layer
    elif getattr(config, "is_encoder_decoder", False):  # T5: a row per attention, as wide as its keys (peft's
        # form: the decoder's self-attentions alone)
        rows = config.num_decoder_layers if cfg.shift_positions else arch.attention_rows(config, cfg.layers)
        width = encoder_decoder_width(config)
        gates = rows * (2 if cfg.split_gate else 1) if cfg.gate else 0  # one value per row
    stored = rows * 2 * cfg.length * width + gates
    r = cfg.reparam_hidden
    if r == 0:
        return stored, stored
    mlp = cfg.length * width + (width * r + r) + (r * rows * 2 * width + rows * 2 * width)
    return mlp + gates, stored


def refuses(cfg: PrefixConfig, arch) -> str | None:
    if cfg.shift_positions and arch.family == "t5" and cfg.layers:
        return "peft's T5 prefix (prefix.shift_positions) fills every decoder layer's cache; leave prefix.layers out"
    if cfg.shift_positions and arch.prefix_attention == "bart":
        return "prefix.shift_positions (peft's form) is built for T5 alone among encoder-decoders; leave it out"
    if cfg.shift_positions and arch.prefix_attention not in ("bert", "t5"):
        return (f"{arch.family}'s embeddings take no past length, so prefix.shift_positions cannot move its positions "
                f"(peft's prefix-tuning, which needs it, cannot hold a {arch.family} either); leave it out")
    return None


def stored(cfg: PrefixConfig) -> PrefixConfig:
    """The prefix matrices themselves, without the MLP."""
    return dataclasses.replace(cfg, reparam_hidden=0)


def peft(cfg: PrefixConfig, target):
    """peft's prefix-tuning without projection, holding the saved form."""
    import peft

    config, sizes = target.config, {}
    if getattr(config, "is_encoder_decoder", False):  # peft would read the encoder's depth and d_model
        sizes = dict(num_layers=config.num_decoder_layers, num_attention_heads=config.num_heads,
                     token_dim=config.num_heads * config.d_kv)
    return peft.PrefixTuningConfig(num_virtual_tokens=cfg.length, prefix_projection=False, **sizes, **target.task)


def peft_tensors(model) -> dict:
    """The prefix as peft's embedding: per virtual token, each layer's key then value."""
    from autopelt.delta.modules.prefix import PrefixEncoder

    encoder = next(m for m in model.modules() if isinstance(m, PrefixEncoder))
    prefix = encoder.stored_state()["prefix"].detach().to("cpu")  # (layers, 2, L, H)
    return {PEFT_EMBEDDING: prefix.permute(2, 0, 1, 3).reshape(prefix.shape[2], -1)}  # (L, layers·2·H)


def peft_refuses(cfg: PrefixConfig, arch) -> str | None:
    if arch is not None and arch.prefix_attention not in ("bert", "t5"):
        return (f"peft's prefix-tuning moves the real tokens' positions (prefix.shift_positions), which autopelt's "
                f"{arch.family} prefix cannot")
    if arch is not None and len(arch.stacks) == 2 and not cfg.shift_positions:
        return ("peft's prefix-tuning on T5 reaches only the decoder's self-attention, this one (AdapterHub's) also "
                "the encoder's and the cross-attention (train with prefix.shift_positions: true for peft's)")
    if cfg.layers is not None:
        return "peft's prefix-tuning covers every layer"
    if not cfg.shift_positions:
        return ("peft's prefix-tuning moves the real tokens to positions L..L+T-1, this prefix kept them at 0..T-1 "
                "(train with prefix.shift_positions: true to export to peft)")
    return None


def checkpointing_refusal(config: PrefixConfig, model_config, arch) -> str | None:
    """A decoder's prefix (and T5's in peft's form, `shift_positions`) travels in the key/value cache, which
    transformers drops when checkpointing."""
    if arch.causal or (getattr(model_config, "is_encoder_decoder", False) and config.shift_positions):
        return (f"--gradient-checkpointing: a {model_config.model_type} prefix travels in the key/value cache, "
                "which transformers drops when checkpointing; train the prefix without it")
    return None


METHOD = register(Method(PrefixConfig, build, count, order=50, refuses=refuses, stored=stored, peft=peft,
                         peft_refuses=peft_refuses, peft_tensors=peft_tensors,
                         checkpointing_refusal=checkpointing_refusal,
                         gate_row=1,  # UniPELT's order of its gates: adapter, prefix, LoRA
                         unpackable="its keys and values join the attention's, inside the attention module"))

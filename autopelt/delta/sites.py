"""Where a delta attaches, declared once per architecture family.

Everything else in the delta library finds modules through an `Architecture`: adding a family (say
DeBERTa) is one more entry here, not a change to any method.

A family has one stack of layers (BERT, Llama, GPT-2) or two (T5: encoder then decoder). Layers are numbered
across stacks, the encoder's first; a site a stack lacks (T5's cross-attention in the encoder) is skipped there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from autopelt.errors import UserError

if TYPE_CHECKING:  # torch stays unloaded until a model is built: a method's file reads sites to count
    from torch import nn


@dataclass(frozen=True)
class Stack:
    """One stack of identical transformer layers."""

    layers: str  # path from the backbone to the ModuleList of layers
    linears: dict[str, str]  # site name -> path of an nn.Linear (or GPT-2's Conv1D) inside one layer
    self_attention: str  # path of the self-attention module inside a layer
    # Post-norm (BERT) sublayer output is LayerNorm(dropout(dense(x)) + residual); pre-norm (Llama, GPT-2, T5) it is
    # residual + dropout(dense(LayerNorm(x))). `dropouts` is the module whose output an adapter reads, per sublayer:
    dropouts: dict[str, str]
    layernorms: dict[str, str]  # sublayer site -> path of its LayerNorm inside one layer
    size: str = "num_hidden_layers"  # the config attribute holding how many layers the stack has
    cross_attention: str | None = None  # path of a decoder layer's attention over the encoder's output
    causal: bool = False  # an encoder-decoder's decoder stack: each token reads only the ones before it

    @property
    def attentions(self) -> tuple[str, ...]:
        """Paths of the layer's attention modules, self-attention first: where a prefix goes."""
        return (self.self_attention,) + ((self.cross_attention,) if self.cross_attention else ())


@dataclass(frozen=True)
class Architecture:
    family: str
    backbone: str  # path from the top model to the module holding the stacks ("" for the top model itself)
    stacks: tuple[Stack, ...]
    embeddings: str | None  # path from the backbone of the embeddings module (it turns positions into vectors)
    embeddings_layernorm: str | None  # path from the backbone; BitFit's `embeddings` bias
    pooler: str | None  # path from the backbone of the pooler's dense layer, None when the model has no pooler
    head: str  # attribute of the top model: the task head (trainable with every delta)
    head_hidden_layer: bool  # RoBERTa's head has a dense H x H layer before the output projection
    shapes: Callable[[object], dict[str, tuple[int, int]]]  # config -> {site: (in_features, out_features)}
    head_bias: bool = True
    pre_norm: bool = False
    causal: bool = False  # a decoder: the head reads the last real token; prefixes go through the key/value cache
    aliases: dict[str, str] = field(default_factory=dict)  # a site name -> the site that holds it (GPT-2's fused qkv)
    no_bias: str | None = None  # why BitFit cannot apply, when the family has no bias terms
    unsupported: dict[str, str] = field(default_factory=dict)  # method -> why it cannot apply here
    classifier_backbone: str | None = None  # the backbone's path in the sequence classifier, where it differs

    # The first stack, as the encoder families read it
    @property
    def layers(self) -> str:
        return self.stacks[0].layers

    @property
    def linears(self) -> dict[str, str]:
        return self.stacks[0].linears

    @property
    def reads_one_token(self) -> bool:
        """The classifier reads one token's state (a decoder's last, T5's decoder's last </s>): no mean pooling."""
        return self.causal or len(self.stacks) == 2

    def backbone_of(self, model: nn.Module) -> nn.Module:
        classifier = self.classifier_backbone is not None and hasattr(model, self.head)
        return model.get_submodule(self.classifier_backbone if classifier else self.backbone)

    def layer_entries(self, model: nn.Module) -> list[tuple[nn.Module, Stack]]:
        """Every layer of every stack, in the order of their indices, with the stack it belongs to."""
        backbone = self.backbone_of(model)
        return [(layer, stack) for stack in self.stacks for layer in backbone.get_submodule(stack.layers)]

    def layer_modules(self, model: nn.Module) -> list[nn.Module]:
        return [layer for layer, _ in self.layer_entries(model)]

    def num_layers(self, config) -> int:
        return sum(int(getattr(config, stack.size)) for stack in self.stacks)

    def sites(self, targets) -> list[str]:
        """The sites `targets` name on this family (aliases resolved, each once); a one-line error for a site no
        stack has."""
        known = {site for stack in self.stacks for site in stack.linears}
        resolved = []
        for site in targets:
            site = self.aliases.get(site, site)
            if site not in known:
                raise UserError(f"{self.family} has no linear site {site!r}; its sites: {', '.join(sorted(known))}")
            if site not in resolved:
                resolved.append(site)
        return resolved

    def site_layers(self, config, site: str, layers) -> list[int]:
        """The chosen layer indices whose stack has `site`."""
        indices, start = [], 0
        chosen = set(chosen_layers(layers, self.num_layers(config)))
        for stack in self.stacks:
            size = int(getattr(config, stack.size))
            if site in stack.linears:
                indices += [i for i in range(start, start + size) if i in chosen]
            start += size
        return indices

    def attention_rows(self, config, layers) -> int:
        """How many attention modules the chosen layers hold (T5's decoder layers: two each): a prefix's rows."""
        rows, start, chosen = 0, 0, set(chosen_layers(layers, self.num_layers(config)))
        for stack in self.stacks:
            size = int(getattr(config, stack.size))
            rows += len(stack.attentions) * len(chosen & set(range(start, start + size)))
            start += size
        return rows

    def head_params(self, hidden: int, num_labels: int, regression: bool = False) -> int:
        """The task head's parameters; a regression's output layer always has a bias (a head without one is given
        one at the labels' mean: train/backbone.py's center_regression_head)."""
        extra = hidden * hidden + hidden if self.head_hidden_layer else 0
        return extra + hidden * num_labels + (num_labels if self.head_bias or regression else 0)


def _encoder_shapes(config) -> dict[str, tuple[int, int]]:
    hidden, inner = config.hidden_size, config.intermediate_size
    square = {site: (hidden, hidden) for site in ("query", "key", "value", "attention_output")}
    return {**square, "intermediate": (hidden, inner), "output": (inner, hidden)}


_BERT_STACK = Stack(
    layers="encoder.layer",
    linears={
        "query": "attention.self.query",
        "key": "attention.self.key",
        "value": "attention.self.value",
        "attention_output": "attention.output.dense",
        "intermediate": "intermediate.dense",
        "output": "output.dense",
    },
    self_attention="attention.self",
    dropouts={"attention_output": "attention.output.dropout", "output": "output.dropout"},
    layernorms={"attention_output": "attention.output.LayerNorm", "output": "output.LayerNorm"},
)
_BERT_LIKE = dict(stacks=(_BERT_STACK,), embeddings="embeddings", embeddings_layernorm="embeddings.LayerNorm",
                  head="classifier", shapes=_encoder_shapes)


def _llama_shapes(config) -> dict[str, tuple[int, int]]:
    hidden, inner = config.hidden_size, config.intermediate_size
    head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    queries, keys = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim  # GQA: fewer keys
    return {"query": (hidden, queries), "key": (hidden, keys), "value": (hidden, keys),
            "attention_output": (queries, hidden), "gate": (hidden, inner), "intermediate": (hidden, inner),
            "output": (inner, hidden)}


# Llama and the families that share its layer (Qwen2/3, Mistral): RMSNorm before each sublayer, rotary positions,
# grouped-query attention, a gated FFN down(act(gate(x)) * up(x)); no dropout modules, no biases (Qwen2's q,k,v
# have some, BitFit is refused all the same).
_LLAMA_STACK = Stack(
    layers="layers",
    linears={"query": "self_attn.q_proj", "key": "self_attn.k_proj", "value": "self_attn.v_proj",
             "attention_output": "self_attn.o_proj", "gate": "mlp.gate_proj", "intermediate": "mlp.up_proj",
             "output": "mlp.down_proj"},
    self_attention="self_attn",
    dropouts={"attention_output": "self_attn.o_proj", "output": "mlp.down_proj"},
    layernorms={"attention_output": "input_layernorm", "output": "post_attention_layernorm"},
)
_LLAMA_LIKE = dict(backbone="model", stacks=(_LLAMA_STACK,), embeddings=None, embeddings_layernorm=None, pooler=None,
                   head="score", head_hidden_layer=False, head_bias=False, shapes=_llama_shapes, pre_norm=True,
                   causal=True, no_bias="it has no bias terms")


def _gpt2_shapes(config) -> dict[str, tuple[int, int]]:
    hidden = config.hidden_size
    inner = config.n_inner or 4 * hidden
    return {"qkv": (hidden, 3 * hidden), "attention_output": (hidden, hidden), "intermediate": (hidden, inner),
            "output": (inner, hidden)}


# GPT-2: LayerNorm before each sublayer; query, key and value are one fused Conv1D (weight in x out), so a delta on
# any of them is a delta on `qkv` (peft's default GPT-2 target, c_attn).
_GPT2_STACK = Stack(
    layers="h",
    linears={"qkv": "attn.c_attn", "attention_output": "attn.c_proj", "intermediate": "mlp.c_fc",
             "output": "mlp.c_proj"},
    self_attention="attn",
    dropouts={"attention_output": "attn.resid_dropout", "output": "mlp.dropout"},
    layernorms={"attention_output": "ln_1", "output": "ln_2"},
)


def _t5_shapes(config) -> dict[str, tuple[int, int]]:
    hidden, inner, ff = config.d_model, config.num_heads * config.d_kv, config.d_ff
    attention = {"query": (hidden, inner), "key": (hidden, inner), "value": (hidden, inner),
                 "attention_output": (inner, hidden)}
    cross = {f"cross_{site}": shape for site, shape in attention.items()}
    gate = {"gate": (hidden, ff)} if getattr(config, "is_gated_act", False) else {}
    return {**attention, **cross, **gate, "intermediate": (hidden, ff), "output": (ff, hidden)}


def _t5_stack(layers: str, ffn: int, size: str, cross: bool, gated: bool) -> Stack:
    attention = {"query": "q", "key": "k", "value": "v", "attention_output": "o"}
    linears = {site: f"layer.0.SelfAttention.{name}" for site, name in attention.items()}
    if cross:
        linears.update({f"cross_{site}": f"layer.1.EncDecAttention.{name}" for site, name in attention.items()})
    ffn_path = f"layer.{ffn}.DenseReluDense"
    if gated:  # wo(act(wi_0·x) * wi_1·x): the same roles as Llama's gate, up and down projections
        linears.update({"gate": f"{ffn_path}.wi_0", "intermediate": f"{ffn_path}.wi_1"})
    else:
        linears["intermediate"] = f"{ffn_path}.wi"
    linears["output"] = f"{ffn_path}.wo"
    return Stack(layers=layers, linears=linears, self_attention="layer.0.SelfAttention",
                 dropouts={"attention_output": "layer.0.dropout", "output": f"layer.{ffn}.dropout"},
                 layernorms={"attention_output": "layer.0.layer_norm", "output": f"layer.{ffn}.layer_norm"}, size=size,
                 cross_attention="layer.1.EncDecAttention" if cross else None, causal=cross)


def _t5(gated: bool) -> Architecture:
    """T5: the encoder's layers, then the decoder's, whose layers add cross-attention (`cross_*` sites). v1.0 has a
    ReLU FFN (wi, wo); v1.1, Flan-T5 and mT5 a gated one (wi_0, wi_1, wo: `gate`, `intermediate`, `output`).
    T5ForConditionalGeneration holds both stacks itself (its LM head never trains); T5ForSequenceClassification
    holds them in `transformer` and reads the decoder's state at the last <eos> through a dense layer and an output
    projection, both with biases."""
    return Architecture(
        family="t5", backbone="", stacks=(_t5_stack("encoder.block", 1, "num_layers", False, gated),
                                          _t5_stack("decoder.block", 2, "num_decoder_layers", True, gated)),
        embeddings=None, embeddings_layernorm=None, pooler=None, head="classification_head", head_hidden_layer=True,
        head_bias=True, shapes=_t5_shapes, pre_norm=True, no_bias="it has no bias terms",
        classifier_backbone="transformer")


_T5_GATED = _t5(gated=True)  # chosen by the config's `is_gated_act`, under the same model type

ARCHITECTURES = {  # RoBERTa's sequence classifier has no pooler: its head holds the dense layer
    "bert": Architecture(family="bert", backbone="bert", head_hidden_layer=False, pooler="pooler.dense",
                         **_BERT_LIKE),
    "roberta": Architecture(family="roberta", backbone="roberta", head_hidden_layer=True, pooler=None, **_BERT_LIKE),
    "xlm-roberta": Architecture(family="xlm-roberta", backbone="roberta", head_hidden_layer=True, pooler=None,
                                **_BERT_LIKE),
    **{family: Architecture(family=family, **_LLAMA_LIKE) for family in ("llama", "mistral", "qwen2", "qwen3")},
    "gpt2": Architecture(family="gpt2", backbone="transformer", stacks=(_GPT2_STACK,), embeddings=None,
                         embeddings_layernorm="ln_f", pooler=None, head="score", head_hidden_layer=False,
                         head_bias=False, shapes=_gpt2_shapes, pre_norm=True, causal=True,
                         aliases={"query": "qkv", "key": "qkv", "value": "qkv"}),
    "t5": _t5(gated=False),
    "mt5": _t5(gated=True),
}


def architecture_of(config) -> Architecture:
    """The declared sites of a transformers config's family; a one-line error for any other family."""
    model_type = getattr(config, "model_type", None)
    arch = ARCHITECTURES.get(model_type)
    if arch is None:
        raise UserError(
            f"model type {model_type!r} is not supported yet; supported: "
            f"{', '.join(sorted(ARCHITECTURES))} (add an entry to autopelt/delta/sites.py)"
        )
    if model_type == "t5" and getattr(config, "is_gated_act", False):
        return _T5_GATED
    return arch


def linear_shape(config, site: str) -> tuple[int, int]:
    """(in_features, out_features) of a linear site, from the config alone (an alias gives its site's shape)."""
    arch = architecture_of(config)
    return arch.shapes(config)[arch.aliases.get(site, site)]


def linears_of(config, arch: Architecture, targets, layers) -> list[tuple[str, int, int, int]]:
    """(site, in_features, out_features, how many of the chosen layers have it) for each site `targets` name on
    this family: what a method on linear layers counts."""
    return [(site, *linear_shape(config, site), len(arch.site_layers(config, site, layers)))
            for site in arch.sites(targets)]


def chosen_layers(layers, num_layers: int) -> list[int]:
    """The layer indices a method applies to; a one-line error for an index the model does not have."""
    if layers is None:
        return list(range(num_layers))
    bad = [i for i in layers if not 0 <= i < num_layers]
    if bad:
        raise UserError(f"layer {bad[0]} does not exist: the model has layers 0..{num_layers - 1}")
    return sorted(set(layers))


def model_class(config, lm: bool):
    """The transformers auto class of a sequence classifier, or with `lm` of the family's language model."""
    import transformers

    if not lm:
        return transformers.AutoModelForSequenceClassification
    if getattr(config, "is_encoder_decoder", False):
        return transformers.AutoModelForSeq2SeqLM
    return transformers.AutoModelForCausalLM

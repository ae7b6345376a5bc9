"""The declared families: where each method's sites are in every architecture autopelt knows by name.

One `Architecture` per model type (several model types share one where their layers are the same: Llama's serves
Mistral and Qwen). A site is a role (query, key, value, attention_output, gate, intermediate, output; `qkv` where a
family fuses them), so a delta written for one family means the same on every other. Module paths were read from
transformers 5's modeling files; each family is trained by every method that applies in tests/test_families.py,
and docs/families.md is generated from these declarations (scripts/families_table.py).
"""

from __future__ import annotations

import dataclasses

from autopelt.delta.sites import Architecture, Stack
from autopelt.errors import UserError


def _encoder_shapes(config) -> dict[str, tuple[int, int]]:
    hidden = config.hidden_size
    inner = config.hidden_dim if config.model_type == "distilbert" else config.intermediate_size
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


# BERT's layer under other names: the same post-norm sublayers, LayerNorm(dropout(dense(x)) + residual)
_ELECTRA_STACK = _BERT_STACK  # ELECTRA's discriminator layer is BERT's
_DEBERTA_STACK = Stack(  # DeBERTa-v2/v3: BERT's layer with disentangled attention (query_proj, key_proj, value_proj)
    layers="encoder.layer",
    linears={**_BERT_STACK.linears, "query": "attention.self.query_proj", "key": "attention.self.key_proj",
             "value": "attention.self.value_proj"},
    self_attention="attention.self", dropouts=_BERT_STACK.dropouts, layernorms=_BERT_STACK.layernorms,
)
_MPNET_STACK = Stack(  # MPNet: q, k, v, o inside `attention.attn`, then dropout and LayerNorm in `attention`
    layers="encoder.layer",
    linears={"query": "attention.attn.q", "key": "attention.attn.k", "value": "attention.attn.v",
             "attention_output": "attention.attn.o", "intermediate": "intermediate.dense", "output": "output.dense"},
    self_attention="attention.attn",
    dropouts={"attention_output": "attention.dropout", "output": "output.dropout"},
    layernorms={"attention_output": "attention.LayerNorm", "output": "output.LayerNorm"},
)
_DISTILBERT_STACK = Stack(  # DistilBERT: no dropout after the attention's out_lin (an adapter reads out_lin itself)
    layers="transformer.layer",
    linears={"query": "attention.q_lin", "key": "attention.k_lin", "value": "attention.v_lin",
             "attention_output": "attention.out_lin", "intermediate": "ffn.lin1", "output": "ffn.lin2"},
    self_attention="attention",
    dropouts={"attention_output": "attention.out_lin", "output": "ffn.dropout"},
    layernorms={"attention_output": "sa_layer_norm", "output": "output_layer_norm"},
    size="n_layers",
)
# ALBERT shares one group of layers across its depth (num_hidden_groups = 1 and inner_group_num = 1 in every released
# checkpoint): the stack is that group's layers, so a delta on one is shared across the depth as the layer is
_ALBERT_STACK = Stack(
    layers="encoder.albert_layer_groups.0.albert_layers",
    linears={"query": "attention.query", "key": "attention.key", "value": "attention.value",
             "attention_output": "attention.dense", "intermediate": "ffn", "output": "ffn_output"},
    self_attention="attention",
    dropouts={"attention_output": "attention.output_dropout", "output": "ffn_output"},
    layernorms={"attention_output": "attention.LayerNorm", "output": "full_layer_layer_norm"},
    size="inner_group_num",
)


def _fused_encoder_shapes(config) -> dict[str, tuple[int, int]]:
    """ModernBERT: query, key and value in one Wqkv; the FFN's Wi holds the GLU's input and gate halves."""
    hidden, inner = config.hidden_size, config.intermediate_size
    return {"qkv": (hidden, 3 * hidden), "attention_output": (hidden, hidden), "intermediate": (hidden, 2 * inner),
            "output": (inner, hidden)}


# ModernBERT: pre-norm (the first layer's attention norm is an identity), rotary positions, alternating global and
# local attention, a GLU FFN whose Wi is fused; no biases in released checkpoints
_MODERNBERT_STACK = Stack(
    layers="layers",
    linears={"qkv": "attn.Wqkv", "attention_output": "attn.Wo", "intermediate": "mlp.Wi", "output": "mlp.Wo"},
    self_attention="attn",
    dropouts={"attention_output": "attn.out_drop", "output": "mlp.Wo"},
    layernorms={"attention_output": "attn_norm", "output": "mlp_norm"},
)


def _modernbert_head(config) -> int:
    """ModernBERT's head before the classifier: a dense layer and a LayerNorm, biases as the config says."""
    hidden = config.hidden_size
    return hidden * hidden + hidden * bool(config.classifier_bias) + hidden * (1 + bool(config.norm_bias))


def _phi3_shapes(config) -> dict[str, tuple[int, int]]:
    """Phi-3: query, key and value in one qkv_proj (grouped-query: fewer key/value heads); gate and up in one
    gate_up_proj."""
    hidden, inner = config.hidden_size, config.intermediate_size
    head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    queries, keys = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
    return {"qkv": (hidden, queries + 2 * keys), "attention_output": (queries, hidden),
            "intermediate": (hidden, 2 * inner), "output": (inner, hidden)}


_PHI3_STACK = Stack(
    layers="layers",
    linears={"qkv": "self_attn.qkv_proj", "attention_output": "self_attn.o_proj", "intermediate": "mlp.gate_up_proj",
             "output": "mlp.down_proj"},
    self_attention="self_attn",
    dropouts={"attention_output": "resid_attn_dropout", "output": "resid_mlp_dropout"},
    layernorms={"attention_output": "input_layernorm", "output": "post_attention_layernorm"},
)
# Gemma 2 and 3: Llama's layer with a norm after each sublayer too (residual + norm(f(norm(x)))): an adapter reads
# the sublayer's normalised output, the one that joins the residual
_GEMMA2_STACK = Stack(
    layers="layers", linears=_LLAMA_STACK.linears, self_attention="self_attn",
    dropouts={"attention_output": "post_attention_layernorm", "output": "post_feedforward_layernorm"},
    layernorms={"attention_output": "input_layernorm", "output": "pre_feedforward_layernorm"},
)
# OLMo 2: the norm after each sublayer only (residual + norm(f(x)))
_OLMO2_STACK = dataclasses.replace(_GEMMA2_STACK, layernorms=dict(_GEMMA2_STACK.dropouts))
_FUSED_QKV = {"query": "qkv", "key": "qkv", "value": "qkv"}
_ENCODER = dict(embeddings="embeddings", embeddings_layernorm="embeddings.LayerNorm", head="classifier",
                shapes=_encoder_shapes)


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
        classifier_backbone="transformer", prefix_attention="t5")


_T5_GATED = _t5(gated=True)  # chosen by the config's `is_gated_act`, under the same model type


def _bart_shapes(config) -> dict[str, tuple[int, int]]:
    hidden, ffn = config.d_model, config.encoder_ffn_dim
    attention = {site: (hidden, hidden) for site in ("query", "key", "value", "attention_output")}
    cross = {f"cross_{site}": shape for site, shape in attention.items()}
    return {**attention, **cross, "intermediate": (hidden, ffn), "output": (ffn, hidden)}


def _bart_stack(layers: str, size: str, cross: bool) -> Stack:
    """BART's post-norm layer, LayerNorm(x + dropout(f(x))), its dropouts functional: an adapter reads the sublayer's
    output projection itself (out_proj, fc2), as on DistilBERT."""
    attention = {"query": "q_proj", "key": "k_proj", "value": "v_proj", "attention_output": "out_proj"}
    linears = {site: f"self_attn.{name}" for site, name in attention.items()}
    if cross:
        linears.update({f"cross_{site}": f"encoder_attn.{name}" for site, name in attention.items()})
    linears.update({"intermediate": "fc1", "output": "fc2"})
    return Stack(layers=layers, linears=linears, self_attention="self_attn",
                 dropouts={"attention_output": "self_attn.out_proj", "output": "fc2"},
                 layernorms={"attention_output": "self_attn_layer_norm", "output": "final_layer_norm"}, size=size,
                 cross_attention="encoder_attn" if cross else None, causal=cross)


# BART: the encoder's layers, then the decoder's (with cross-attention, `cross_*` sites), as T5's; learned absolute
# positions; the sequence classifier reads the decoder's state at the last </s> through a dense layer and a projection
_BART = Architecture(
    family="bart", backbone="model", stacks=(_bart_stack("encoder.layers", "encoder_layers", False),
                                             _bart_stack("decoder.layers", "decoder_layers", True)),
    embeddings=None, embeddings_layernorm="encoder.layernorm_embedding", pooler=None, head="classification_head",
    head_hidden_layer=True, shapes=_bart_shapes, prefix_attention="bart")


ARCHITECTURES = {  # RoBERTa's sequence classifier has no pooler: its head holds the dense layer
    "bert": Architecture(family="bert", backbone="bert", head_hidden_layer=False, pooler="pooler.dense",
                         **_BERT_LIKE),
    "roberta": Architecture(family="roberta", backbone="roberta", head_hidden_layer=True, pooler=None, **_BERT_LIKE),
    "xlm-roberta": Architecture(family="xlm-roberta", backbone="roberta", head_hidden_layer=True, pooler=None,
                                **_BERT_LIKE),
    "electra": Architecture(family="electra", backbone="electra", stacks=(_ELECTRA_STACK,), pooler=None,
                            head_hidden_layer=True, input_width="embedding_size",
                            embeddings_norm_width="embedding_size", **_ENCODER),
    # DeBERTa's classifier reads its ContextPooler (dense, dropout, activation) over the first token
    "deberta-v2": Architecture(family="deberta-v2", backbone="deberta", stacks=(_DEBERTA_STACK,), pooler=None,
                               head_hidden_layer=True, head_modules=("pooler",), input_width="embedding_size",
                               prefix_attention="deberta", **_ENCODER),
    "mpnet": Architecture(family="mpnet", backbone="mpnet", stacks=(_MPNET_STACK,), pooler=None,
                          head_hidden_layer=True, prefix_attention="mpnet", **_ENCODER),
    "distilbert": Architecture(family="distilbert", backbone="distilbert", stacks=(_DISTILBERT_STACK,), pooler=None,
                               head_hidden_layer=True, head_modules=("pre_classifier",),
                               prefix_attention="distilbert", **_ENCODER),
    # ALBERT's pooler (dense + tanh, pretrained) stays frozen in the backbone: its classifier reads the pooled vector
    "albert": Architecture(family="albert", backbone="albert", stacks=(_ALBERT_STACK,), pooler=None,
                           head_hidden_layer=False, input_width="embedding_size",
                           embeddings_norm_width="embedding_size", prefix_attention="albert", **_ENCODER),
    "modernbert": Architecture(family="modernbert", backbone="model", stacks=(_MODERNBERT_STACK,),
                               embeddings="embeddings", embeddings_layernorm=None, pooler=None, head="classifier",
                               head_hidden_layer=False, head_modules=("head",), head_extra=_modernbert_head,
                               shapes=_fused_encoder_shapes, pre_norm=True, aliases=_FUSED_QKV,
                               no_bias="its checkpoints have no bias terms", prefix_attention="modernbert"),
    **{family: Architecture(family=family, **_LLAMA_LIKE)
       for family in ("llama", "mistral", "qwen2", "qwen3", "gemma")},
    **{family: Architecture(family=family, **{**_LLAMA_LIKE, "stacks": (_GEMMA2_STACK,)})
       for family in ("gemma2", "gemma3_text")},
    "olmo2": Architecture(family="olmo2", **{**_LLAMA_LIKE, "stacks": (_OLMO2_STACK,)}),
    "phi3": Architecture(family="phi3", **{**_LLAMA_LIKE, "stacks": (_PHI3_STACK,), "shapes": _phi3_shapes,
                                           "aliases": {**_FUSED_QKV, "gate": "intermediate"}}),
    "gpt2": Architecture(family="gpt2", backbone="transformer", stacks=(_GPT2_STACK,), embeddings=None,
                         embeddings_layernorm="ln_f", pooler=None, head="score", head_hidden_layer=False,
                         head_bias=False, shapes=_gpt2_shapes, pre_norm=True, causal=True,
                         aliases={"query": "qkv", "key": "qkv", "value": "qkv"}),
    "t5": _t5(gated=False),
    "mt5": _t5(gated=True),
    "bart": _BART,
}


def declared(config) -> Architecture:
    """The declared family of a config whose model type ARCHITECTURES holds (T5 v1.1 by its `is_gated_act`); a
    one-line error for a shape of it the declaration does not cover."""
    model_type = config.model_type
    if model_type == "t5" and getattr(config, "is_gated_act", False):
        return _T5_GATED
    if model_type == "bart" and config.encoder_ffn_dim != config.decoder_ffn_dim:
        raise UserError(f"a BART whose encoder and decoder FFNs differ ({config.encoder_ffn_dim}, "
                        f"{config.decoder_ffn_dim}) is not supported: autopelt declares one FFN width")
    if model_type == "albert" and config.num_hidden_groups != 1:
        raise UserError(f"an ALBERT with {config.num_hidden_groups} layer groups is not supported: autopelt declares "
                        "the one group of shared layers every released ALBERT has")
    return ARCHITECTURES[model_type]


def architecture_of(config) -> Architecture:
    """The declared sites of a transformers config's family (families.py); for a model type declared nowhere, what
    its structure shows (discover.py), or a one-line error when it shows no layers of linears."""
    model_type = getattr(config, "model_type", None)
    if model_type in ARCHITECTURES:
        return declared(config)
    from autopelt.delta.discover import discovered

    return discovered(config)


def linear_shape(config, site: str) -> tuple[int, int]:
    """(in_features, out_features) of a linear site, from the config alone (an alias gives its site's shape)."""
    arch = architecture_of(config)
    return arch.shapes(config)[arch.aliases.get(site, site)]


def linears_of(config, arch: Architecture, targets, layers) -> list[tuple[str, int, int, int]]:
    """(site, in_features, out_features, how many of the chosen layers have it) for each site `targets` name on
    this family: what a method on linear layers counts."""
    return [(site, *linear_shape(config, site), len(arch.site_layers(config, site, layers)))
            for site in arch.sites(targets)]

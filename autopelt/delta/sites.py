"""Where a delta attaches, declared once per architecture family.

Everything else in the delta library finds modules through an `Architecture`: adding a family (say
DeBERTa) is one more entry here, not a change to any method.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from autopelt.errors import UserError


@dataclass(frozen=True)
class Architecture:
    family: str
    backbone: str  # attribute of the *ForSequenceClassification model holding the encoder
    layers: str  # path from the backbone to the ModuleList of transformer layers
    linears: dict[str, str]  # site name -> path of an nn.Linear inside one layer
    self_attention: str  # path of the self-attention module (query/key/value + attention call) in a layer
    # A sublayer's output (site "attention_output" or "output") is LayerNorm(dropout(dense(x)) + residual):
    dropouts: dict[str, str]  # sublayer site -> path of its dropout inside one layer
    layernorms: dict[str, str]  # sublayer site -> path of its LayerNorm inside one layer
    embeddings: str  # path from the backbone of the embeddings module (it turns positions into vectors)
    embeddings_layernorm: str  # path from the backbone
    pooler: str | None  # path from the backbone of the pooler's dense layer, None when the model has no pooler
    head: str  # attribute of the top model: the task head (trainable with every delta)
    head_hidden_layer: bool  # RoBERTa's head has a dense H x H layer before the output projection

    def backbone_of(self, model: nn.Module) -> nn.Module:
        return getattr(model, self.backbone)

    def layer_modules(self, model: nn.Module) -> nn.ModuleList:
        return self.backbone_of(model).get_submodule(self.layers)

    def head_params(self, hidden: int, num_labels: int) -> int:
        extra = hidden * hidden + hidden if self.head_hidden_layer else 0
        return extra + hidden * num_labels + num_labels


_BERT_LIKE = dict(
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
    embeddings="embeddings",
    embeddings_layernorm="embeddings.LayerNorm",
    head="classifier",
)

ARCHITECTURES = {  # RoBERTa's sequence classifier has no pooler: its head holds the dense layer
    "bert": Architecture(family="bert", backbone="bert", head_hidden_layer=False, pooler="pooler.dense",
                         **_BERT_LIKE),
    "roberta": Architecture(family="roberta", backbone="roberta", head_hidden_layer=True, pooler=None, **_BERT_LIKE),
    "xlm-roberta": Architecture(family="xlm-roberta", backbone="roberta", head_hidden_layer=True, pooler=None,
                                **_BERT_LIKE),
}


def architecture_of(config) -> Architecture:
    """The declared sites of a transformers config's family; a one-line error for any other family."""
    arch = ARCHITECTURES.get(getattr(config, "model_type", None))
    if arch is None:
        raise UserError(
            f"model type {getattr(config, 'model_type', None)!r} is not supported yet; supported: "
            f"{', '.join(sorted(ARCHITECTURES))} (add an entry to autopelt/delta/sites.py)"
        )
    return arch


def linear_shape(config, site: str) -> tuple[int, int]:
    """(in_features, out_features) of a linear site, from the config alone."""
    hidden, inner = config.hidden_size, config.intermediate_size
    return {"intermediate": (hidden, inner), "output": (inner, hidden)}.get(site, (hidden, hidden))


def chosen_layers(layers, num_layers: int) -> list[int]:
    """The layer indices a method applies to; a one-line error for an index the model does not have."""
    if layers is None:
        return list(range(num_layers))
    bad = [i for i in layers if not 0 <= i < num_layers]
    if bad:
        raise UserError(f"layer {bad[0]} does not exist: the model has layers 0..{num_layers - 1}")
    return sorted(set(layers))

"""Where a delta attaches: an `Architecture` per family, and how a model's family is found.

Everything else in the delta library finds modules through an `Architecture`: adding a family is one more entry
in `autopelt/delta/families.py`, not a change to any method. A model type declared nowhere is read by structure
(`autopelt/delta/discover.py`, as peft's `all-linear`): its linear sites only, so the methods that need a declared
sublayer (adapters, prefix, prompt) are refused on it.

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
    head: str  # attribute of the top model: the task head's output projection (trainable with every delta)
    head_hidden_layer: bool  # RoBERTa's head has a dense H x H layer before the output projection
    shapes: Callable[[object], dict[str, tuple[int, int]]]  # config -> {site: (in_features, out_features)}
    head_bias: bool = True
    pre_norm: bool = False
    causal: bool = False  # a decoder: the head reads the last real token; prefixes go through the key/value cache
    aliases: dict[str, str] = field(default_factory=dict)  # a site name -> the site that holds it (GPT-2's fused qkv)
    no_bias: str | None = None  # why BitFit cannot apply, when the family has no bias terms
    unsupported: dict[str, str] = field(default_factory=dict)  # method -> why it cannot apply here
    classifier_backbone: str | None = None  # the backbone's path in the sequence classifier, where it differs
    # Modules of the top model that belong to the task head before `head` (DeBERTa's pooler, DistilBERT's
    # pre_classifier, ModernBERT's head): trainable, fresh from the trial's seed and saved with it
    head_modules: tuple[str, ...] = ()
    head_extra: Callable[[object], int] | None = None  # config -> parameters of `head_modules` (head_hidden_layer's
    # H x H + H where None)
    input_width: str = "hidden_size"  # the config attribute of the input embeddings' width (ALBERT's, ELECTRA's
    # embedding_size): a soft prompt's
    embeddings_norm_width: str = "hidden_size"  # the config attribute of `embeddings_layernorm`'s width
    found: str | None = None  # a family read by structure (discover.py): what was found, in one line
    # How the encoder prefix wraps a stack's self-attention (modules/prefix.py): "bert" (query, key and value linears
    # into transformers' attention function), "distilbert" and "albert" (the same, then what their module holds
    # after it: TAILS), or a family's own: "mpnet" (q, k, v, o and a relative position bias), "deberta" (DeBERTa-v2/v3's
    # disentangled attention), "modernbert" (fused, rotary, windowed); an encoder-decoder's every attention: "t5",
    # "bart"
    prefix_attention: str = "bert"

    @property
    def head_parts(self) -> tuple[str, ...]:
        """Every module of the task head, in the order the sentence goes through them, `head` last."""
        return (*self.head_modules, self.head)

    def width(self, config, attribute: str) -> int:
        """A width the config holds (`input_width`, `embeddings_norm_width`), the hidden size where it holds none."""
        return int(getattr(config, attribute, None) or config.hidden_size)

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

    def head_params(self, config, num_labels: int, regression: bool = False) -> int:
        """The task head's parameters; a regression's output layer always has a bias (a head without one is given
        one at the labels' mean: train/backbone.py's center_regression_head)."""
        hidden = config.hidden_size
        extra = hidden * hidden + hidden if self.head_hidden_layer else 0
        if self.head_extra is not None:
            extra = self.head_extra(config)
        return extra + hidden * num_labels + (num_labels if self.head_bias or regression else 0)


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

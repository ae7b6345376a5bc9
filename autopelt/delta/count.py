"""Trainable and stored parameter counts from a spec and a model config alone, before anything is built.

The search uses these to reject over-budget samples without spending compute. `stored` is what a saved
delta holds (prefix without its MLP, AdaMix experts merged): the size a user deploys, and what budgets use.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass

from autopelt.delta.inject import check_fits, key_width
from autopelt.delta.sites import architecture_of, chosen_layers, linear_shape
from autopelt.delta.spec import (
    BIAS_SITES, AdaMixConfig, AdapterConfig, BitFitConfig, IA3Config, LoRAConfig, PrefixConfig, PromptConfig,
    VeRAConfig, parse_spec,
)


@dataclass(frozen=True)
class ParamCount:
    trainable: int  # what the optimiser updates, task head included
    stored: int  # what a saved delta holds, task head included
    base: int  # the base model with its task head

    @property
    def trainable_pct(self) -> float:
        return 100.0 * self.trainable / self.base

    @property
    def stored_pct(self) -> float:
        return 100.0 * self.stored / self.base

    def to_dict(self) -> dict:
        return {"trainable": self.trainable, "stored": self.stored, "base": self.base,
                "trainable_pct": self.trainable_pct, "stored_pct": self.stored_pct}


def count_parameters(spec, config, num_labels: int | None = None, lm: bool = False) -> ParamCount:
    """Count a spec's parameters on a model described by `config` (a transformers config): a sequence classifier
    with its task head, or with `lm` the language model (its LM head frozen, part of the base)."""
    spec = parse_spec(spec)
    num_labels = num_labels or config.num_labels
    arch = architecture_of(config)
    check_fits(spec, config)
    head = 0 if lm else arch.head_params(config.hidden_size, num_labels)
    trainable = stored = head
    for method in spec.methods:
        if isinstance(method, BitFitConfig) and spec.pooling == "mean":  # the pooler is skipped: its bias is not trained
            method = dataclasses.replace(method, pooler=False)
        t, s = _count(method, config, arch)
        trainable, stored = trainable + t, stored + s
    return ParamCount(trainable, stored, base_parameters(config, num_labels, lm))


def _count(method, config, arch, experts: int = 1, share_up: bool = True) -> tuple[int, int]:
    if isinstance(method, AdaMixConfig):
        return _count(method.delta, config, arch, method.experts, method.share_up)
    layers = len(chosen_layers(getattr(method, "layers", None), arch.num_layers(config)))
    hidden = config.hidden_size
    if isinstance(method, (LoRAConfig, VeRAConfig, IA3Config)):
        t = s = 0
        for site in arch.sites(method.targets):  # a site counts in the chosen layers whose stack has it
            times = len(arch.site_layers(config, site, method.layers))
            site_t, site_s = _per_site(method, *linear_shape(config, site), site, experts, share_up)
            t, s = t + site_t * times, s + site_s * times
        return t, s
    if isinstance(method, AdapterConfig):
        per_layer = 2 if method.placement == "houlsby" else 1
        down_t, down_s = _projection(method, hidden, method.bottleneck, experts)
        up_t, up_s = _projection(method, method.bottleneck, hidden, 1 if share_up else experts)
        gate = (hidden + 1) if method.gate else 0
        shared_rule = method.n ** 3 if method.projection == "compacter" else 0
        count = lambda down, up: (down + up + gate) * per_layer * layers + shared_rule  # noqa: E731
        return count(down_t, up_t), count(down_s, up_s)
    if isinstance(method, PrefixConfig):
        gates = layers * (hidden + 1) * (2 if method.split_gate else 1) if method.gate else 0
        if arch.causal:  # keys and values of one layer are as wide as its key projection's output
            heads, head_dim = key_width(config)
            hidden = heads * head_dim
            gates = layers * (2 if method.split_gate else 1) if method.gate else 0  # one value per layer
        elif getattr(config, "is_encoder_decoder", False):  # T5: a row per attention, as wide as its keys (peft's
            # form: the decoder's self-attentions alone)
            layers = config.num_decoder_layers if method.shift_positions else arch.attention_rows(config, method.layers)
            hidden = config.num_heads * config.d_kv
            gates = layers * (2 if method.split_gate else 1) if method.gate else 0  # one value per row
        stored = layers * 2 * method.length * hidden + gates
        r = method.reparam_hidden
        if r == 0:
            return stored, stored
        mlp = method.length * hidden + (hidden * r + r) + (r * layers * 2 * hidden + layers * 2 * hidden)
        return mlp + gates, stored
    if isinstance(method, PromptConfig):
        return method.length * hidden, method.length * hidden
    if isinstance(method, BitFitConfig):
        n = _bitfit(method.targets or BIAS_SITES, config, arch, method.layers)
        n += hidden if method.pooler and arch.pooler is not None else 0
        return n, n
    raise TypeError(method)


def _per_site(method, in_f: int, out_f: int, site: str, experts: int, share_up: bool) -> tuple[int, int]:
    """(trainable, stored) of a LoRA, VeRA or (IA)³ on one linear of one layer."""
    if isinstance(method, LoRAConfig):
        extra = (in_f + 1 if method.gate else 0) + (out_f if method.dora else 0)  # gate; DoRA's magnitude
        trainable = method.rank * (in_f * experts + out_f * (1 if share_up else experts)) + extra
        return trainable, method.rank * (in_f + out_f) + extra
    if isinstance(method, VeRAConfig):  # b and d; the shared A and B are regenerated from the seed
        n = method.rank + out_f + (in_f + 1 if method.gate else 0)
        return n, n
    n = in_f if site == "output" else out_f  # (IA)³: the output's size, the input's on the FFN output layer
    return n, n


def _projection(method: AdapterConfig, in_f: int, out_f: int, experts: int) -> tuple[int, int]:
    """(trainable, stored) of one adapter projection, bias included; a shared Compacter rule is counted once
    by the caller."""
    if method.projection == "dense":
        one = in_f * out_f + out_f
        return one * experts, one
    if method.projection == "phm":  # Zhang et al.: k·d/n + n³ per projection
        one = in_f * out_f // method.n + method.n ** 3 + out_f
    else:  # Compacter: B_i = s_i t_i^T of rank r: r·(k + d) per projection
        one = method.phm_rank * (in_f + out_f) + out_f
    return one, one


def _bitfit(targets, config, arch, layers) -> int:
    sites = [site for site in arch.sites([t for t in targets if t not in ("layernorm", "embeddings")])]
    n = sum(linear_shape(config, site)[1] * len(arch.site_layers(config, site, layers)) for site in sites)
    if "layernorm" in targets:
        n += 2 * config.hidden_size * len(chosen_layers(layers, arch.num_layers(config)))
    return n + (config.hidden_size if "embeddings" in targets and arch.embeddings_layernorm else 0)


def base_parameters(config, num_labels: int, lm: bool = False) -> int:
    """Parameters of the base model with its task head (with `lm`: the language model), counted on a bodiless
    (meta-device) build."""
    payload = config.to_dict()
    payload["num_labels"] = num_labels
    payload.pop("id2label", None), payload.pop("label2id", None)
    return _base_parameters(json.dumps(payload, sort_keys=True, default=str), type(config), lm)


@functools.lru_cache(maxsize=32)
def _base_parameters(config_json: str, config_class, lm: bool = False) -> int:
    import torch

    from autopelt.delta.sites import model_class

    config = config_class.from_dict(json.loads(config_json))
    with torch.device("meta"):
        model = model_class(config, lm).from_config(config)
    return sum(p.numel() for p in model.parameters())

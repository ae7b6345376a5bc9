"""BitFit (Ben Zaken et al. 2021): train bias terms only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from autopelt.delta.config import BIAS_SITES, MethodConfig
from autopelt.delta.fields import BOOL, LAYER_INDICES, declare, site_list
from autopelt.delta.registry import Method, method_of, register
from autopelt.delta.sites import chosen_layers
from autopelt.delta.families import linear_shape
from autopelt.errors import UserError


@dataclass(frozen=True)
class BitFitConfig(MethodConfig):
    method: ClassVar[str] = "bitfit"
    summary: ClassVar[str] = "train bias terms only (Ben Zaken et al. 2021)"

    targets: tuple[str, ...] | None = declare(f"bias groups among {', '.join(BIAS_SITES)}; null = every bias", None,
                                              site_list(BIAS_SITES, nullable=True))
    # not drawn by search spaces: a space's shared `layers` has never restricted BitFit
    layers: tuple[int, ...] | None = declare("layer indices whose biases train; null = all", None, LAYER_INDICES,
                                             search=False)
    pooler: bool = declare("also train the pooler's bias (BERT; RoBERTa's head has none), as BitFit's code always "
                           "does; not under mean pooling, which skips the pooler", True, BOOL)

    def describe(self) -> str:
        targets = None if self.targets is None else ",".join(self.targets)
        if not self.pooler:
            targets = f"{targets or 'all'},no pooler"
        return "bitfit" if targets is None else f"bitfit({targets})"


def build(at, cfg: BitFitConfig) -> None:
    """Unfreeze the chosen biases; nothing is added (the pooler's is frozen again under mean pooling)."""
    entries = at.arch.layer_entries(at.model)
    backbone = at.arch.backbone_of(at.model)
    targets = cfg.targets or BIAS_SITES
    sites = {at.arch.aliases.get(t, t) for t in targets}
    for i in chosen_layers(cfg.layers, len(entries)):
        layer, stack = entries[i]
        paths = [stack.linears[t] for t in sorted(sites) if t in stack.linears]
        paths += list(stack.layernorms.values()) if "layernorm" in targets else []
        for path in paths:
            layer.get_submodule(path).bias.requires_grad_(True)
    if "embeddings" in targets and at.arch.embeddings_layernorm is not None:
        backbone.get_submodule(at.arch.embeddings_layernorm).bias.requires_grad_(True)
    if cfg.pooler and at.arch.pooler is not None:
        backbone.get_submodule(at.arch.pooler).bias.requires_grad_(True)


def count(cfg: BitFitConfig, shape) -> tuple[int, int]:
    """Each chosen linear's output size, two per LayerNorm, the embeddings' LayerNorm, the pooler's (not under
    mean pooling, which skips the pooler)."""
    config, arch = shape.config, shape.arch
    targets = cfg.targets or BIAS_SITES
    sites = arch.sites([t for t in targets if t not in ("layernorm", "embeddings")])
    n = sum(linear_shape(config, site)[1] * len(arch.site_layers(config, site, cfg.layers)) for site in sites)
    if "layernorm" in targets:
        n += 2 * config.hidden_size * len(chosen_layers(cfg.layers, arch.num_layers(config)))
    if "embeddings" in targets and arch.embeddings_layernorm:
        n += arch.width(config, arch.embeddings_norm_width)
    if cfg.pooler and arch.pooler is not None and shape.pooling != "mean":
        n += config.hidden_size
    return n, n


def refuses(cfg: BitFitConfig, arch) -> str | None:
    return arch.no_bias


def peft_beside(cfg: BitFitConfig, other: MethodConfig) -> str:
    """peft's `bias` setting beside `other`: every bias ("all"), those of its adapted layers ("lora_only",
    "vera_only"); a UserError for any other subset, or beside a method whose peft form trains no biases."""
    if not method_of(other).peft_bias:
        raise UserError(f"this delta's {cfg.describe()} has no peft form: peft's {other.method} trains no biases "
                        "(modules_to_save would train whole layers)")
    every_site = cfg.targets is None or set(cfg.targets) == set(BIAS_SITES)
    if every_site and cfg.layers is None and cfg.pooler:
        return "all"
    if set(cfg.targets or BIAS_SITES) == set(other.targets) and cfg.layers == other.layers and not cfg.pooler:
        return f"{other.method}_only"
    raise UserError(f"this delta's {cfg.describe()} has no peft form: peft trains every bias (bitfit with "
                    f"targets and layers null, pooler true), those of the {other.method} layers (bitfit with the "
                    f"{other.method}'s targets and layers, pooler false) or none")


METHOD = register(Method(BitFitConfig, build, count, order=0, refuses=refuses, peft_beside=peft_beside,
                         peft="peft has no BitFit of its own (its biases can go beside a LoRA or VeRA)",
                         soup="average"))

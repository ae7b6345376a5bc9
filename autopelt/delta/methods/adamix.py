"""AdaMix (Wang et al. 2022): a mixture of M adapter or LoRA experts, one random expert per step, averaged into one
module for inference. A wrapper: it builds, counts and saves its delta as that delta's own entry does, under a
`Mixture` of experts."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from autopelt.delta.config import MethodConfig, require
from autopelt.delta.fields import BOOL, NESTED_DELTA, NON_NEGATIVE_NUMBER, POSITIVE_INT, declare, one_of
from autopelt.delta.methods.adapter import AdapterConfig
from autopelt.delta.methods.lora import LoRAConfig
from autopelt.delta.registry import Method, Mixture, method_of, normalise_method, parse_method, register
from autopelt.errors import UserError

EXPERT_INITS = ("copy", "independent")
# What an adapter inside AdaMix is when its fields are left out: the reference's expert soup (one per layer on the
# FFN output, GELU, adapter size 48; microsoft/AdaMix expert_soup.py and bert_base_mnli_expert_soup.sh).
ADAMIX_ADAPTER = {"method": "adapter", "placement": "ffn", "bottleneck": 48, "activation": "gelu"}


@dataclass(frozen=True)
class AdaMixConfig(MethodConfig):
    method: ClassVar[str] = "adamix"
    summary: ClassVar[str] = ("mixture of M adapter or LoRA experts, one random expert per step, "
                              "averaged into one module for inference (Wang et al. 2022)")
    mixes: ClassVar[tuple[str, ...]] = ("adapter", "lora")
    # AdaMix averages its experts into one module: it mixes ungated dense deltas only, and no DoRA (a magnitude
    # normalises one weight, not an average of experts)
    experts_leave: ClassVar[tuple[str, ...]] = ("gate", "projection", "n", "phm_rank", "dora")

    experts: int = declare("experts M per site", 4, POSITIVE_INT)
    share_up: bool = declare("share the up-projection (LoRA: B) across experts, as in the paper", True, BOOL)
    consistency: float = declare("weight of the symmetric-KL consistency loss between two stochastic passes "
                                 "(each side's target detached, task loss on the first pass, as AdaMix's code)", 1.0,
                                 NON_NEGATIVE_NUMBER)
    expert_init: str = declare("copy: every expert starts as a copy of one draw, as AdaMix's code; independent: one "
                               "draw per expert", "copy", one_of(*EXPERT_INITS))
    delta: AdapterConfig | LoRAConfig = declare("the mixed delta: an adapter or lora entry; an adapter's fields left "
                                                "out are AdaMix's (placement ffn, gelu, bottleneck 48)",
                                                AdapterConfig(placement="ffn", bottleneck=48, activation="gelu"),
                                                NESTED_DELTA)

    @classmethod
    def from_dict(cls, data: dict) -> MethodConfig:
        data = dict(data)
        inner = data.pop("delta", ADAMIX_ADAPTER)
        if isinstance(inner, MethodConfig):
            inner = inner.to_dict()
        if not isinstance(inner, dict) or normalise_method(inner.get("method")) not in cls.mixes:
            raise UserError("adamix.delta must be an adapter or lora entry, e.g. {\"method\": \"adapter\"}")
        if inner.get("method") == "adapter":
            inner = {**ADAMIX_ADAPTER, **inner}
        data["delta"] = parse_method(inner)
        return super().from_dict(data)

    def check(self) -> None:
        require(self, "delta", not self.delta.gate, "an ungated delta (AdaMix and UniPELT gates do not mix)")
        require(self, "delta", not getattr(self.delta, "dora", False),
                "a LoRA without dora (a magnitude normalises one weight, not an average of experts)")
        if isinstance(self.delta, AdapterConfig):
            require(self, "delta", self.delta.projection == "dense", "a dense adapter (PHM weights do not average)")

    def describe(self) -> str:
        init = "" if self.expert_init == "copy" else ", independent"
        return f"adamix M{self.experts}[{self.delta.describe()}{init}]"

    @property
    def mixture(self) -> Mixture:
        return Mixture(self.experts, self.share_up, self.expert_init == "copy")


def build(at, cfg: AdaMixConfig) -> None:
    """The delta's own build, each of its projections `experts` times."""
    method_of(cfg.delta).build(at.mixed(cfg.mixture), cfg.delta)


def count(cfg: AdaMixConfig, shape) -> tuple[int, int]:
    """The delta's own count under the mixture: every expert trains, one (their average) is stored."""
    return method_of(cfg.delta).count(cfg.delta, dataclasses.replace(shape, mixture=cfg.mixture))


def stored(cfg: AdaMixConfig) -> MethodConfig:
    """The experts averaged: the delta itself."""
    return method_of(cfg.delta).stored(cfg.delta)


METHOD = register(Method(AdaMixConfig, build, count, wraps=lambda cfg: cfg.delta, stored=stored,
                         extra_loss=lambda cfg: cfg.consistency,
                         unpackable="its experts are drawn per pass and its loss takes two passes"))

"""The fixed design of configurations the meta-dataset trains on every task.

A configuration is a whole trial recipe: a delta spec, an absolute learning rate, a batch size and the backbone's
dropout. Every method family appears at a size near its paper's default and at a second size or place, each at two
rates about 3x apart (the pair that brackets each family's best rate on this budget, K=1,000 and 3 epochs; see
docs/portfolio.md), then combinations with and without UniPELT's gates, fewer layers, half the batch and the first
token instead of the mean. Names are stable: the meta-dataset and every portfolio refer to configurations by name.
`DESIGN_VERSION` changes whenever a configuration's meaning does.
"""

from __future__ import annotations

from autopelt.portfolio.config import Config, rate_text

_QV, _QKVO, _QV_FFN = ["query", "value"], ["query", "key", "value", "attention_output"], \
    ["query", "value", "intermediate", "output"]
LORA = {"method": "lora", "rank": 8, "alpha": 16, "targets": _QV}
PFEIFFER = {"method": "adapter", "placement": "pfeiffer", "bottleneck": 48}
HOULSBY = {"method": "adapter", "placement": "houlsby", "bottleneck": 16}
PREFIX = {"method": "prefix", "length": 10}
BITFIT = {"method": "bitfit"}
IA3 = {"method": "ia3", "targets": ["key", "value", "output"]}


def _gated(entry: dict) -> dict:
    return {**entry, "gate": True}


def _rates(name: str, methods: list[dict], rates: tuple[float, ...], **extra) -> list[Config]:
    return [Config(f"{name}@{rate_text(rate)}", tuple(methods), rate, **extra) for rate in rates]


def _design() -> tuple[Config, ...]:
    configs = [
        # LoRA family
        *_rates("lora-r8-qv", [LORA], (1e-3, 3e-3)),
        *_rates("lora-r8-qv-ffn", [{**LORA, "targets": _QV_FFN}], (1e-3, 3e-3)),
        *_rates("lora-r16-qkvo", [{**LORA, "rank": 16, "targets": _QKVO}], (1e-3, 3e-3)),
        *_rates("lora-r2-qv", [{**LORA, "rank": 2}], (3e-3, 1e-2)),
        *_rates("lora-r64-qv", [{**LORA, "rank": 64, "alpha": 32}], (1e-3,)),
        *_rates("rslora-r16-qv", [{**LORA, "rank": 16, "rslora": True}], (1e-3, 3e-3)),
        *_rates("dora-r8-qv", [{**LORA, "dora": True}], (3e-3,)),
        *_rates("vera-r256-qv", [{"method": "vera", "rank": 256, "targets": _QV}], (1e-2, 3e-2)),
        *_rates("ia3-kv-ffn", [IA3], (1e-2, 3e-2)),
        *_rates("bitfit", [BITFIT], (3e-3, 1e-2)),
        # adapters and their compact projections
        *_rates("pfeiffer-48", [PFEIFFER], (1e-3, 3e-3)),
        *_rates("pfeiffer-256", [{**PFEIFFER, "bottleneck": 256}], (3e-4, 1e-3)),
        *_rates("houlsby-16", [HOULSBY], (1e-3, 3e-3)),
        *_rates("compacter++-n4", [{**PFEIFFER, "projection": "compacter", "n": 4}], (3e-3, 1e-2)),
        *_rates("compacter-n4", [{**HOULSBY, "bottleneck": 48, "projection": "compacter", "n": 4}], (3e-3,)),
        *_rates("phm-pfeiffer-64-n4", [{**PFEIFFER, "bottleneck": 64, "projection": "phm", "n": 4}], (3e-3,)),
        *_rates("adamix-4x48", [{"method": "adamix", "experts": 4, "share_up": True, "consistency": 1.0,
                                 "expert_init": "copy", "delta": {"method": "adapter", "placement": "ffn",
                                                                  "bottleneck": 48, "activation": "gelu"}}],
                (3e-3,)),
        # prompts in the input and the attention
        *_rates("prefix-10", [PREFIX], (1e-3, 3e-3)),
        *_rates("prefix-32", [{**PREFIX, "length": 32}], (1e-3,)),
        *_rates("prompt-20", [{"method": "prompt", "length": 20}], (1e-2, 3e-2)),
        # UniPELT and other combinations, gated and not
        *_rates("unipelt-apl", [_gated(PFEIFFER), _gated(PREFIX), _gated(LORA)], (1e-3, 3e-3)),
        *_rates("unipelt-ap", [_gated(PFEIFFER), _gated(PREFIX)], (1e-3,)),
        *_rates("apl-nogate", [PFEIFFER, PREFIX, LORA], (1e-3,)),
        *_rates("lora+pfeiffer", [LORA, PFEIFFER], (1e-3, 3e-3)),
        *_rates("lora+pfeiffer-gated", [_gated(LORA), _gated(PFEIFFER)], (3e-3,)),
        *_rates("lora+bitfit", [LORA, BITFIT], (3e-3,)),
        *_rates("lora-ffn+ia3", [{**LORA, "targets": _QV_FFN}, IA3], (3e-3,)),
        *_rates("ia3+bitfit", [IA3, BITFIT], (1e-2,)),
        *_rates("lora+prefix-gated", [_gated(LORA), _gated(PREFIX)], (3e-3,)),
        # fewer layers, half the batch, the first token
        *_rates("lora-r8-qv-upper", [LORA], (3e-3,), layers="upper_half"),
        *_rates("pfeiffer-48-upper", [PFEIFFER], (3e-3,), layers="upper_half"),
        *_rates("lora-r8-qv-b16", [LORA], (2e-3,), batch_size=16),
        *_rates("lora-r8-qv-ffn-b16", [{**LORA, "targets": _QV_FFN}], (2e-3,), batch_size=16),
        *_rates("pfeiffer-48-b16", [PFEIFFER], (1e-3,), batch_size=16),
        *_rates("unipelt-apl-b16", [_gated(PFEIFFER), _gated(PREFIX), _gated(LORA)], (1e-3,), batch_size=16),
        *_rates("lora-r8-qv-cls", [LORA], (3e-3,), pooling="cls"),
        *_rates("pfeiffer-48-cls", [PFEIFFER], (1e-3,), pooling="cls"),
        *_rates("unipelt-apl-cls", [_gated(PFEIFFER), _gated(PREFIX), _gated(LORA)], (1e-3,), pooling="cls"),
    ]
    return tuple(configs)


DESIGN_V1: tuple[Config, ...] = _design()
HEAD_SCALE = 10.0  # the head-rate variants' scale: a 77-way head led at rates 3-10x the delta's (docs/portfolio.md)


def with_head_scale(config: Config, scale: float = HEAD_SCALE) -> Config:
    from dataclasses import replace
    return replace(config, name=f"{config.name}~head{scale:g}", head_lr_scale=scale)


def _design_v2() -> tuple[Config, ...]:
    """Version 2, collected on 21 tasks of every kind: the v1 portfolio's members (what worked on 12 tasks), the
    LoRA ladder at the sweep's half-decades (so tuned LoRA is simulated as the live sweep runs it), UniPELT(APL)'s
    two rates (the baseline), the families that led on a 77-class task at high rates, and the first members with
    the classifier head at 10x the delta's rate (a many-class head needs more learning than the delta)."""
    v1 = {config.name: config for config in DESIGN_V1}
    ladder = _rates("lora-r8-qv", [LORA], (1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2))
    names = ("lora-r8-qv-ffn-b16@2e-3", "dora-r8-qv@3e-3", "lora-ffn+ia3@3e-3", "lora-r16-qkvo@3e-3",
             "pfeiffer-256@1e-3", "lora-r8-qv-ffn@3e-3", "lora+pfeiffer@3e-3", "lora-r8-qv-b16@2e-3",
             "unipelt-apl-b16@1e-3", "rslora-r16-qv@3e-3", "pfeiffer-48@3e-3", "houlsby-16@3e-3",
             "unipelt-apl@1e-3", "unipelt-apl@3e-3", "prefix-10@3e-3",
             "ia3-kv-ffn@1e-2", "vera-r256-qv@3e-2", "compacter++-n4@1e-2")
    heads = [with_head_scale(v1[name]) for name in
             ("lora-r8-qv-ffn-b16@2e-3", "dora-r8-qv@3e-3", "pfeiffer-256@1e-3", "lora-ffn+ia3@3e-3")]
    return (*(v1[name] for name in names), *ladder, *heads)


DESIGN: tuple[Config, ...] = _design_v2()
DESIGN_VERSION = 2
BY_NAME = {config.name: config for config in (*DESIGN_V1, *DESIGN)}

# The dropout study: three methods, each at its design rate, with the backbone's dropout off.
DROPOUT_STUDY = ("lora-r8-qv@3e-3", "unipelt-apl@1e-3", "pfeiffer-48@1e-3")


def with_dropout(config: Config, backbone_dropout: str) -> Config:
    from dataclasses import replace
    if backbone_dropout == config.backbone_dropout:
        return config
    return replace(config, name=f"{config.name}~dropout-{backbone_dropout}", backbone_dropout=backbone_dropout)


def config_named(name: str) -> Config:
    """A configuration of either design by name, with a `~dropout-X` variant of any of them."""
    from autopelt.errors import UserError
    if name in BY_NAME:
        return BY_NAME[name]
    base, _, dropout = name.partition("~dropout-")
    if base not in BY_NAME or not dropout:
        raise UserError(f"unknown design configuration {name!r}; `python -m metalearning design` lists them")
    return with_dropout(BY_NAME[base], dropout)

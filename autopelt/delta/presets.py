"""Whole-delta presets at the papers' defaults: UniPELT (He/Mao et al. 2022) and single methods."""

from __future__ import annotations

_ADAPTER = {"method": "adapter", "placement": "pfeiffer", "bottleneck": 48}
_PREFIX = {"method": "prefix", "length": 10}
_LORA = {"method": "lora", "rank": 8, "alpha": 16, "targets": ["query", "value"]}
_EXPERT_SOUP = {"method": "adapter", "placement": "ffn", "bottleneck": 48, "activation": "gelu"}  # AdaMix's


def _gated(entry: dict) -> dict:
    return {**entry, "gate": True}


PRESETS: dict[str, dict] = {
    # UniPELT: adapter + prefix (+ LoRA) under learned per-layer gates, and the ungated ablations
    "unipelt_apl": {"methods": [_gated(_ADAPTER), _gated(_PREFIX), _gated(_LORA)]},
    "unipelt_ap": {"methods": [_gated(_ADAPTER), _gated(_PREFIX)]},
    "unipelt_apl_nogate": {"methods": [_ADAPTER, _PREFIX, _LORA]},
    "unipelt_ap_nogate": {"methods": [_ADAPTER, _PREFIX]},
    # single methods at their papers' defaults
    "adapter": {"methods": [_ADAPTER]},
    "houlsby": {"methods": [{"method": "houlsby", "bottleneck": 48}]},
    "prefix": {"methods": [_PREFIX]},
    "lora": {"methods": [_LORA]},
    "compacter": {"methods": [{"method": "compacter", "n": 4, "bottleneck": 48}]},
    "compacter++": {"methods": [{"method": "compacter++", "n": 4, "bottleneck": 48}]},
    "bitfit": {"methods": [{"method": "bitfit"}]},
    "prompt": {"methods": [{"method": "prompt", "length": 20}]},
    "adamix": {"methods": [{"method": "adamix", "experts": 4, "share_up": True, "consistency": 1.0,
                            "expert_init": "copy", "delta": _EXPERT_SOUP}]},
    # (IA)³ on keys, values and the FFN's inner activation, as T-Few
    "ia3": {"methods": [{"method": "ia3", "targets": ["key", "value", "output"]}]},
    # DoRA and rsLoRA at LoRA's setting, as their papers compare them with LoRA
    "dora": {"methods": [{**_LORA, "dora": True}]},
    "rslora": {"methods": [{**_LORA, "rslora": True}]},
    # VeRA's GLUE setting for base-size encoders: rank 1024 on query and value, d starting at 0.1
    "vera": {"methods": [{"method": "vera", "rank": 1024, "targets": ["query", "value"], "d_initial": 0.1}]},
}

# The baselines every study runs beside its search.
BASELINES = ("unipelt_apl", "lora", "adapter", "bitfit", "prefix", "compacter")  # first ones first on a small budget

# The learning rates each method's paper used for base-size encoders on GLUE with 10-20 epochs of full data
# (adapters and UniPELT ~1e-4..5e-4, LoRA 5e-4 and DoRA/rsLoRA at LoRA's, Compacter 3e-3, BitFit 1e-3, prompt
# tuning 3e-2, VeRA 4e-3; (IA)³ 3e-3 as T-Few). For reference only: at other budgets and models many of them do not
# learn, so baselines and `autopelt train` choose their rate by a sweep (autopelt/train/lr_sweep.py).
# Why: docs/learning-rates.md.
PAPER_LEARNING_RATES = {
    "unipelt_apl": 5e-4,
    "unipelt_ap": 5e-4,
    "adapter": 1e-4,
    "houlsby": 1e-4,
    "prefix": 2e-4,
    "lora": 5e-4,
    "compacter": 3e-3,
    "compacter++": 3e-3,
    "bitfit": 1e-3,
    "prompt": 3e-2,
    "adamix": 4e-4,
    "ia3": 3e-3,
    "dora": 5e-4,
    "rslora": 5e-4,
    "vera": 4e-3,
}

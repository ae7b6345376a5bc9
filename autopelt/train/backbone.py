"""How the frozen backbone computes: its dropout and its attention implementation, both recorded settings.

Backbone dropout (`TrialSettings.backbone_dropout`):
- `model`: the pretrained model's own dropout, as its config says (what the LoRA and UniPELT papers train with);
- `attention-off`: no dropout on the attention probabilities, the rest as the config says;
- `off`: no dropout anywhere in the pretrained model (decoder LLMs such as Llama ship so).
A delta's own dropout (LoRA's `dropout`, AdaMix's) is never touched: it is set after this runs.
Which default autopelt uses, and what turning dropout off costs in quality and saves in time, is measured in
docs/speed.md.

Attention implementation (`TrialSettings.attention`): `sdpa` (transformers' default) or `eager`, set on the
loaded model with transformers' public `set_attn_implementation`.
"""

from __future__ import annotations

from torch import nn

from autopelt.errors import UserError

BACKBONE_DROPOUTS = ("model", "attention-off", "off")
ATTENTIONS = ("sdpa", "eager")
_ATTENTION_DROPOUTS = ("dropout", "attn_dropout", "attention_dropout")  # BERT/T5, GPT-2, Llama


def set_backbone_dropout(model: nn.Module, mode: str) -> int:
    """Turn the pretrained model's dropout off as `mode` says; returns how many dropouts were set to 0.

    Call it before a delta is injected, so the delta's own dropout keeps its rate.
    """
    if mode not in BACKBONE_DROPOUTS:
        raise UserError(f"backbone dropout must be one of {', '.join(BACKBONE_DROPOUTS)}, not {mode!r}")
    if mode == "model":
        return 0
    changed = 0
    for module in model.modules():
        if type(module).__name__.endswith("Attention"):
            changed += _zero_attention_dropout(module)
        if mode == "off" and isinstance(module, nn.Dropout) and module.p:
            module.p = 0.0
            changed += 1
    return changed


def _zero_attention_dropout(module: nn.Module) -> int:
    """The attention-probability dropout of one attention module: an nn.Dropout child or a float rate."""
    changed = 0
    for name in _ATTENTION_DROPOUTS:
        value = getattr(module, name, None)
        if isinstance(value, nn.Dropout) and value.p:
            value.p = 0.0
            changed += 1
        elif isinstance(value, float) and value:
            setattr(module, name, 0.0)
            changed += 1
    return changed


def set_attention(model, implementation: str) -> None:
    """Compute attention with `implementation` ("sdpa" or "eager")."""
    if implementation not in ATTENTIONS:
        raise UserError(f"attention must be one of {', '.join(ATTENTIONS)}, not {implementation!r}")
    if getattr(model.config, "_attn_implementation", None) != implementation:
        model.set_attn_implementation(implementation)

"""How the frozen backbone computes: its dropout and its attention implementation, both recorded settings.

Backbone dropout (`TrialSettings.backbone_dropout`):
- `model`: the pretrained model's own dropout, as its config says (what the LoRA and UniPELT papers train with);
- `attention-off`: no dropout on the attention probabilities, the rest as the config says;
- `off`: no dropout anywhere in the pretrained model (decoder LLMs such as Llama ship so).
A delta's own dropout (LoRA's `dropout`, AdaMix's) is never touched: it is set after this runs.
Which default autopelt uses, and what turning dropout off costs in quality and saves in time, is measured in
docs/speed.md.

Attention implementation (`TrialSettings.attention`): `sdpa` (transformers' default) or `eager`, set on the
loaded model with transformers' public `set_attn_implementation`; `auto` (the default) measures which is faster
for the trial's shape on this device (`choose_attention`).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import socket
import time
from pathlib import Path

import torch
from torch import nn

from autopelt.dtypes import cast_frozen_weights
from autopelt.errors import UserError
from autopelt.files import write_atomic
from autopelt.train.settings import ATTENTION_SETTINGS, ATTENTIONS, BACKBONE_DROPOUTS  # noqa: F401

_ATTENTION_DROPOUTS = ("dropout", "attn_dropout", "attention_dropout")  # BERT/T5, GPT-2, Llama


def set_gradient_checkpointing(model: nn.Module, on: bool, spec=None) -> None:
    """Recompute the transformer layers' activations in the backward pass instead of keeping them (transformers'
    `gradient_checkpointing_enable`, non-reentrant: the frozen inputs need no gradient). The same gradients, less
    activation memory, about one more forward of time. Call it before the delta `spec` is applied. UserError where
    the model or the delta cannot take it (`checkpointing_refusal`)."""
    if not on:
        return
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise UserError(f"--gradient-checkpointing: transformers cannot checkpoint "
                        f"{getattr(model.config, 'model_type', '?')} models; train without it")
    reason = checkpointing_refusal(model.config, spec)
    if reason:
        raise UserError(reason)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False,
                                                                       "context_fn": _gates_padding(model)})


def resolve_checkpointing(model: nn.Module, asked: bool | None, spec, generation: bool) -> bool:
    """Whether a trial checkpoints: as `asked` (TrialSettings.gradient_checkpointing), or where it is None, a
    generation trial does when the model and the delta `spec` can take it (a decoder's prefix cannot): its
    activations, kept for the backward pass, are most of its memory (docs/decoders.md), and checkpointing changes
    no gradient."""
    if asked is not None:
        return asked
    return generation and bool(getattr(model, "supports_gradient_checkpointing", False)) and \
        checkpointing_refusal(model.config, spec) is None


def _gates_padding(model: nn.Module):
    """A `context_fn` that gives UniPELT's gates, recomputed in the backward pass, the padding mask of their pass
    (`PaddingMask.recomputing`, one shared by a model's gates); it is looked up once, on the first checkpointed
    call, after the delta is applied."""
    from autopelt.delta.modules.gate import Gate

    padding = []  # [the model's PaddingMask or None] once looked up

    def context_fn():
        if not padding:
            padding.append(next((m.padding for m in model.modules()
                                 if isinstance(m, Gate) and m.padding is not None), None))
        if padding[0] is None:
            return contextlib.nullcontext(), contextlib.nullcontext()
        return padding[0].recomputing()

    return context_fn


def checkpointing_refusal(config, spec) -> str | None:
    """Why the delta `spec` cannot be trained with gradient checkpointing on a model of `config`, in one line; None
    when it can: a decoder's prefix (and T5's in peft's form) travels in the key/value cache, which transformers
    drops when checkpointing."""
    from autopelt.delta import parse_spec
    from autopelt.delta.families import architecture_of
    from autopelt.delta.registry import innermost, method_of

    for config_ in (parse_spec(spec).methods if spec is not None else ()):
        inner = innermost(config_)
        why = method_of(inner).checkpointing_refusal(inner, config, architecture_of(config))
        if why:
            return why
    return None


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
        try:
            model.set_attn_implementation(implementation)
        except ValueError:  # transformers refuses an implementation the family has none of (Gemma 2: no SDPA)
            raise UserError(f"{type(model).__name__} cannot compute attention with {implementation}; pass "
                            "--attention eager") from None


def supports_sdpa(model) -> bool:
    """Whether transformers has an SDPA attention for the model's family (Gemma 2's soft-capped logits have none)."""
    return bool(getattr(model, "_supports_sdpa", True))


ATTENTION_ENV = "AUTOPELT_ATTENTION"  # sdpa or eager: what `auto` picks, untimed (a machine measured elsewhere)
_CHOSEN: dict[tuple, dict] = {}  # once per process and shape: timing again per trial would cost each trial steps


def choose_attention(requested: str, model: nn.Module, batch: dict, device: torch.device,
                     dtype: torch.dtype | None, backbone_dropout: str, cache_file: Path | None = None) -> dict:
    """The attention implementation a trial runs with, and how it was chosen: {"attention", "by", "seconds"}.

    `auto` takes $AUTOPELT_ATTENTION where set; SDPA on CUDA (its fused kernels, dropout included, beat eager
    there); on a CPU whichever of sdpa and eager trains one step of `batch`'s shape faster, timed on a copy of
    `model` (the backbone as the trial configured it, before the delta) with the global random state restored,
    so the trial draws the same dropout masks whichever is picked. Timed once per process, and with `cache_file`
    once per machine: a search's trials each run in a fresh worker process."""
    if requested != "auto":
        if requested not in ATTENTIONS:
            raise UserError(f"attention must be auto or one of {', '.join(ATTENTIONS)}, not {requested!r}")
        return {"attention": requested, "by": "asked", "seconds": None}
    if not supports_sdpa(model):
        return {"attention": "eager", "by": "the only one the model has", "seconds": None}
    given = os.environ.get(ATTENTION_ENV)
    if given:
        if given not in ATTENTIONS:
            raise UserError(f"{ATTENTION_ENV} must be one of {', '.join(ATTENTIONS)}, not {given!r}")
        return {"attention": given, "by": ATTENTION_ENV, "seconds": None}
    if device.type == "cuda":
        return {"attention": "sdpa", "by": "cuda", "seconds": None}
    shape = tuple(batch["input_ids"].shape)
    key = "|".join(map(str, (socket.gethostname(), torch.backends.cpu.get_cpu_capability(), torch.__version__,
                             getattr(model.config, "_name_or_path", ""), shape[0], -(-shape[1] // 32) * 32,
                             backbone_dropout, dtype, device.type, torch.get_num_threads())))
    if key not in _CHOSEN:
        _CHOSEN[key] = _read_choices(cache_file).get(key) or _measured(model, batch, device, dtype, key, cache_file)
    return dict(_CHOSEN[key])


def _measured(model, batch, device, dtype, key: str, cache_file: Path | None) -> dict:
    seconds = time_attention(model, batch, device, dtype)
    choice = {"attention": min(seconds, key=seconds.get), "by": "measured", "seconds": seconds}
    if cache_file is not None:
        try:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(cache_file, json.dumps({**_read_choices(cache_file), key: choice}, indent=1))
        except OSError:  # a read-only cache: every process times for itself
            pass
    return choice


def _read_choices(cache_file: Path | None) -> dict:
    try:
        return json.loads(cache_file.read_text()) if cache_file is not None else {}
    except (OSError, ValueError):
        return {}


def time_attention(model: nn.Module, batch: dict, device: torch.device, dtype: torch.dtype | None,
                   rounds: int = 2) -> dict[str, float]:
    """Seconds of one training step (forward and backward through the activations, the weights frozen as a
    delta's backbone is) with each attention implementation: the best of `rounds` interleaved steps after one
    warm-up step each. The backward starts from the outputs of the `token_embeddings`, which are made to require
    a gradient, as a delta in the first layer makes them: every layer's backward runs, no weight's. Works on a
    copy; the global random state is put back. UserError where no gradient reaches the logits so."""
    from autopelt.train import device as devices  # device.py imports the settings, which import this module

    probe = copy.deepcopy(model).to(device).train()
    probe.requires_grad_(False)
    cast_frozen_weights(probe, dtype)
    hooks = [module.register_forward_hook(lambda _module, _args, out: out.requires_grad_())
             for module in token_embeddings(probe)]
    inputs = {k: v.to(device) for k, v in batch.items() if k != "labels"}
    state = devices.rng_state(device)
    best = {name: float("inf") for name in ATTENTIONS}
    try:
        for round_ in range(rounds + 1):
            for name in ATTENTIONS:
                set_attention(probe, name)
                started = time.perf_counter()
                with devices.autocast(device, dtype):
                    logits = probe(**inputs).logits
                if not logits.requires_grad:
                    raise UserError(f"--attention auto: no gradient reaches a {probe.config.model_type} model's "
                                    "logits from its token embeddings, so a step cannot be timed; pass --attention "
                                    f"{' or '.join(ATTENTIONS)}")
                logits.float().sum().backward()
                if round_:  # round 0 warms up
                    best[name] = min(best[name], time.perf_counter() - started)
    finally:
        for hook in hooks:
            hook.remove()
        devices.set_rng_state(device, state)
    return best


def token_embeddings(model: nn.Module) -> list[nn.Module]:
    """Every module that embeds tokens with the model's input embedding matrix: `get_input_embeddings()` and the
    embeddings tied to its weight, such as T5's encoder and decoder `embed_tokens` beside its `shared`, which the
    forward calls instead. Position and relative-bias embeddings are not among them (a trial's backward never
    reaches their weights: a gradient there would be timed work no trial does), nor a language model's head tied
    to the same weight."""
    embeddings = model.get_input_embeddings()
    return [module for module in model.modules()
            if module is embeddings or (isinstance(module, nn.Embedding) and module.weight is embeddings.weight)]


def center_regression_head(model: nn.Module, labels) -> bool:
    """Set a regression head's output bias (its last one-output Linear) to the mean of the training labels, so that
    training starts from the mean prediction and the loss measures only the labels' spread around it (a regression
    output initialised at the target mean, as is usual practice). A layer without a bias (Llama's and GPT-2's
    `score`) is given one: it trains with the head and is saved with the delta (`delta.load_delta` gives the
    fresh model's layer its bias back; peft's copy of such a head has none, so such a delta has no peft folder).
    Returns False, changing nothing, where the head has no one-output Linear. Why: lab/experiments/regression-head."""
    from autopelt.delta.families import architecture_of

    head = getattr(model, architecture_of(model.config).head)
    outputs = [module for module in head.modules() if isinstance(module, nn.Linear) and module.out_features == 1]
    if not outputs:
        return False
    if outputs[-1].bias is None:
        from autopelt.delta.io import add_bias

        add_bias(outputs[-1])
    with torch.no_grad():
        outputs[-1].bias.fill_(float(torch.as_tensor(labels, dtype=torch.float64).mean()))
    return True

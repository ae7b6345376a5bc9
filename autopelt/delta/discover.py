"""A model type declared nowhere, read by its structure, as peft's `all-linear` reads any model.

The model is built on the meta device from its config (no weights, no memory). Its layer stack is the longest
ModuleList of modules of one class that hold linear layers; a linear inside a layer takes a role by its name (and,
for BERT's ambiguous `dense`, by the module around it), as peft's target-module names do: q_proj, query, q_lin ->
query; o_proj, out_proj, attention's dense -> attention_output; up_proj, fc1, c_fc -> intermediate; down_proj, fc2
-> output; and so on. A linear whose name says no role is left alone. The task head is what the sequence classifier
holds beside its backbone. Only methods on linear sites can run on what this finds (the LoRA family, (IA)³, VeRA,
BitFit where the linears have biases); adapters, prefixes and prompts need to know where a sublayer's output joins
the residual, which no name says, so they are refused. What was found is said in one line (`Architecture.found`).

The guess is checked against every declared family: read by structure, each gives the sites it declares
(tests/test_discover.py), so a family declared later keeps the sites its users trained with.
"""

from __future__ import annotations

import functools
import json
import sys
from typing import Any

from autopelt.delta.sites import Architecture, Stack
from autopelt.errors import UserError

# A linear's last name -> its role; names that mean another role inside attention are in _IN_ATTENTION
_ROLES = {
    **dict.fromkeys(("q_proj", "query", "q", "q_lin", "query_proj", "wq"), "query"),
    **dict.fromkeys(("k_proj", "key", "k", "k_lin", "key_proj", "wk"), "key"),
    **dict.fromkeys(("v_proj", "value", "v", "v_lin", "value_proj", "wv"), "value"),
    **dict.fromkeys(("qkv_proj", "c_attn", "wqkv", "query_key_value", "qkv", "w_pack"), "qkv"),
    **dict.fromkeys(("o_proj", "out_proj", "o", "out_lin", "attention_output"), "attention_output"),
    **dict.fromkeys(("gate_proj", "wi_0"), "gate"),
    **dict.fromkeys(("up_proj", "fc1", "lin1", "c_fc", "wi", "wi_1", "gate_up_proj", "dense_h_to_4h", "ffn", "fc_in"),
                    "intermediate"),
    **dict.fromkeys(("down_proj", "fc2", "lin2", "dense_4h_to_h", "ffn_output", "fc_out"), "output"),
}
_IN_ATTENTION = {"dense": "attention_output", "c_proj": "attention_output", "wo": "attention_output"}
_IN_MLP = {"c_proj": "output", "wo": "output"}
_BY_PARENT = {"intermediate": "intermediate", "output": "output"}  # BERT-style `intermediate.dense`, `output.dense`
_NEEDS_A_DECLARED_SUBLAYER = ("it needs to know where a sublayer's output joins the residual, which the model's "
                              "structure does not say: declare {family} in autopelt/delta/families.py")


def discovered(config) -> Architecture:
    """What `config`'s model shows of itself (cached per config), said in one line on standard error the first
    time; a one-line error when it shows no layer stack with linear sites autopelt can name."""
    arch = _discover(_config_json(config), type(config))
    if arch.family not in _SAID:
        _SAID.add(arch.family)
        print(f"autopelt: {arch.found}", file=sys.stderr, flush=True)
    return arch


_SAID: set[str] = set()


def _config_json(config) -> str:
    payload = config.to_dict()
    payload.pop("id2label", None), payload.pop("label2id", None)
    return json.dumps(payload, sort_keys=True, default=str)


@functools.lru_cache(maxsize=16)
def _discover(config_json: str, config_class) -> Architecture:
    config = config_class.from_dict(json.loads(config_json))
    family = str(config.model_type)
    if getattr(config, "is_encoder_decoder", False):
        raise UserError(f"model type {family!r} is an encoder-decoder autopelt does not know; declare its two stacks "
                        "in autopelt/delta/families.py, as T5's are")
    model = _skeleton(config)
    backbone_path = getattr(model, "base_model_prefix", "") or ""
    backbone = model.get_submodule(backbone_path) if backbone_path and hasattr(model, backbone_path) else model
    if backbone is model:
        backbone_path = ""
    layers_path, layers = _layer_stack(backbone)
    if layers is None:
        raise UserError(f"model type {family!r} is not declared and shows no stack of layers with linears; declare it "
                        "in autopelt/delta/families.py")
    linears, shapes, biased = _sites(layers[0])
    if not linears:
        raise UserError(f"model type {family!r} is not declared and none of its layers' linears has a name autopelt "
                        "reads (q_proj, query, fc1, ...); declare it in autopelt/delta/families.py")
    head, head_modules, head_extra, head_bias = _head(model, backbone_path, config)
    aliases = {site: "qkv" for site in ("query", "key", "value") if "qkv" in linears and site not in linears}
    causal = _is_causal(family)
    why = _NEEDS_A_DECLARED_SUBLAYER.format(family=family)
    stack = Stack(layers=layers_path, linears=linears, self_attention="", dropouts={}, layernorms={},
                  size=_size_attribute(config, len(layers)))
    found = (f"model type {family!r} is declared nowhere; read by structure: {len(layers)} layers at "
             f"{'.'.join(p for p in (backbone_path, layers_path) if p)}, sites "
             + ", ".join(f"{site}={path}" for site, path in linears.items())
             + f", head {'+'.join((*head_modules, head))}; LoRA, (IA)3, VeRA"
             + (", BitFit" if biased else "") + " can run, adapters, prefix and prompt need it declared")
    return Architecture(
        family=family, backbone=backbone_path, stacks=(stack,), embeddings=None, embeddings_layernorm=None,
        pooler=None, head=head, head_hidden_layer=False, shapes=lambda _config: dict(shapes), head_bias=head_bias,
        pre_norm=causal, causal=causal, aliases=aliases,
        no_bias=None if biased else "its linear layers have no bias terms",
        unsupported={"adapter": why, "prefix": why, "prompt": why}, head_modules=head_modules,
        head_extra=lambda _config: head_extra, found=found)


def _skeleton(config):
    """The sequence classifier (a causal LM where the type has none), on the meta device."""
    import torch

    from autopelt.delta.sites import model_class

    with torch.device("meta"):
        try:
            return model_class(config, lm=False).from_config(config)
        except ValueError as error:
            raise UserError(f"model type {config.model_type!r} has no sequence classifier in transformers "
                            f"({str(error).splitlines()[0][:120]})") from None


def _is_linear(module) -> bool:
    from torch import nn
    from transformers.pytorch_utils import Conv1D

    return isinstance(module, (nn.Linear, Conv1D))


def _layer_stack(backbone) -> tuple[str, Any]:
    """The longest ModuleList of one module class whose members hold linear layers, and its path."""
    from torch import nn

    best, best_path = None, ""
    for path, module in backbone.named_modules():
        if not isinstance(module, nn.ModuleList) or len(module) == 0:
            continue
        if len({type(layer) for layer in module}) != 1:
            continue
        if not any(_is_linear(m) for m in module[0].modules()):
            continue
        if best is None or len(module) > len(best):
            best, best_path = module, path
    return best_path, best


def _role(path: str) -> str | None:
    parts = path.split(".")
    name, parents = parts[-1].lower(), [p.lower() for p in parts[:-1]]
    in_attention = any("attn" in p or "attention" in p for p in parents)
    if in_attention and name in _IN_ATTENTION:
        return _IN_ATTENTION[name]
    if any("mlp" in p or "ffn" in p or "feed_forward" in p for p in parents) and name in _IN_MLP:
        return _IN_MLP[name]
    if name == "dense" and parents and parents[-1] in _BY_PARENT:
        return _BY_PARENT[parents[-1]]
    return _ROLES.get(name)


def _sites(layer) -> tuple[dict[str, str], dict[str, tuple[int, int]], bool]:
    """The named linear sites of one layer: role -> path, role -> (in, out), and whether any has a bias. A role
    named twice (two linears read as `query`) is left out: the guess would be ambiguous."""
    linears, shapes, seen, biased = {}, {}, set(), False
    for path, module in layer.named_modules():
        if not _is_linear(module):
            continue
        role = _role(path)
        if role is None:
            continue
        if role in seen:
            linears.pop(role, None), shapes.pop(role, None)
            continue
        seen.add(role)
        weight = module.weight
        in_f, out_f = (weight.shape[0], weight.shape[1]) if type(module).__name__ == "Conv1D" else \
            (weight.shape[1], weight.shape[0])
        linears[role], shapes[role] = path, (int(in_f), int(out_f))
        biased = biased or module.bias is not None
    return linears, shapes, biased


def _head(model, backbone_path: str, config) -> tuple[str, tuple[str, ...], int, bool]:
    """The classifier's own modules beside its backbone: (the output projection's attribute, the ones before it,
    their parameters, whether the projection has a bias)."""
    parts = [name for name, child in model.named_children()
             if name != backbone_path and any(True for _ in child.parameters())]
    if not parts:
        raise UserError(f"model type {config.model_type!r}: its sequence classifier shows no head beside its backbone")
    head = parts[-1]
    projections = [m for m in model.get_submodule(head).modules() if _is_linear(m)]
    out = projections[-1] if projections else None
    total = sum(p.numel() for name in parts for p in model.get_submodule(name).parameters())
    own = out.weight.numel() + (out.bias.numel() if out is not None and out.bias is not None else 0) if out else 0
    return head, tuple(parts[:-1]), int(total - own), bool(out is not None and out.bias is not None)


def _size_attribute(config, layers: int) -> str:
    """The config attribute that holds the stack's depth."""
    for name in ("num_hidden_layers", "n_layer", "num_layers", "n_layers"):
        if getattr(config, name, None) == layers:
            return name
    raise UserError(f"model type {config.model_type!r}: no config attribute gives its {layers} layers")


def _is_causal(model_type: str) -> bool:
    """A decoder: transformers has a causal LM of the type and no masked LM (BERT has both, an encoder)."""
    from transformers.models.auto.modeling_auto import (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
                                                        MODEL_FOR_MASKED_LM_MAPPING_NAMES)

    return model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES

"""Trainable and stored parameter counts from a spec and a model config alone, before anything is built.

The search uses these to reject over-budget samples without spending compute. `stored` is what a saved
delta holds (prefix without its MLP, AdaMix experts merged): the size a user deploys, and what budgets use.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

from autopelt.delta.inject import check_fits
from autopelt.delta.registry import Shape, method_of
from autopelt.delta.families import architecture_of
from autopelt.delta.spec import parse_spec


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
    with its task head, or with `lm` the language model (its LM head frozen, part of the base). Each method counts
    its own (its registry entry's `count`).

    Raises:
        UserError: the spec is invalid, or does not fit this model (inject.check_fits).
    """
    spec = parse_spec(spec)
    num_labels = num_labels or config.num_labels
    arch = architecture_of(config)
    check_fits(spec, config)
    regression = getattr(config, "problem_type", None) == "regression"
    head = 0 if lm else arch.head_params(config, num_labels, regression)
    shape = Shape(config, arch, spec.pooling)
    counts = [method_of(method).count(method, shape) for method in spec.methods]
    trainable = head + sum(t for t, _ in counts)
    stored = head + sum(s for _, s in counts)
    return ParamCount(trainable, stored, base_parameters(config, num_labels, lm))


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

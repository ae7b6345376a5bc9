"""Everything a trial needs, as one frozen, JSON-serialisable record."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from autopelt.errors import UserError

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
BACKBONE_DROPOUTS = ("model", "attention-off", "off")  # train/backbone.py applies them
QUANTIZE_CHOICES = (None, "4bit")  # the base model's storage: as stored, or NF4 (QLoRA; train/quantize.py)
ATTENTIONS = ("sdpa", "eager")
ATTENTION_SETTINGS = ("auto", *ATTENTIONS)  # auto: chosen per device by `backbone.choose_attention`


@dataclass(frozen=True)
class TrialSettings:
    task: str  # a GLUE task, or the name (and data folder) of a custom task
    spec: dict  # a delta spec (see docs/design.md)
    custom_task: dict | None = None  # a user's own data: {"text_columns": [...], "label_column": "label",
    #                                  "num_labels": 3 | "regression": true | "label_names": [...]}
    model: str | None = None  # path or hub id; None = the default model
    data_dir: str | None = None  # local <task>/<split>.jsonl|csv|parquet; None = $AUTOPELT_DATA_DIR or the hub
    protocol: str | int = "full"  # "full" or K (UniPELT's low-resource protocol)
    dev_size: int | None = None  # None = the protocol's default (K-shot: 1,000)
    seed: int = 0  # model initialisation, dropout, data order, AdaMix routing
    data_seed: int | None = None  # which rows form train/dev; None = `seed`. A search fixes it across trials.
    epochs: int = 3
    max_steps: int | None = None  # train this many optimiser steps instead of `epochs` epochs
    eval_every: int | None = None  # evaluate every N steps; None = once per epoch
    patience: int | None = None  # stop after N evaluations without a better dev metric
    learning_rate: float | None = None  # None: chosen for this delta, data and budget by a sweep (lr_sweep.py)
    head_lr_scale: float = 1.0  # the classifier head trains at learning_rate x this (a new head on many classes
    #                             needs more learning than the delta: design v2 of the meta-dataset)
    weight_decay: float = 0.0
    warmup_ratio: float = 0.06
    grad_clip: float = 1.0
    batch_size: int = 32
    micro_batch_size: int | None = None  # forward and backward this many rows at a time, their gradients
    #                                       accumulated into one step of `batch_size` rows (the same step); None = all
    eval_batch_size: int = 128
    max_length: int = 128
    max_train_examples: int | None = None  # a random subset of the protocol's train rows, for quick runs
    threads: int | None = None  # torch CPU threads; None = torch's default
    device: str | None = None  # None = CUDA when available, else CPU
    precision: str = "auto"  # auto (bf16 where the device runs it natively and faster, else fp32), fp32, bf16, fp16
    backbone_dropout: str = "off"  # the frozen model's dropout: off, attention-off, model (its config's); off by
    #                               measurement across 12 tasks (docs/speed.md)
    attention: str = "auto"  # the attention implementation: auto (measured per device), sdpa or eager (backbone.py)
    score_test: bool = True  # score the test split(s) after training; False: "test" stays None (a search trial)
    gradient_checkpointing: bool | None = None  # recompute the frozen model's activations in the backward pass:
    #   less memory, more time (backbone.set_gradient_checkpointing); None: a generation trial does where its model
    #   and delta can take it (its activations are its memory), a classification trial does not
    quantize: str | None = None  # "4bit": the frozen base in NF4 on CUDA, a LoRA delta trained over it (QLoRA,
    #                              train/quantize.py); None: the base as `precision` stores it
    cache_dir: str | None = None  # tokenisation cache; None = $AUTOPELT_CACHE_DIR or ~/.cache/autopelt
    out_dir: str | None = None  # where result.json and the delta go; None = keep nothing on disk
    max_new_tokens: int | None = None  # generation tasks: tokens generated per test input; None = 64
    keep_predictions: bool = False  # keep the dev and test predictions of the kept state: predictions.npz in
    #                                 out_dir, else result["predictions"]; what ensembles are selected from
    distill: dict | None = None  # {"targets": a .npz of a teacher's train predictions, "alpha": their share of the
    #                              loss, "temperature": T}: knowledge distillation (train/distillation.py)

    def __post_init__(self) -> None:
        positive = ("epochs", "batch_size", "eval_batch_size", "max_length")
        for name in positive:
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise UserError(f"{name} must be a positive integer, not {getattr(self, name)!r}")
        for name in ("max_steps", "eval_every", "patience", "threads", "max_train_examples", "max_new_tokens",
                     "micro_batch_size"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise UserError(f"{name} must be a positive integer, not {value!r}")
        if self.learning_rate is not None and not self.learning_rate > 0:
            raise UserError(f"learning_rate must be positive, not {self.learning_rate!r}")
        if not (isinstance(self.head_lr_scale, (int, float)) and self.head_lr_scale > 0):
            raise UserError(f"head_lr_scale must be positive, not {self.head_lr_scale!r}")
        if self.precision not in PRECISIONS:
            raise UserError(f"precision must be one of {', '.join(PRECISIONS)}, not {self.precision!r}")
        if self.backbone_dropout not in BACKBONE_DROPOUTS:
            raise UserError(f"backbone_dropout must be one of {', '.join(BACKBONE_DROPOUTS)}, "
                            f"not {self.backbone_dropout!r}")
        if self.attention not in ATTENTION_SETTINGS:
            raise UserError(f"attention must be one of {', '.join(ATTENTION_SETTINGS)}, not {self.attention!r}")
        if not (self.gradient_checkpointing is None or isinstance(self.gradient_checkpointing, bool)):
            raise UserError(f"gradient_checkpointing must be true, false or null, not "
                            f"{self.gradient_checkpointing!r}")
        if self.quantize not in QUANTIZE_CHOICES:
            raise UserError(f"quantize must be 4bit or none, not {self.quantize!r}")
        if not 0 <= self.warmup_ratio < 1:
            raise UserError(f"warmup_ratio must be in [0, 1), not {self.warmup_ratio!r}")
        if self.distill is not None:
            _check_distill(self.distill)

    @property
    def split_seed(self) -> int:
        return self.seed if self.data_seed is None else self.data_seed

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> TrialSettings:
        data = _upgrade(data)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UserError(f"unknown trial setting {unknown[0]!r}; known: {', '.join(sorted(known))}")
        return cls(**data)

    def replace(self, **changes) -> TrialSettings:
        return dataclasses.replace(self, **changes)


def _check_distill(distill) -> None:
    if not isinstance(distill, dict) or set(distill) != {"targets", "alpha", "temperature"}:
        raise UserError(f"distill must be {{'targets': path, 'alpha': share, 'temperature': T}}, not {distill!r}")
    if not (isinstance(distill["alpha"], (int, float)) and 0 <= distill["alpha"] <= 1):
        raise UserError(f"distill alpha (the soft targets' share of the loss) must be in [0, 1], "
                        f"not {distill['alpha']!r}")
    if not (isinstance(distill["temperature"], (int, float)) and distill["temperature"] > 0):
        raise UserError(f"distill temperature must be positive, not {distill['temperature']!r}")


def _upgrade(data: dict) -> dict:
    """Settings written before a field existed read as what they trained with."""
    if "backbone_dropout" not in data:  # before it was a setting, the model's own dropout was always on
        data = {**data, "backbone_dropout": "model"}
    return _upgrade_precision(data)


def _upgrade_precision(data: dict) -> dict:
    """Settings written before `precision` existed: `autocast` false was fp32 everywhere; true was mixed precision
    on CUDA only, which is what `auto` does on a CUDA device (a CPU ran fp32 then)."""
    if "autocast" not in data:
        return data
    data = dict(data)
    autocast = data.pop("autocast")
    data.setdefault("precision", "auto" if autocast else "fp32")
    return data

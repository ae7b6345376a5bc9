"""What classification and regression bring to the training run (`loop.Training`): length-grouped batches of a
TrialData's train rows, the task loss (with AdaMix's routing and consistency term), and the dev evaluation (the
task's metrics, the mean loss, the gate values of gated deltas)."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from autopelt.data import Features, Task, map_in_order, pad_batch, train_order
from autopelt.delta import consistency_loss, has_mixtures, route_all
from autopelt.delta.gate_readings import has_gates, recording_gates, summarise_gates
from autopelt.train import device as devices
from autopelt.train.distillation import distillation_loss
from autopelt.train.loop import Evaluation, Objective
from autopelt.train.lr_sweep import one_class_metric
from autopelt.train.settings import TrialSettings


def supervised_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    if logits.shape[-1] == 1:  # regression
        return F.mse_loss(logits.squeeze(-1).float(), labels.float())
    return F.cross_entropy(logits.float(), labels)


def training_loss(model: nn.Module, batch: dict, routing: torch.Generator, consistency: float,
                  mixed: bool = True, distill: dict | None = None) -> torch.Tensor:
    """The task loss; with AdaMix (`mixed`), as AdaMix's code: the first pass's task loss plus the consistency loss
    between it and a second pass under another routing. With `distill` ({"alpha", "temperature"}) and a teacher's
    `soft_targets` in the batch, the task loss is the distillation loss (train/distillation.py)."""
    labels, soft = batch.pop("labels"), batch.pop("soft_targets", None)

    def task_loss(outputs: torch.Tensor) -> torch.Tensor:
        if distill is None or soft is None:
            return supervised_loss(outputs, labels)
        return distillation_loss(outputs, labels, soft, distill["alpha"], distill["temperature"])

    if not mixed:
        return task_loss(model(**batch).logits)
    route_all(model, routing)
    first = model(**batch).logits
    if consistency <= 0:
        return task_loss(first)
    route_all(model, routing)
    second = model(**batch).logits
    return task_loss(first) + consistency * consistency_loss(first.float(), second.float())


def forward_split(model: nn.Module, features: Features, settings: TrialSettings, device, dtype=None) -> torch.Tensor:
    """The model's float32 outputs (logits, or a regression's values) on every row of a split, in the split's row
    order (batched, length-sorted, no autograd); leaves the model in eval mode."""
    model.eval()

    def logits_of(batch: dict) -> torch.Tensor:
        batch.pop("labels", None)
        with devices.autocast(device, dtype):
            return model(**{k: v.to(device) for k, v in batch.items()}).logits.float().cpu()

    with torch.inference_mode():
        return map_in_order(features, settings.eval_batch_size, logits_of)


def evaluate(model: nn.Module, features: Features, task: Task, settings: TrialSettings, device,
             dtype=None, gates: bool = False, loss: bool = False,
             outputs_to: list | None = None) -> tuple[dict, dict | None]:
    """Metrics on a split (batched, length-sorted, no autograd), and the mean gate values per layer if asked.
    `loss` adds the mean task loss to the metrics as "loss" (lower is better, unlike the metrics); `outputs_to`, a
    list, receives the float32 outputs the metrics were computed from (in the split's row order)."""
    with (recording_gates(model) if gates else contextlib.nullcontext({})) as totals:
        outputs = forward_split(model, features, settings, device, dtype)
    if outputs_to is not None:
        outputs_to.append(outputs)
    return score(outputs, features, task, loss), (summarise_gates(totals) if gates else None)


def score(outputs: torch.Tensor, features: Features, task: Task, loss: bool = False) -> dict:
    """The task's metrics of a split's float32 outputs (in its row order); with `loss`, the mean task loss as
    "loss"."""
    with torch.inference_mode():
        metrics = task.compute_metrics(outputs, features.labels)
        if loss:
            labels = torch.as_tensor(features.labels, dtype=torch.float32 if outputs.shape[-1] == 1 else torch.long)
            metrics["loss"] = float(supervised_loss(outputs, labels))
    return metrics


class Classification(Objective):
    """A sequence classifier (or regressor) trained on `data` (a TrialData): the task's dev metric selects, the dev
    loss is recorded beside it; `consistency` weighs AdaMix's consistency loss (0: one pass a step); `distill` mixes
    a teacher's soft targets (attached to the train rows) into the loss."""

    def __init__(self, model: nn.Module, data, device: torch.device, dtype: torch.dtype | None = None,
                 consistency: float = 0.0, distill: dict | None = None):
        self.model, self.data, self.device, self.dtype, self.consistency = model, data, device, dtype, consistency
        self.distill = distill  # {"alpha", "temperature"}: the loss also learns the train rows' soft_targets
        self.rows = len(data.train)
        self.mixed = has_mixtures(model)  # once: routing walks the model, which plain deltas need not pay every step
        self.gated = has_gates(model)

    def batches(self, batch_size: int, order: torch.Generator) -> list:
        return train_order(self.data.train, batch_size, order)

    def collate(self, indices) -> dict[str, torch.Tensor]:
        return pad_batch(self.data.train, indices)

    def loss(self, batch: dict, routing: torch.Generator) -> torch.Tensor:
        return training_loss(self.model, batch, routing, self.consistency, self.mixed, self.distill)

    def evaluate(self, settings: TrialSettings) -> Evaluation:
        outputs = [] if settings.keep_predictions else None
        dev, gates = evaluate(self.model, self.data.dev, self.data.task, settings, self.device, self.dtype,
                              gates=self.gated, loss=True, outputs_to=outputs)
        return self.evaluation(dev, gates, outputs[0] if outputs else None)

    def evaluation(self, dev: dict, gates: dict | None = None, outputs: torch.Tensor | None = None) -> Evaluation:
        """The Evaluation of dev metrics (with "loss", taken out) and gate values, keeping `outputs`."""
        dev_loss = dev.pop("loss", None)
        return Evaluation(dev, dev[self.data.task.metric], dev_loss, gates, outputs)

    def floor(self) -> tuple[float | None, int]:
        labels = self.data.dev.labels
        return one_class_metric(self.data), 0 if labels is None else len(labels)

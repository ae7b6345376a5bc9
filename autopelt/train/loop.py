"""The training loop: AdamW over the delta, warmup + linear decay, clipping, evaluation, early stopping.

Data flows one way: batches in, (step, dev metrics) reports out; the best delta state is kept in memory and
restored at the end. No global state is read except torch's RNG, which `run_trial` seeds for dropout.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from autopelt.data import Features, Task, map_in_order, pad_batch, train_order
from autopelt.delta import consistency_loss, has_mixtures, route_all
from autopelt.delta.gate_readings import has_gates, recording_gates, summarise_gates
from autopelt.train import device as devices
from autopelt.train.settings import TrialSettings


class NonFiniteLoss(RuntimeError):
    pass


@dataclass
class TrainOutcome:
    history: list[dict] = field(default_factory=list)
    best: dict | None = None  # the history entry whose state was kept
    gates: dict | None = None  # mean gate values per layer in that evaluation (gated deltas)
    best_dev_outputs: torch.Tensor | None = None  # that evaluation's dev outputs (kept with keep_predictions)
    steps: int = 0
    fidelity: float = 0.0  # epochs of data seen
    train_seconds: float = 0.0
    eval_seconds: float = 0.0
    examples_seen: int = 0
    stopped_by: str | None = None  # "patience", "scheduler", or None when the budget of steps ran out


def supervised_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    if logits.shape[-1] == 1:  # regression
        return F.mse_loss(logits.squeeze(-1).float(), labels.float())
    return F.cross_entropy(logits.float(), labels)


def training_loss(model: nn.Module, batch: dict, routing: torch.Generator, consistency: float,
                  mixed: bool = True) -> torch.Tensor:
    """The task loss; with AdaMix (`mixed`), as AdaMix's code: the first pass's task loss plus the consistency loss
    between it and a second pass under another routing."""
    labels = batch.pop("labels")
    if not mixed:
        return supervised_loss(model(**batch).logits, labels)
    route_all(model, routing)
    first = model(**batch).logits
    if consistency <= 0:
        return supervised_loss(first, labels)
    route_all(model, routing)
    second = model(**batch).logits
    return supervised_loss(first, labels) + consistency * consistency_loss(first.float(), second.float())


def warmup_then_linear(total_steps: int, warmup_ratio: float) -> Callable[[int], float]:
    warmup = int(total_steps * warmup_ratio)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup))

    return factor


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
    with torch.inference_mode():
        metrics = task.compute_metrics(outputs, features.labels)
        if loss:
            labels = torch.as_tensor(features.labels, dtype=torch.float32 if outputs.shape[-1] == 1 else torch.long)
            metrics["loss"] = float(supervised_loss(outputs, labels))
    return metrics, (summarise_gates(totals) if gates else None)


def parameter_groups(model: nn.Module, settings: TrialSettings) -> list[dict]:
    """The trainable parameters as AdamW groups: the delta's at `settings.learning_rate`, and with
    `settings.head_lr_scale` != 1 the classifier head's (the architecture's head module) at that rate times the
    scale. The warmup/decay schedule multiplies every group alike."""
    trainable = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    if settings.head_lr_scale == 1 or settings.learning_rate is None:
        return [{"params": [p for _, p in trainable]}]
    from autopelt.delta.families import architecture_of

    prefixes = tuple(part + "." for part in architecture_of(model.config).head_parts)
    head = [p for name, p in trainable if name.startswith(prefixes)]
    rest = [p for name, p in trainable if not name.startswith(prefixes)]
    groups = [{"params": rest}] if rest else []
    if head:
        groups.append({"params": head, "lr": settings.learning_rate * settings.head_lr_scale})
    return groups


class Training:
    """One run of the loop over a model, which can pause and resume: `run(until_evaluations=n)` trains until the
    n-th dev evaluation, `snapshot`/`restore` carry its whole state (trainable weights, optimiser and schedule,
    data order, random streams, what it has recorded). A learning-rate sweep runs several of these to their first
    evaluation and continues the best one, which then trains exactly as a run given that rate from the start."""

    def __init__(self, model: nn.Module, data, settings: TrialSettings, device: torch.device, consistency: float = 0.0,
                 report: Callable[[dict], object] | None = None,
                 on_step: Callable[[int, int, float], None] | None = None, outcome: TrainOutcome | None = None):
        self.model, self.data, self.settings, self.device = model, data, settings, device
        self.consistency, self.report, self.on_step = consistency, report, on_step
        self.outcome = outcome if outcome is not None else TrainOutcome()
        groups = parameter_groups(model, settings)
        self.params = [p for group in groups for p in group["params"]]
        self.optimizer = torch.optim.AdamW(groups, lr=settings.learning_rate, weight_decay=settings.weight_decay)
        self.steps_per_epoch = math.ceil(len(data.train) / settings.batch_size)
        self.total = settings.max_steps or settings.epochs * self.steps_per_epoch  # steps, when given, decide
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer,
                                                           warmup_then_linear(self.total, settings.warmup_ratio))
        self.dtype = devices.autocast_dtype(devices.resolve_precision(settings.precision, device))
        self.scaler = devices.grad_scaler(device, self.dtype)
        self.order = torch.Generator().manual_seed(settings.seed)  # data order across epochs
        self.routing = torch.Generator().manual_seed(settings.seed + 1)  # AdaMix expert choice
        self.mixed = has_mixtures(model)  # once: routing walks the model, which plain deltas need not pay every step
        self.gated = has_gates(model)
        self.best_state: dict[str, torch.Tensor] | None = None
        self.waited = 0
        self.epoch, self.batches, self.position, self.done = 1, None, 0, False

    def run(self, until_evaluations: int | None = None) -> TrainOutcome:
        """Train until the schedule ends or training stops, or until `until_evaluations` dev evaluations exist."""
        settings, outcome = self.settings, self.outcome
        self.model.train()
        while not self.done:
            if until_evaluations is not None and len(outcome.history) >= until_evaluations:
                break
            if self.batches is None:
                self.batches, self.position = train_order(self.data.train, settings.batch_size, self.order), 0
            self._step(self.batches[self.position])
            self.position += 1
            stop = bool(settings.eval_every) and outcome.steps % settings.eval_every == 0 and self._checkpoint()
            if not (stop or outcome.steps >= self.total or self.position == len(self.batches)):
                continue
            if not settings.eval_every and not stop:  # the end of an epoch
                stop = self._checkpoint()
            if stop or outcome.steps >= self.total:
                if settings.eval_every and not stop and outcome.steps % settings.eval_every:
                    self._checkpoint()  # the last steps were not evaluated yet
                self.done = True
            self.epoch, self.batches = self.epoch + 1, None
        return outcome

    def finish(self) -> TrainOutcome:
        """Put the best evaluated state back into the model."""
        if self.best_state is not None:
            with torch.no_grad():
                for name, param in self.model.named_parameters():
                    if name in self.best_state:
                        param.copy_(self.best_state[name])
        return self.outcome

    def _step(self, indices) -> None:
        started = time.perf_counter()
        size = self.settings.micro_batch_size or len(indices)
        chunks = [indices[start:start + size] for start in range(0, len(indices), size)]
        total = None
        for number, chunk in enumerate(chunks, 1):  # the batch's mean loss, a micro-batch at a time
            batch = {k: v.to(self.device) for k, v in pad_batch(self.data.train, chunk).items()}
            with devices.autocast(self.device, self.dtype):
                loss = training_loss(self.model, batch, self.routing, self.consistency, self.mixed)
            loss = loss * (len(chunk) / len(indices)) if len(chunks) > 1 else loss
            if not torch.isfinite(loss):
                raise NonFiniteLoss(f"the loss became {float(loss.detach())} at step {self.outcome.steps + 1}")
            total = loss.detach() if total is None else total + loss.detach()
            if number < len(chunks):
                self.scaler.scale(loss).backward()
        devices.optimiser_step(loss, self.optimizer, self.scaler, self.params, self.settings.grad_clip)
        loss = total
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        outcome = self.outcome
        outcome.steps += 1
        outcome.examples_seen += len(indices)
        outcome.fidelity = outcome.steps / self.steps_per_epoch
        outcome.train_seconds += time.perf_counter() - started
        if self.on_step is not None:
            self.on_step(outcome.steps, self.total, float(loss.detach()))

    def _checkpoint(self) -> bool:
        """Evaluate on dev, keep the best state; True when training should stop."""
        outcome, task = self.outcome, self.data.task
        started = time.perf_counter()
        outputs = [] if self.settings.keep_predictions else None
        dev, gates = evaluate(self.model, self.data.dev, task, self.settings, self.device, self.dtype,
                              gates=self.gated, loss=True, outputs_to=outputs)
        outcome.eval_seconds += time.perf_counter() - started
        dev_loss = dev.pop("loss", None)
        entry = {"epoch": self.epoch, "step": outcome.steps, "fidelity": round(outcome.fidelity, 4),
                 "dev": dev, "dev_metric": dev[task.metric], "dev_loss": dev_loss}
        outcome.history.append(entry)
        if outcome.best is None or entry["dev_metric"] > outcome.best["dev_metric"]:
            outcome.best, outcome.gates, self.waited = entry, gates, 0
            outcome.best_dev_outputs = outputs[0] if outputs else None
            self.best_state = {n: p.detach().clone() for n, p in self.model.named_parameters() if p.requires_grad}
        else:
            self.waited += 1
        self.model.train()
        return self.tell(entry)

    def tell(self, entry: dict) -> bool:
        """Give an evaluation to the report hook (a scheduler may stop the run) and the patience rule."""
        if self.report is not None and self.report(entry):
            self.outcome.stopped_by = "scheduler"
        elif self.settings.patience is not None and self.waited >= self.settings.patience:
            self.outcome.stopped_by = "patience"
        if self.outcome.stopped_by is not None:
            self.done = True
        return self.done

    def adopt(self, outcome: TrainOutcome) -> None:
        """Record into `outcome` from now on (the caller's object, which a failed trial still reports from), with
        what this run has recorded so far."""
        for field_ in dataclasses.fields(TrainOutcome):
            setattr(outcome, field_.name, getattr(self.outcome, field_.name))
        self.outcome = outcome

    def snapshot(self) -> dict:
        return {"params": [p.detach().clone() for p in self.params],
                "optimizer": copy.deepcopy(self.optimizer.state_dict()), "scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict(), "order": self.order.get_state(),
                "routing": self.routing.get_state(), "rng": devices.rng_state(self.device),
                "best_state": self.best_state, "outcome": copy.deepcopy(self.outcome),
                "position": (self.epoch, self.batches, self.position, self.done, self.waited)}

    def restore(self, snapshot: dict) -> None:
        with torch.no_grad():
            for param, value in zip(self.params, snapshot["params"]):
                param.copy_(value)
        self.optimizer.load_state_dict(snapshot["optimizer"])
        self.scheduler.load_state_dict(snapshot["scheduler"])
        self.scaler.load_state_dict(snapshot["scaler"])
        self.order.set_state(snapshot["order"])
        self.routing.set_state(snapshot["routing"])
        devices.set_rng_state(self.device, snapshot["rng"])
        self.best_state = snapshot["best_state"]
        self.outcome = copy.deepcopy(snapshot["outcome"])
        self.epoch, self.batches, self.position, self.done, self.waited = snapshot["position"]


def train(model: nn.Module, data, settings: TrialSettings, device: torch.device, consistency: float = 0.0,
          report: Callable[[dict], object] | None = None, on_step: Callable[[int, int, float], None] | None = None,
          outcome: TrainOutcome | None = None) -> TrainOutcome:
    """Train in place at `settings.learning_rate`; `outcome` (filled as training goes, so a failed trial keeps
    what it ran) is returned, the best evaluated state restored."""
    training = Training(model, data, settings, device, consistency, report, on_step, outcome)
    training.run()
    return training.finish()

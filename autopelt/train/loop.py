"""The training loop: AdamW over the delta, warmup + linear decay, clipping, evaluation, early stopping.

Data flows one way: batches in, (step, dev metrics) reports out; the best delta state is kept in memory and
restored at the end. No global state is read except torch's RNG, which `run_trial` seeds for dropout.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from autopelt.data import Features, Task, map_in_order, train_batches
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


def evaluate(model: nn.Module, features: Features, task: Task, settings: TrialSettings, device,
             dtype=None, gates: bool = False) -> tuple[dict, dict | None]:
    """Metrics on a split (batched, length-sorted, no autograd), and the mean gate values per layer if asked."""
    model.eval()

    def logits_of(batch: dict) -> torch.Tensor:
        batch.pop("labels", None)
        with devices.autocast(device, dtype):
            return model(**{k: v.to(device) for k, v in batch.items()}).logits.float().cpu()

    with torch.inference_mode(), (recording_gates(model) if gates else contextlib.nullcontext({})) as totals:
        outputs = map_in_order(features, settings.eval_batch_size, logits_of)
    return task.compute_metrics(outputs, features.labels), (summarise_gates(totals) if gates else None)


def train(model: nn.Module, data, settings: TrialSettings, device: torch.device, consistency: float = 0.0,
          report: Callable[[dict], object] | None = None, on_step: Callable[[int, int, float], None] | None = None,
          outcome: TrainOutcome | None = None) -> TrainOutcome:
    """Train in place; `outcome` (filled as training goes, so a failed trial keeps what it ran) is returned."""
    task, outcome = data.task, outcome if outcome is not None else TrainOutcome()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=settings.learning_rate, weight_decay=settings.weight_decay)
    steps_per_epoch = math.ceil(len(data.train) / settings.batch_size)
    total = settings.max_steps or settings.epochs * steps_per_epoch  # steps, when given, decide the epochs
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_then_linear(total, settings.warmup_ratio))
    dtype = devices.autocast_dtype(devices.resolve_precision(settings.precision, device))
    gated = has_gates(model)
    scaler = devices.grad_scaler(device, dtype)
    order = torch.Generator().manual_seed(settings.seed)  # data order across epochs
    routing = torch.Generator().manual_seed(settings.seed + 1)  # AdaMix expert choice
    mixed = has_mixtures(model)  # once: routing walks the model, which plain deltas need not pay every step
    best_state: dict[str, torch.Tensor] | None = None
    waited = 0

    def checkpoint(epoch: int) -> bool:
        """Evaluate on dev, keep the best state; True when training should stop."""
        nonlocal best_state, waited
        started = time.perf_counter()
        dev, gates = evaluate(model, data.dev, task, settings, device, dtype, gates=gated)
        outcome.eval_seconds += time.perf_counter() - started
        entry = {"epoch": epoch, "step": outcome.steps, "fidelity": round(outcome.fidelity, 4),
                 "dev": dev, "dev_metric": dev[task.metric]}
        outcome.history.append(entry)
        if outcome.best is None or entry["dev_metric"] > outcome.best["dev_metric"]:
            outcome.best, outcome.gates, waited = entry, gates, 0
            best_state = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
        else:
            waited += 1
        if report is not None and report(entry):
            outcome.stopped_by = "scheduler"
        elif settings.patience is not None and waited >= settings.patience:
            outcome.stopped_by = "patience"
        model.train()
        return outcome.stopped_by is not None

    model.train()
    stop = False
    for epoch in range(1, math.ceil(total / steps_per_epoch) + 1):
        for batch in train_batches(data.train, settings.batch_size, order):
            started = time.perf_counter()
            batch = {k: v.to(device) for k, v in batch.items()}
            size = len(batch["input_ids"])
            with devices.autocast(device, dtype):
                loss = training_loss(model, batch, routing, consistency, mixed)
            if not torch.isfinite(loss):
                raise NonFiniteLoss(f"the loss became {float(loss)} at step {outcome.steps + 1}")
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(params, settings.grad_clip)
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            outcome.steps += 1
            outcome.examples_seen += size
            outcome.fidelity = outcome.steps / steps_per_epoch
            outcome.train_seconds += time.perf_counter() - started
            if on_step is not None:
                on_step(outcome.steps, total, float(loss.detach()))
            if settings.eval_every and outcome.steps % settings.eval_every == 0:
                stop = checkpoint(epoch)
            if stop or outcome.steps >= total:
                break
        if not settings.eval_every and not stop:
            stop = checkpoint(epoch)
        if stop or outcome.steps >= total:
            break
    if settings.eval_every and not stop and outcome.steps % settings.eval_every:
        checkpoint(epoch)  # the last steps were not evaluated yet
    if best_state is not None:
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name in best_state:
                    param.copy_(best_state[name])
    return outcome

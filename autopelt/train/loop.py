"""The training run, for every kind of task: AdamW over the delta, warmup + linear decay, micro-batches with their
gradients accumulated, fp16's loss scale, clipping, dev evaluations, early stopping, pause and resume. What a kind
of task brings (how its train rows are batched, a batch's loss, the dev evaluation) is an `Objective` passed in
(`classify.Classification`, `generate.Generation`).

Data flows one way: batches in, (step, dev metrics) reports out; the best delta state is kept in memory and
restored at the end. No global state is read except torch's RNG, which `run_trial` seeds for dropout.
"""

from __future__ import annotations

import copy
import dataclasses
from abc import ABC, abstractmethod
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch
from torch import nn

from autopelt.train import device as devices
from autopelt.train.settings import TrialSettings


class NonFiniteLoss(RuntimeError):
    pass


CHECK_EVERY = 32  # steps between the checks of the losses for a non-finite one (and at every evaluation)


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

    def reset(self) -> None:
        """Forget everything recorded, as a new outcome: for a trial that starts its training again from the start
        (in smaller micro-batches, after running out of memory) into the object its caller reports from."""
        self.take(TrainOutcome())

    def take(self, other: TrainOutcome) -> None:
        """Hold what `other` has recorded (its fields, not copies of them)."""
        for field_ in dataclasses.fields(TrainOutcome):
            setattr(self, field_.name, getattr(other, field_.name))


@dataclass
class Evaluation:
    """One dev evaluation, as an objective computes it."""
    dev: dict  # the metrics recorded
    dev_metric: float  # the one that selects: higher is better
    dev_loss: float | None
    gates: dict | None = None  # mean gate values per layer (gated deltas)
    outputs: torch.Tensor | None = None  # the dev outputs the metrics came from, where the settings keep predictions


class Objective(ABC):
    """What a kind of task brings to a training run. `model` (the delta in place), `device` and `dtype` (autocast's,
    None for fp32) are attributes, as is `rows`, the number of train rows an epoch goes through once.

    Required: `batches` (one epoch's row indices, a batch at a time), `collate` (rows to a batch of tensors on the
    CPU), `loss` (a batch's mean loss, computed under autocast), `evaluate` (on dev). The rest has a default."""

    model: nn.Module
    device: torch.device
    dtype: torch.dtype | None
    rows: int

    def generators(self, seed: int) -> tuple[torch.Generator, torch.Generator]:
        """(the batch order's stream, the routing's stream for AdaMix): two, seeded `seed` and `seed` + 1."""
        return torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed + 1)

    @abstractmethod
    def batches(self, batch_size: int, order: torch.Generator) -> Sequence:
        ...

    @abstractmethod
    def collate(self, indices) -> dict[str, torch.Tensor]:
        ...

    def size(self, batch: dict) -> int:
        """What the batch's loss is a mean over (here its rows): a micro-batch's share of the step is its size over
        the step's."""
        return len(batch["input_ids"])

    @abstractmethod
    def loss(self, batch: dict, routing: torch.Generator) -> torch.Tensor:
        ...

    @abstractmethod
    def evaluate(self, settings: TrialSettings) -> Evaluation:
        """The dev evaluation of the model as it stands (`settings`: the run's)."""

    def entry(self, evaluation: Evaluation, epoch: int, step: int, fidelity: float) -> dict:
        """The history entry of an evaluation in `epoch` (counted from 1) after `step` steps, `fidelity` epochs of
        data seen."""
        return {"epoch": epoch, "step": step, "fidelity": round(fidelity, 4), "dev": evaluation.dev,
                "dev_metric": evaluation.dev_metric, "dev_loss": evaluation.dev_loss}

    def floor(self) -> tuple[float | None, int]:
        """(the dev metric of predicting one class, the dev rows it is measured on): what a rate sweep asks a rate
        to beat before it counts as learned; None where no such floor exists."""
        return None, 0


def warmup_then_linear(total_steps: int, warmup_ratio: float) -> Callable[[int], float]:
    warmup = int(total_steps * warmup_ratio)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup))

    return factor


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
    """One run of the loop over `objective.model`, which can pause and resume: `run(until_evaluations=n)` trains
    until the n-th dev evaluation, `snapshot`/`restore` carry its whole state (trainable weights, optimiser and
    schedule, data order, random streams, what it has recorded). A learning-rate sweep runs several of these to
    their first evaluation and continues the best one, which then trains exactly as a run given that rate from the
    start. The best evaluation is the one of the highest finite dev metric (the first of equals)."""

    def __init__(self, objective: Objective, settings: TrialSettings,
                 report: Callable[[dict], object] | None = None,
                 on_step: Callable[[int, int, float], None] | None = None, outcome: TrainOutcome | None = None):
        self.objective, self.model, self.settings = objective, objective.model, settings
        self.device, self.dtype = objective.device, objective.dtype
        self.report, self.on_step = report, on_step
        self.outcome = outcome if outcome is not None else TrainOutcome()
        groups = parameter_groups(self.model, settings)
        self.params = [p for group in groups for p in group["params"]]
        self.optimizer = torch.optim.AdamW(groups, lr=settings.learning_rate, weight_decay=settings.weight_decay,
                                           fused=_fused(self.params) or None)
        devices.allow_tf32(self.device, self.dtype)
        self.steps_per_epoch = math.ceil(objective.rows / settings.batch_size)
        self.total = settings.max_steps or settings.epochs * self.steps_per_epoch  # steps, when given, decide
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer,
                                                           warmup_then_linear(self.total, settings.warmup_ratio))
        self.scaler = devices.grad_scaler(self.device, self.dtype)
        self.order, self.routing = objective.generators(settings.seed)  # data order; AdaMix's expert choice
        self.best_state: dict[str, torch.Tensor] | None = None
        self.unchecked: list[tuple] = []  # (step, loss, the outcome's counts before it): losses not yet checked
        self.waited = 0
        self.epoch, self.batches, self.position, self.done = 1, None, 0, False

    def run(self, until_evaluations: int | None = None) -> TrainOutcome:
        """Train until the schedule ends or training stops, or until `until_evaluations` dev evaluations exist."""
        self.model.train()
        while not self.done:
            if until_evaluations is not None and len(self.outcome.history) >= until_evaluations:
                break
            self._step(self.next_rows())
            self.advance()
        self._check_losses()
        return self.outcome

    def next_rows(self):
        """The train rows of the next step (a new epoch's batches drawn when the last epoch's are used up)."""
        if self.batches is None:
            self.batches, self.position = self.objective.batches(self.settings.batch_size, self.order), 0
        return self.batches[self.position]

    def upcoming(self, count: int) -> list:
        """The train rows of the next `count` steps, as many as this epoch has left (at least the next step's),
        without taking them."""
        self.next_rows()
        return [list(rows) for rows in self.batches[self.position:self.position + count]]

    def evaluates_now(self) -> bool:
        """Whether `advance()`, after the step just taken, evaluates on dev (a pack evaluates its members due at
        once together)."""
        steps, every = self.outcome.steps, self.settings.eval_every
        if every:
            return steps % every == 0 or steps >= self.total
        return steps >= self.total or self.position + 1 == len(self.batches)

    def advance(self) -> None:
        """After a step of `next_rows()`: evaluate where the schedule says (every `eval_every` steps, else at the end
        of an epoch), stop where an evaluation or the schedule says; `done` then holds."""
        settings, outcome = self.settings, self.outcome
        self.position += 1
        stop = bool(settings.eval_every) and outcome.steps % settings.eval_every == 0 and self._checkpoint()
        if not (stop or outcome.steps >= self.total or self.position == len(self.batches)):
            return
        if not settings.eval_every and not stop:  # the end of an epoch
            stop = self._checkpoint()
        if stop or outcome.steps >= self.total:
            if settings.eval_every and not stop and outcome.steps % settings.eval_every:
                self._checkpoint()  # the last steps were not evaluated yet
            self.done = True
        self.epoch, self.batches = self.epoch + 1, None

    def finish(self) -> TrainOutcome:
        """Put the best evaluated state back into the model. Raises NonFiniteLoss when no dev evaluation was
        finite."""
        if self.best_state is None and self.outcome.history:
            raise NonFiniteLoss("the dev evaluation was never finite")
        if self.best_state is not None:
            with torch.no_grad():
                for name, param in self.model.named_parameters():
                    if name in self.best_state:
                        param.copy_(self.best_state[name])
        return self.outcome

    def _step(self, indices) -> None:
        started = time.perf_counter()
        size = self.settings.micro_batch_size or len(indices)
        batches = [self.objective.collate(indices[start:start + size]) for start in range(0, len(indices), size)]
        shares = self._shares(batches)
        total = None
        outcome = self.outcome
        before = (outcome.steps, outcome.examples_seen, outcome.fidelity, outcome.train_seconds)
        for number, (batch, share) in enumerate(zip(batches, shares), 1):  # the step's loss, a micro-batch at a time
            batch = {k: v.to(self.device) for k, v in batch.items()}
            with devices.autocast(self.device, self.dtype):
                loss = self.objective.loss(batch, self.routing)
            loss = loss * share if len(batches) > 1 else loss
            self.unchecked.append((outcome.steps + 1, loss.detach(), before))
            total = loss.detach() if total is None else total + loss.detach()
            if number < len(batches):
                self.scaler.scale(loss).backward()
        self.scaler.scale(loss).backward()
        self.update(len(indices), total, time.perf_counter() - started)

    def update(self, rows: int, loss, seconds: float) -> None:
        """The optimiser's step from the gradients the step's backward left (`rows` rows, mean `loss`: a number or
        a tensor, read only by `on_step`), the schedule's, and the step counted: `seconds` join the training
        time."""
        began = time.perf_counter()
        devices.clip_and_step(self.optimizer, self.scaler, self.params, self.settings.grad_clip)
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        outcome = self.outcome
        outcome.steps += 1
        outcome.examples_seen += rows
        outcome.fidelity = outcome.steps / self.steps_per_epoch
        outcome.train_seconds += seconds + time.perf_counter() - began
        if self.on_step is not None or outcome.steps % CHECK_EVERY == 0:  # on_step reads the loss anyway
            self._check_losses()
        if self.on_step is not None:
            self.on_step(outcome.steps, self.total, float(loss))

    def _check_losses(self) -> None:
        """Raise NonFiniteLoss for the first non-finite loss since the last check, with the outcome's counts put
        back to before its step (as if the run had stopped there). One host sync for all of them: the check is
        deferred from every step (on CUDA a per-step check waits for the device) to every `CHECK_EVERY` steps,
        every evaluation and the run's end; the steps after a non-finite loss only train weights that are
        never kept."""
        if not self.unchecked:
            return
        losses, self.unchecked = self.unchecked, []
        finite = torch.isfinite(torch.stack([loss.float() for _, loss, _ in losses])).tolist()
        if all(finite):
            return
        step, loss, before = losses[finite.index(False)]
        outcome = self.outcome
        outcome.steps, outcome.examples_seen, outcome.fidelity, outcome.train_seconds = before
        raise NonFiniteLoss(f"the loss became {float(loss)} at step {step}")

    def _shares(self, batches: list[dict]) -> list[float]:
        """Each micro-batch's share of the step's mean loss: its size over theirs together."""
        if len(batches) == 1:
            return [1.0]
        sizes = [self.objective.size(batch) for batch in batches]
        return [size / sum(sizes) for size in sizes]

    def _checkpoint(self) -> bool:
        """Evaluate on dev, keep the best state; True when training should stop."""
        self._check_losses()
        outcome = self.outcome
        started = time.perf_counter()
        evaluation = self.objective.evaluate(self.settings)
        outcome.eval_seconds += time.perf_counter() - started
        entry = self.objective.entry(evaluation, self.epoch, outcome.steps, outcome.fidelity)
        outcome.history.append(entry)
        if _improves(evaluation.dev_metric, outcome.best):
            outcome.best, outcome.gates, self.waited = entry, evaluation.gates, 0
            outcome.best_dev_outputs = evaluation.outputs
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
        outcome.take(self.outcome)
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
        self.routing.set_state(snapshot["routing"])  # (the order's own generator, where the objective shares one)
        devices.set_rng_state(self.device, snapshot["rng"])
        self.best_state = snapshot["best_state"]
        self.unchecked = []  # a snapshot is taken where its run's losses were checked
        self.outcome = copy.deepcopy(snapshot["outcome"])
        self.epoch, self.batches, self.position, self.done, self.waited = snapshot["position"]


def _fused(params: list) -> bool:
    """Whether AdamW can take its fused kernel: every parameter on CUDA (CPU keeps torch's default)."""
    return bool(params) and all(p.is_cuda and p.is_floating_point() for p in params)


def _improves(dev_metric: float, best: dict | None) -> bool:
    """A finite dev metric above the best's so far (any finite one, for the first)."""
    return math.isfinite(dev_metric) and (best is None or dev_metric > best["dev_metric"])

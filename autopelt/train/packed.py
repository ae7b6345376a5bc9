"""Packed trials: several classification trials trained in one process, one pass of one frozen backbone a step.

Trials that share a model, task, data, maximum length, precision, backbone dropout and attention, and whose
deltas can pack (delta/packing.py), train as members of one pack: each has its own delta (its seed), head,
AdamW, schedule, batch order and batch size, dev evaluations and early stop; at every step the members' batches
are concatenated along the batch dimension (padded to the longest row, under the attention mask) and go through
the shared model once; the loss is the sum of the members' mean losses, and since their parameters are disjoint
each gets exactly its own gradient (the multi-job packing of mLoRA/ASPEN, PLoRA and LoRAFusion, for every method
whose modules read a site's input alone). A member whose schedule ends or that stops early leaves the pack.

Each member's result is its trial's (`run_trial`'s), with `packed` = {"members", "member"}; it evaluates and
saves its own model, which is exactly its trial's alone. A packed trial needs its learning rate: there is no
per-trial rate sweep in a pack. Trials that cannot pack (their `packed` = {"refused": reason}) or that share
nothing with another (no `packed`) run alone, one after the other, through `run_trial`; a member whose delta does
not fit the model fails alone, as its trial would.

What differs from trials alone, beyond float rounding (a matmul over more rows, longer padding): a delta's own
dropout (LoRA's `dropout` > 0) draws its masks from one random stream for the whole pack; each member's
`train_seconds` is its share, by rows, of the steps it was packed in.

With `measure`, a pack first times one step of its own against its members' steps alone (`measured_step`) and
trains packed only where that pays (PAYS); otherwise each member trains alone, its result saying why
(`packed.unpacked`). The measurement leaves no trace: no optimizer step, the gradients cleared, the random state
put back, so a pack that pays trains exactly as it would unmeasured.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Callable, Sequence

import torch

from autopelt import delta
from autopelt.data import map_in_order, pad_batch
from autopelt.delta.inject import check_fits
from autopelt.delta.packing import pack_deltas, packing_refusal
from autopelt.dtypes import settle_dtypes
from autopelt.errors import UserError
from autopelt.models import fresh_head, load_model, load_tokenizer, resolve_model
from autopelt.train import backbone, device as devices
from autopelt.train.classify import Classification, score, supervised_loss
from autopelt.train.generate import is_generation
from autopelt.train.loop import Evaluation, NonFiniteLoss, Training, TrainOutcome
from autopelt.train.settings import TrialSettings
from autopelt.train.trial import (attention_cache, close_result, conclude, fail, first_batch, new_result, run_trial,
                                  save, timed, write_result)
from autopelt.train.trial_data import prepare_data, resolve_task

log = logging.getLogger(__name__)

# a measured pack trains packed where its step takes at most this share of its members' steps alone: the rest is a
# margin for the timing's noise (set before any pack was measured with it)
PAYS = 0.9
# steps a measured pack times after one that warms up (a first batch alone misreads a run: docs/packed.md)
MEASURED_STEPS = 4

# what members of one pack share: one model, one data, one pass
SHARED = ("task", "custom_task", "model", "data_dir", "protocol", "dev_size", "split_seed", "max_train_examples",
          "max_length", "threads", "device", "precision", "backbone_dropout", "attention", "cache_dir")

Report = Callable[[dict], object]


def refusal(settings: TrialSettings) -> str | None:
    """Why this trial cannot train packed with others (a one-line reason), or None."""
    if is_generation(settings):
        return "a generation task trains alone"
    if settings.learning_rate is None:
        return "a packed trial needs its learning rate (no per-trial rate sweep in a pack)"
    reasons = {"micro_batch_size": "micro-batches", "distill": "distillation",
               "gradient_checkpointing": "gradient checkpointing", "quantize": "a quantised base"}
    for name, what in reasons.items():
        if getattr(settings, name):
            return f"a trial with {what} trains alone"
    if settings.backbone_dropout != "off":  # one pass draws one mask for the whole pack's batch, from one seed
        return "the frozen model's dropout draws one mask a pass: a trial with backbone dropout trains alone"
    if settings.precision == "fp16":
        return "fp16's loss scale is one per pass: an fp16 trial trains alone"
    try:
        return packing_refusal(settings.spec)
    except UserError as error:  # it fails alone, with its own reason
        return f"its spec is invalid: {error}"


def packing_key(settings: TrialSettings) -> tuple:
    """What a trial must share with the others of its pack."""
    return tuple(repr(getattr(settings, name)) for name in SHARED)


def run_packed(settings: Sequence[TrialSettings], reports: Sequence[Report | None] | None = None, *,
               measure: bool = False) -> list[dict]:
    """Train every trial of `settings`, those that can pack together in packs (one per `packing_key`), the others
    alone; their results (run_trial's form), in the order given. `reports[i]` gets trial i's dev evaluations;
    a truthy return stops that trial (it leaves its pack). `measure`: a pack trains packed only where its measured
    step pays (module docstring)."""
    reports = list(reports) if reports is not None else [None] * len(settings)
    results: list[dict | None] = [None] * len(settings)
    packs: dict[tuple, list[int]] = {}
    for i, trial in enumerate(settings):
        reason = refusal(trial)
        if reason:
            results[i] = _alone(trial, reports[i], {"refused": reason})
        else:
            packs.setdefault(packing_key(trial), []).append(i)
    for members in packs.values():
        if len(members) == 1:
            results[members[0]] = run_trial(settings[members[0]], reports[members[0]])
            continue
        for i, result in zip(members, _run_pack([settings[i] for i in members], [reports[i] for i in members],
                                                measure)):
            results[i] = result
    return results


def _alone(settings: TrialSettings, report: Report | None, packed: dict) -> dict:
    """The trial trained alone (run_trial), its result saying why it did not train in a pack (`packed`)."""
    result = run_trial(settings, report)
    result["packed"] = packed
    if settings.out_dir:
        write_result(Path(settings.out_dir), result)
    return result


class _Member:
    """One trial in a pack: its settings, result, outcome and (once built) its training run."""

    def __init__(self, settings: TrialSettings, report: Report | None, position: int, members: int):
        self.settings, self.report = settings, report
        self.started = time.perf_counter()
        self.result = new_result(settings)
        self.result["packed"] = {"members": members, "member": position}
        self.outcome = TrainOutcome()
        self.run: Training | None = None
        self.done = False


class StepDoesNotPay(Exception):
    """A measured pack's step took more than PAYS of its members' steps alone."""


def _run_pack(settings: list[TrialSettings], reports: list[Report | None], measure: bool = False) -> list[dict]:
    """The pack's results; where it runs out of memory, or its measured step does not pay, each member that had not
    ended trains (again) alone, from the start (with its own retries at half the micro-batch: trial.run_trial), its
    result saying why (`packed.unpacked`). Any other failure of the whole pack fails the members still training,
    each with its reason."""
    members = [_Member(trial, report, i, len(settings)) for i, (trial, report) in enumerate(zip(settings, reports))]
    unpack, why = [], ""
    try:
        _train_pack(members, measure)
    except Exception as error:
        running = [m for m in members if m.result["status"] == "running"]
        if isinstance(error, StepDoesNotPay):
            unpack, why = running, f"its measured step did not pay ({error}); trained alone"
        elif devices.is_out_of_memory(error):
            unpack, why = running, "the pack ran out of memory; trained alone"
        for member in running:
            if member not in unpack:
                fail(member.result, error, member.settings)
    for member in members:
        member.run = None  # it holds the pack's modules: with the error's frames gone, nothing does
    for member in unpack:
        devices.release_memory()
        log.warning("a pack of %d trials: %s (member %d)", len(members), why, member.result["packed"]["member"])
        member.result = _alone(member.settings, member.report, {**member.result["packed"], "unpacked": why})
    return [m.result if m in unpack else close_result(m.result, m.settings, m.outcome, m.started) for m in members]


def _train_pack(members: list[_Member], measure: bool = False) -> None:
    first = members[0].settings
    task = resolve_task(first)
    model_name = resolve_model(first.model)
    if first.threads:
        torch.set_num_threads(first.threads)
    device = devices.pick_device(first.device)
    phases: dict = {}
    with devices.PeakMemory(device) as memory:
        with timed(phases, "data"):
            data = prepare_data(first, load_tokenizer(model_name), task)
        pack, dtype, attention, members = _build(members, task, model_name, data, device, phases)
        if pack is None:
            return
        for member, own in zip(members, pack.members):
            spec = delta.parse_spec(member.settings.spec)
            member.result.update(model=model_name, metric=task.metric, spec=spec.to_dict(), summary=spec.summary(),
                                 protocol=data.protocol, precision=devices.resolve_precision(first.precision, device),
                                 attention=attention["attention"], attention_choice=attention,
                                 phase_seconds=dict(phases), gradient_checkpointing=False,  # refused in a pack
                                 params=delta.count_parameters(spec, own.config, task.num_labels).to_dict())
            objective = _MemberObjective(own, data, device, dtype)
            member.run = Training(objective, member.settings, member.report, outcome=member.outcome)
        if measure and len(members) > 1:  # each member's own first batches (drawn from its own order, kept for it)
            with timed(phases, "measured step"):
                step = measured_step(pack, [m.run.upcoming(MEASURED_STEPS + 1) for m in members], data, device,
                                     dtype)
            for member in members:
                member.result["packed"]["step"] = dict(step)
                member.result["phase_seconds"]["measured step"] = phases["measured step"]
            if step["ratio"] > PAYS:
                raise StepDoesNotPay(f"packed {step['packed_s']:.3g} s against {step['alone_s']:.3g} s alone, "
                                     f"{step['ratio']:.2f}x > {PAYS:g}x")
        _steps(pack, members, data, device, dtype)
        for member, own in zip(members, pack.members):
            if member.result["status"] != "running":
                continue
            try:
                trained = member.run.finish()
                member.result.update(lr_choice={"rate": member.settings.learning_rate, "how": "given", "seconds": 0.0})
                conclude(member.result, member.settings, own, data, trained, device, dtype)
                member.result["status"] = "ok"
            except Exception as error:
                fail(member.result, error, member.settings)
    for member, own in zip(members, pack.members):
        member.result.update(memory.record())
        if member.result["status"] == "ok":
            try:  # a delta that cannot be saved fails its trial (as run_trial's), not the members after it
                save(member.result, member.settings, own, delta.parse_spec(member.settings.spec), model_name, task)
            except Exception as error:
                fail(member.result, error, member.settings)


def _build(members: list[_Member], task, model_name: str, data, device, phases: dict):
    """The shared model with the delta of every member whose delta fits it (delta/packing.py), its autocast dtype,
    attention choice and those members (the pack: None where none fits)."""
    first = members[0].settings
    precision = devices.resolve_precision(first.precision, device)
    if precision == "fp16":
        raise UserError("fp16's loss scale is one per pass: fp16 trials train alone")
    dtype = devices.autocast_dtype(precision)
    with timed(phases, "model"):
        torch.manual_seed(first.seed)
        model = load_model(model_name, task.num_labels, task.problem_type, seed=first.seed,
                           dtype=devices.load_dtype(precision))
        backbone.set_backbone_dropout(model, first.backbone_dropout)
    with timed(phases, "attention"):
        attention = backbone.choose_attention(first.attention, model, first_batch(data.train, first.batch_size),
                                              device, dtype, first.backbone_dropout, attention_cache(first))
    backbone.set_attention(model, attention["attention"])
    members = [member for member in members if _fits(member, model.config)]
    if not members:
        return None, dtype, attention, members

    def prepare(own, i: int) -> None:  # the member's own head, as its trial alone would draw it
        fresh_head(own, members[i].settings.seed)
        if task.regression:
            members[i].result["head_centered"] = backbone.center_regression_head(own, data.train.labels)

    with timed(phases, "delta"):
        pack = pack_deltas(model, [m.settings.spec for m in members], [m.settings.seed for m in members], prepare)
        model.to(device)  # the shared tensors, in place: the members hold them
        for own in pack.members:  # a member's buffers outside the sites are its own references: moved apart
            own.to(device)
        settle_dtypes(model, dtype)
    return pack, dtype, attention, members


def _fits(member: _Member, model_config) -> bool:
    """Whether the member's delta fits the model; one that does not fails alone, with its reason."""
    try:
        check_fits(delta.parse_spec(member.settings.spec), model_config)
    except UserError as error:
        fail(member.result, error, member.settings)
        return False
    return True


def _steps(pack, members: list[_Member], data, device, dtype) -> None:
    """Train the members in lockstep until each has finished or stopped: one pass of their batches together."""
    while True:
        pack.model.train()  # a dev evaluation leaves the members' modules in eval mode
        active = [(i, m) for i, m in enumerate(members) if not m.done]
        if not active:
            return
        started = time.perf_counter()
        rows = [member.run.next_rows() for _, member in active]
        batch = pad_batch(data.train, [r for part in rows for r in part])
        labels = batch.pop("labels").to(device)
        pack.rows.assign([(i, len(part)) for (i, _), part in zip(active, rows)])
        with devices.autocast(device, dtype):
            logits = pack.model(**{k: v.to(device) for k, v in batch.items()}).logits
        losses, start = [], 0
        for part in rows:
            losses.append(supervised_loss(logits[start:start + len(part)], labels[start:start + len(part)]))
            start += len(part)
        finite = [bool(torch.isfinite(loss)) for loss in losses]
        kept = [loss for loss, ok in zip(losses, finite) if ok]
        if kept:
            torch.stack(kept).sum().backward()
        seconds, total = time.perf_counter() - started, sum(len(part) for part in rows)
        stepped = []
        for ((_, member), part, loss, ok) in zip(active, rows, losses, finite):
            if not ok:
                error = NonFiniteLoss(f"the loss became {float(loss.detach())} at step {member.outcome.steps + 1}")
                fail(member.result, error, member.settings)
                member.done = True
                continue
            member.run.update(len(part), float(loss.detach()), seconds * len(part) / total)
            stepped.append(member)
        _evaluate_together(pack, [(members.index(m), m) for m in stepped if m.run.evaluates_now()], data, device,
                           dtype)
        for member in stepped:
            try:  # its evaluation and its report: what fails there fails its trial alone, as run_trial's
                member.run.advance()
            except Exception as error:
                fail(member.result, error, member.settings)
                member.run.done = True
            member.run.objective.given = None  # used by the evaluation it was computed for, or by none
            member.done = member.run.done


def measured_step(pack, batches: list[list[list[int]]], data, device, dtype) -> dict:
    """Training passes (forward and backward) of the pack on its members' next batches (`batches[i]`: member i's
    train rows of its next steps, as it reads them; padded together as a pack pads them), against the same passes
    of each member's own model on its batches alone. The first step warms up (new shapes; in a length-grouped epoch
    it is the longest batch of its chunk); the seconds of the next MEASURED_STEPS (or of the first again, where a
    member has no more) are summed, and their ratio is packed / alone. No optimizer steps; the gradients are cleared
    and the random state (a delta's own dropout draws) put back, so training goes on as if nothing ran."""

    def loss_of(model, parts: list[list[int]]) -> torch.Tensor:  # the sum of each part's mean loss, as a step's
        batch = pad_batch(data.train, [r for part in parts for r in part])
        labels = batch.pop("labels").to(device)
        with devices.autocast(device, dtype):
            logits = model(**{k: v.to(device) for k, v in batch.items()}).logits
        losses, start = [], 0
        for part in parts:
            losses.append(supervised_loss(logits[start:start + len(part)], labels[start:start + len(part)]))
            start += len(part)
        return torch.stack(losses).sum()

    def packed(parts: list[list[int]]) -> Callable[[], None]:
        def run() -> None:
            pack.rows.assign([(i, len(part)) for i, part in enumerate(parts)])
            loss_of(pack.model, parts).backward()
        return run

    def alone(i: int, part: list[int]) -> Callable[[], None]:
        return lambda: loss_of(pack.members[i], [part]).backward()

    steps = min(len(own) for own in batches)
    plan = [0, *(range(1, min(steps, MEASURED_STEPS + 1)) or [0])]  # the first warms up
    rounds = []
    for model in (pack.model, *pack.members):
        model.train()
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        for step in plan:
            parts = [own[step] for own in batches]
            rounds.append((_clock(packed(parts), device), sum(_clock(alone(i, part), device)
                                                              for i, part in enumerate(parts))))
    for model in (pack.model, *pack.members):
        model.zero_grad(set_to_none=True)
    packed_s, alone_s = (sum(side) for side in zip(*rounds[1:]))
    return {"packed_s": round(packed_s, 4), "alone_s": round(alone_s, 4), "ratio": round(packed_s / alone_s, 3),
            "steps": len(rounds) - 1}


def _clock(step: Callable[[], None], device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - started


class _MemberObjective(Classification):
    """A member's objective: its dev evaluation is the one the pack computed for it (`given`), where there is one."""

    given: Evaluation | None = None

    def evaluate(self, settings: TrialSettings) -> Evaluation:
        given, self.given = self.given, None
        return given if given is not None else super().evaluate(settings)


def _evaluate_together(pack, due: list[tuple[int, _Member]], data, device, dtype) -> None:
    """The dev evaluation of the members `due` one now, in one pass a batch: each batch of dev rows once per member,
    each member's copy through its own delta. Each member's evaluation is handed to its objective, and the pass's
    seconds shared among them. Fewer than two: each evaluates alone (its objective's own evaluation)."""
    if len(due) < 2:
        return
    started = time.perf_counter()
    batch_size = min(member.settings.eval_batch_size for _, member in due)

    def outputs(batch: dict) -> torch.Tensor:  # (rows, members x outputs): the members' side by side
        batch.pop("labels", None)
        rows = len(batch["input_ids"])
        pack.rows.assign([(i, rows) for i, _ in due])
        together = {k: v.repeat(len(due), *([1] * (v.dim() - 1))).to(device) for k, v in batch.items()}
        with devices.autocast(device, dtype):
            logits = pack.model(**together).logits.float().cpu()
        return torch.cat(logits.split(rows), dim=1)

    pack.model.eval()
    with torch.inference_mode():
        side_by_side = map_in_order(data.dev, batch_size, outputs)
    share = (time.perf_counter() - started) / len(due)
    for (_, member), own in zip(due, side_by_side.chunk(len(due), dim=1)):
        keep = own if member.settings.keep_predictions else None
        member.run.objective.given = member.run.objective.evaluation(score(own, data.dev, data.task, loss=True),
                                                                     None, keep)
        member.outcome.eval_seconds += share

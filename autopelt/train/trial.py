"""One trial: build -> train (report) -> evaluate -> result. A failed trial is a result, never a crash."""

from __future__ import annotations

import contextlib
import json
import logging
import time
import traceback
from pathlib import Path
from typing import Callable

import torch

from autopelt import delta, quantize
from autopelt.data import pad_batch
from autopelt.data.cache import default_cache_dir
from autopelt.delta.registry import method_of
from autopelt.dtypes import settle_dtypes
from autopelt.errors import UserError
from autopelt.files import write_atomic
from autopelt.models import load_config, portable_name, resolve_model
from autopelt.train import backbone, device as devices, warm
from autopelt.train.classify import Classification, evaluate, forward_split
from autopelt.train.loop import NonFiniteLoss, TrainOutcome
from autopelt.train.predictions import from_outputs, save as save_predictions
from autopelt.train.generate import is_generation
from autopelt.train.generation_trial import run_generation
from autopelt.train.lr_sweep import train_at_chosen_rate
from autopelt.train.trial_data import resolve_task
from autopelt.train.settings import TrialSettings

RESULT_FILE = "result.json"
log = logging.getLogger(__name__)


def run_trial(settings: TrialSettings, report: Callable[[dict], object] | None = None,
              on_step: Callable[[int, int, float], None] | None = None, test_each_evaluation: bool = False) -> dict:
    """Train and evaluate `settings.spec` on `settings.task`; the result dict of docs/design.md.

    `report(entry)` gets every dev evaluation; a truthy return stops training (a scheduler's early stop).
    `test_each_evaluation` also scores test at every dev evaluation, into the history's `test_metric` (for the
    meta-dataset, which simulates answers at every fidelity; nothing is selected by it).
    """
    started = time.perf_counter()
    result = new_result(settings)
    outcome = TrainOutcome()
    try:
        settings = _run_fitting(settings, result, outcome, report, on_step, test_each_evaluation)
        result["status"] = "ok"
    except Exception as error:  # a trial never takes its caller down; the reason says what happened
        fail(result, error, settings)
    return close_result(result, settings, outcome, started)


def new_result(settings: TrialSettings) -> dict:
    """A trial's result before it runs: what its settings say, the rest None."""
    return {"status": "running", "reason": None, "spec": settings.spec, "task": settings.task,
            "model": settings.model, "seed": settings.seed, "precision": None,
            "learning_rate": settings.learning_rate,
            "lr_choice": None, "protocol": None, "metric": None, "attention": None, "attention_choice": None,
            "phase_seconds": {}, "warm": {"model": False, "data": False},
            "dev": None, "test": None, "extra_tests": {}, "dev_metric": None, "params": None, "peak_memory_mb": None,
            "peak_host_memory_mb": None, "peak_device_memory_mb": None, "peak_host_memory_by": None,
            "gates": None, "delta_dir": None, "settings": settings.to_dict()}


def fail(result: dict, error: Exception, settings: TrialSettings) -> None:
    """Record `error` as the trial's failure: its one-line reason (and traceback, for an unexpected one)."""
    if isinstance(error, (NonFiniteLoss, UserError)):
        result.update(status="failed", reason=str(error))
        return
    if devices.is_out_of_memory(error):
        reason = devices.out_of_memory_reason(error, devices.pick_device(settings.device))
        if result.get("memory_retries"):
            reason += f"; it did not fit at micro-batches of {', '.join(map(str, result['memory_retries']))} rows"
    else:
        reason = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error) else ''}"
    result.update(status="failed", reason=reason, traceback=traceback.format_exc(limit=8))


def close_result(result: dict, settings: TrialSettings, outcome: TrainOutcome, started: float) -> dict:
    """The result with what training recorded and the trial's seconds (since `started`), written to
    `settings.out_dir` where there is one."""
    total = time.perf_counter() - started
    result.update(
        epochs_run=round(outcome.fidelity, 4), steps=outcome.steps, history=outcome.history,
        best_epoch=outcome.best["epoch"] if outcome.best else None, stopped_by=outcome.stopped_by,
        train_seconds=outcome.train_seconds, eval_seconds=result.get("eval_seconds", outcome.eval_seconds),
        total_seconds=total,
        examples_per_second=outcome.examples_seen / outcome.train_seconds if outcome.train_seconds else 0.0,
    )
    lr_seconds = (result.get("lr_choice") or {}).get("seconds", 0.0)
    result["overhead_seconds"] = total - result["train_seconds"] - result["eval_seconds"] - lr_seconds
    if settings.out_dir:
        write_result(Path(settings.out_dir), result)
    return result


def _run_fitting(settings: TrialSettings, result: dict, outcome: TrainOutcome, report, on_step,
                 test_each: bool) -> TrialSettings:
    """Run the trial; where it runs out of memory, again from the start at half the micro-batch (the same step
    of `batch_size` rows, its gradients accumulated), down to one row at a time; the settings it ran with. The
    retries are recorded (`memory_retries`: the micro-batch sizes that did not fit)."""
    tried = []
    while True:
        try:
            _run(settings, result, outcome, report, on_step, test_each)
            break
        except Exception as error:
            size = settings.micro_batch_size or settings.batch_size
            if not devices.is_out_of_memory(error) or size <= 1:
                if tried:
                    result["memory_retries"] = tried
                raise
            tried.append(size)
            log.warning("out of memory at a micro-batch of %d rows: again at %d", size, size // 2)
            devices.release_memory()
            settings = settings.replace(micro_batch_size=size // 2)
            outcome.reset()
            result.update(settings=settings.to_dict(), phase_seconds={})
    if tried:
        result["memory_retries"] = tried
    return settings


def _run(settings: TrialSettings, result: dict, outcome: TrainOutcome, report, on_step, test_each: bool) -> None:
    if is_generation(settings):
        return run_generation(settings, result, outcome, report, on_step)
    spec = delta.parse_spec(settings.spec)
    task = resolve_task(settings)
    model_name = resolve_model(settings.model)
    result.update(model=model_name, metric=task.metric, spec=spec.to_dict(), summary=spec.summary())
    if settings.threads:
        torch.set_num_threads(settings.threads)
    device = devices.pick_device(settings.device)
    phases = result["phase_seconds"]
    with devices.PeakMemory(device) as memory:  # this trial's peak, from data to test scores
        with timed(phases, "data"):
            data, result["warm"]["data"] = warm.trial_data(settings, model_name, task)
        result["protocol"] = data.protocol
        model, dtype = _build_model(settings, spec, task, model_name, data, device, result)

        consistency = max((method_of(m).extra_loss(m) for m in spec.methods), default=0.0)  # AdaMix's
        if test_each:
            report = _scoring_test(report, model, data, settings, device, dtype)
        objective = Classification(model, data, device, dtype, consistency, settings.distill)
        trained, choice = train_at_chosen_rate(objective, settings, report=report, on_step=on_step, outcome=outcome)
        result.update(learning_rate=choice.rate, lr_choice=choice.to_dict())
        conclude(result, settings, model, data, trained, device, dtype)
    result.update(memory.record())
    save(result, settings, model, spec, model_name, task)


def conclude(result: dict, settings: TrialSettings, model, data, trained: TrainOutcome, device, dtype) -> None:
    """After training (the best state back in `model`): its dev scores, gates, kept predictions and test scores."""
    phases, task = result["phase_seconds"], data.task
    predictions = result.setdefault("predictions", {}) if settings.keep_predictions else None
    best = trained.best
    result.update(dev=best["dev"], dev_metric=best["dev_metric"])
    result["gates"] = trained.gates  # recorded in the dev evaluation whose state was kept: no extra pass
    if settings.keep_predictions:  # the outputs of the dev evaluation whose state was kept: no extra pass
        with timed(phases, "predictions"):
            dev_outputs = trained.best_dev_outputs
            if dev_outputs is None:
                dev_outputs = forward_split(model, data.dev, settings, device, dtype)
            predictions.update(dev=from_outputs(dev_outputs, task.regression), dev_labels=data.dev.labels)
    with timed(phases, "test"):
        if settings.score_test and settings.keep_predictions:
            outputs = forward_split(model, data.test, settings, device, dtype)
            result["test"] = task.compute_metrics(outputs, data.test.labels)
            predictions.update(test=from_outputs(outputs, task.regression), test_labels=data.test.labels)
        elif settings.score_test:
            result["test"], _ = evaluate(model, data.test, task, settings, device, dtype)
        for split, features in data.extra_tests.items() if settings.score_test else ():
            result["extra_tests"][split], _ = evaluate(model, features, task, settings, device, dtype)
    result["eval_seconds"] = trained.eval_seconds + phases["test"]


def save(result: dict, settings: TrialSettings, model, spec, model_name: str, task) -> None:
    """Keep the trial's predictions and delta in `settings.out_dir` (nothing without one)."""
    if not settings.out_dir:
        return
    with timed(result["phase_seconds"], "save"):
        predictions = result.get("predictions")
        if predictions:  # on disk, not in the result a search worker sends back
            save_predictions(settings.out_dir, predictions)
            del result["predictions"]
        metadata = {"base_model": portable_name(model_name), **task_metadata(task)}
        result["delta_dir"] = str(delta.save_delta(model if settings.quantize else model.cpu(), spec,
                                                   Path(settings.out_dir) / "delta", metadata=metadata))


def _build_model(settings: TrialSettings, spec, task, model_name: str, data, device, result: dict):
    """The model with the delta in place, on `device`, its frozen weights in the trial's precision; the autocast
    dtype. Records precision, attention and parameter counts in `result`, and the seconds of each part."""
    phases = result["phase_seconds"]
    if settings.quantize:  # one line where it cannot run, before the model loads
        quantize.check(settings, spec.to_dict(), load_config(model_name, 2), device)
    precision = devices.trial_precision(settings, device)
    dtype = devices.autocast_dtype(precision)
    with timed(phases, "model"):
        torch.manual_seed(settings.seed)  # dropout draws from torch's global RNG (load_model seeds it again, alike)
        base = warm.classifier(model_name, task.num_labels, task.problem_type, settings.seed,
                               devices.load_dtype(precision),  # the frozen weights read in the trial's dtype
                               quantize=settings.quantize, device=device)
        model, result["warm"]["model"] = base.model, base.warm
        backbone.set_backbone_dropout(model, settings.backbone_dropout)  # before the delta: its dropout stays
        if task.regression:
            result["head_centered"] = backbone.center_regression_head(model, data.train.labels)
    with timed(phases, "attention"):
        attention = backbone.choose_attention(settings.attention, model, first_batch(data.train, settings.batch_size),
                                              device, dtype, settings.backbone_dropout, attention_cache(settings))
    backbone.set_attention(model, attention["attention"])
    result.update(attention=attention["attention"], attention_choice=attention)
    with timed(phases, "delta"):
        checkpointing = backbone.resolve_checkpointing(model, settings.gradient_checkpointing, spec, generation=False)
        backbone.set_gradient_checkpointing(model, checkpointing, spec)
        result["gradient_checkpointing"] = checkpointing
        delta.apply_delta(model, spec, seed=settings.seed)
        model.to(device)
        settle_dtypes(model, dtype)  # what trains in fp32 (BitFit's biases too), the frozen linears in dtype
        base.own_trainable()  # nothing it trains is the held model's
    result["precision"] = precision
    result["params"] = delta.count_parameters(spec, model.config, task.num_labels).to_dict()
    return model, dtype


@contextlib.contextmanager
def timed(phases: dict, name: str):
    """Add the seconds the block takes to `phases[name]`."""
    started = time.perf_counter()
    try:
        yield
    finally:
        phases[name] = phases.get(name, 0.0) + time.perf_counter() - started


def attention_cache(settings: TrialSettings) -> Path:
    """Where `auto` attention choices are kept for this machine: beside the tokenisation cache."""
    return (Path(settings.cache_dir) if settings.cache_dir else default_cache_dir()) / "attention.json"


def first_batch(train, batch_size: int) -> dict:
    """The first `batch_size` training rows as one padded batch: the shape an `auto` attention is timed on."""
    return pad_batch(train, range(min(batch_size, len(train))))


def _scoring_test(report, model, data, settings, device, dtype):
    """`report` that first adds the test metric and the seconds since training began (training and dev
    evaluations, not these test scorings) to each dev evaluation."""
    started, scoring = time.perf_counter(), 0.0

    def scored(entry: dict):
        nonlocal scoring
        begun = time.perf_counter()
        test, _ = evaluate(model, data.test, data.task, settings, device, dtype)
        model.train()  # evaluate leaves the model in eval mode; training goes on after the report
        entry.update(test_metric=test[data.task.metric], seconds=round(begun - started - scoring, 3))
        scoring += time.perf_counter() - begun
        return report(entry) if report is not None else None

    return scored


def task_metadata(task) -> dict:
    """What `autopelt predict` needs of the task: its name, and for your own data its columns and labels."""
    return {"task": task.name, "text_columns": list(task.text_columns), "label_names": list(task.label_names)}


def write_result(out_dir: Path, result: dict) -> None:
    """result.json without the predictions' arrays (they live in predictions.npz)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    kept = {k: v for k, v in result.items() if k != "predictions"}
    write_atomic(out_dir / RESULT_FILE, json.dumps(kept, indent=2, default=str))

"""Whether a wall-time budget holds the plan's first steps — the baselines and the portfolio's first configuration —
said before the study starts.

A trial's time comes from the study's own trials where some trained to the end (their median), else from one
training step of the portfolio's first configuration timed on this machine, times the steps of its epochs, plus its
evaluations. A budget that holds the portfolio's first but not the baselines too runs the portfolio's first alone
(the prior's favourite answers most tasks best: docs/portfolio.md), and says so; one that holds neither is a
UserError that names the time it would need.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

from autopelt.errors import UserError
from autopelt.search.budget import TimeBudget, format_duration
from autopelt.train.settings import TrialSettings

SWEEP_TRIALS = 2.0  # a baseline that sweeps its learning rate costs about this many trials (docs/search.md)
EVAL_SHARE = 1 / 3  # an evaluation step (forward only) against a training step of as many rows
MARGIN = 1.2  # what a trial takes beyond its steps: loading the model, tokenising, writing the delta
SAMPLE_ROWS = 256  # train rows tokenised to size the batches


@dataclass(frozen=True)
class Estimate:
    seconds: float  # one trial of the portfolio's first configuration, to its last epoch
    how: str  # "the study's own trials" or "a measured training step: 0.21 s at batch 32 x 48 tokens"


def fit_time_budget(plan, records=()):
    """The plan as a wall-time budget can run it: as it is, or the portfolio's first alone (`plan.fit_note` says
    why). Only a plan with a portfolio on a wall-time budget is checked.

    Args:
        plan: the SearchPlan (search/plan.py).
        records: the study's TrialRecords when it exists (their times are the estimate).
    Returns:
        The plan, with `baselines` emptied and `fit_note` set when only the portfolio's first fits.
    Raises:
        UserError: the budget cannot hold the portfolio's first configuration; the line names the time it needs.
    """
    if not isinstance(plan.budget, TimeBudget) or plan.portfolio is None or not plan.portfolio.members:
        return plan
    trained = any(r.portfolio.get("rank") == 0 and r.state.name in ("COMPLETE", "PRUNED") for r in records)
    if trained:
        return plan  # the study ran its first already: what is left of it needs no room
    estimate = estimate_trial(plan, records)
    first = estimate.seconds
    baselines = sum(SWEEP_TRIALS if name not in (plan.portfolio.baseline_rates or {}) else 1.0
                    for name in plan.baselines) * first
    budget = plan.budget.seconds
    if budget >= first + baselines:
        return plan
    if budget < first:
        raise UserError(f"--budget {plan.budget} cannot hold the portfolio's first configuration: a trial takes about "
                        f"{format_duration(first)} ({estimate.how}); give --budget {_minutes(first + baselines)} or "
                        f"more to run it and the baseline(s)")
    note = (f"budget {plan.budget}: the portfolio's first configuration alone (about {format_duration(first)}, "
            f"{estimate.how}); --budget {_minutes(first + baselines)} runs {', '.join(plan.baselines)} too")
    if plan.portfolio.calibrate:  # its calibration is a baseline: the members train at their recorded rates
        note += f"; the portfolio's rates as measured on {plan.portfolio.model} (no time for LoRA's calibration)"
    return dataclasses.replace(plan, baselines=[], fit_note=note,
                               portfolio=dataclasses.replace(plan.portfolio, calibrate=False))


def estimate_trial(plan, records=()) -> Estimate:
    """Seconds of one trial of the portfolio's first configuration on this machine (see the module doc)."""
    from autopelt.search.finalists import seconds_per_trial

    own = seconds_per_trial(records)
    if own is not None:
        return Estimate(own, "the median of the study's own trials")
    hparams = plan.portfolio.hparams(0, plan.epochs)
    batch = int(plan.options.batch_size or hparams.get("batch_size") or TrialSettings.batch_size)
    length = _batch_length(plan, batch)
    step = measure_step_seconds(plan, batch, length)
    sizes = plan.data.sizes if plan.data is not None else {"train": batch, "dev": batch}
    steps = math.ceil(sizes["train"] / batch) * plan.epochs
    evaluations = math.ceil(sizes["dev"] / batch) * plan.epochs * EVAL_SHARE
    return Estimate(MARGIN * step * (steps + evaluations),
                    f"a measured training step: {step:.2g} s at batch {batch} x {length} tokens, {steps} steps")


def measure_step_seconds(plan, batch: int, length: int) -> float:
    """Seconds of one training step (forward and backward, the base frozen) of the portfolio's first configuration
    at `batch` rows of `length` tokens, as a trial takes it: on the trials' kind of device (the first GPU where they
    get one, else this CPU at their threads) and in their precision (`--precision` resolved there: the frozen linears
    stored in its dtype and the step under its autocast, as train/trial.py builds a model); the best of two after a
    warm-up. The model's memory goes back before it returns (to the GPU too), so the trials start with all of it.

    Raises:
        UserError: the step ran out of memory (one line: what to change).
    """
    import torch

    from autopelt.train import device as devices

    device = torch.device("cuda:0" if torch.cuda.is_available() and plan.gpus_per_trial else "cpu")
    precision = devices.resolve_precision(plan.options.precision, device)
    threads = torch.get_num_threads()
    reason = None
    try:
        if device.type == "cpu":
            torch.set_num_threads(max(1, int(plan.cpus_per_trial)))
        seconds = _timed_steps(plan, batch, length, device, precision)
    except Exception as error:  # noqa: BLE001 - out of memory is bad input; anything else goes up as it is
        if not devices.is_out_of_memory(error):
            raise
        reason = devices.out_of_memory_reason(error, device)
    finally:
        torch.set_num_threads(threads)
    devices.release_memory()  # after the except clause: its traceback, which held the model, is gone
    if reason:
        raise UserError(f"the budget check's training step at batch {batch} x {length} tokens: {reason}")
    return seconds


def _timed_steps(plan, batch: int, length: int, device, precision: str) -> float:
    """The best of two timed steps after a warm-up; the model lives in this frame alone."""
    import torch

    from autopelt.delta import apply_delta
    from autopelt.dtypes import settle_dtypes
    from autopelt.models import load_model
    from autopelt.train import device as devices

    dtype = devices.autocast_dtype(precision)
    model = load_model(plan.model, plan.num_labels, dtype=devices.load_dtype(precision))
    model = apply_delta(model, plan.portfolio.members[0].spec(plan.num_layers)).to(device).train()
    settle_dtypes(model, dtype)
    vocab = max(4, min(int(model.config.vocab_size), 1000))
    ids = torch.randint(3, vocab, (batch, length), device=device)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids),
              "labels": torch.zeros(batch, dtype=torch.long, device=device)}
    best = math.inf
    for round_ in range(3):
        started = time.perf_counter()
        with devices.autocast(device, dtype):
            loss = model(**inputs).loss
        loss.backward()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if round_:
            best = min(best, time.perf_counter() - started)
    return best


def _batch_length(plan, batch: int) -> int:
    """The padded length of a training batch: the mean over batches of a sample of train rows of their longest."""
    from autopelt.models import load_tokenizer

    rows = list(plan.data.sample) if plan.data is not None else []
    longest = plan.options.max_length or TrialSettings.max_length
    if not rows:
        return longest
    tokenizer = load_tokenizer(plan.model)
    columns = plan.data.task.text_columns
    texts = [[str(row[column]) for row in rows] for column in columns]
    encoded = tokenizer(*texts, truncation=True, max_length=longest)["input_ids"]
    lengths = [len(ids) for ids in encoded]
    chunks = [lengths[i:i + batch] for i in range(0, len(lengths), batch)]
    return max(1, round(sum(max(chunk) for chunk in chunks) / len(chunks)))


def _minutes(seconds: float) -> str:
    """A --budget that holds `seconds`: whole minutes, rounded up."""
    return f"{max(1, math.ceil(seconds / 60))}m"

"""One generation trial, with the result dict of a classification trial (`run_trial` hands generation tasks here):
`dev_metric` is minus the dev loss (higher is better, as every metric a study maximises), `test` holds BLEU and
ROUGE-L over the distinct test inputs (None when `score_test` is off: a search trial, scored later if it answers)."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from autopelt import delta, quantize
from autopelt.data.generation import PROMPT, load_generation_splits, make_generation_splits
from autopelt.dtypes import settle_dtypes
from autopelt.models import load_config, load_language_model, load_tokenizer, portable_name, resolve_model
from autopelt.train import backbone, device as devices, warm
from autopelt.train.generate import (
    MAX_NEW_TOKENS, Generation, check_generation_tokenizer, check_generator, encode, generation_task, score_generation,
)
from autopelt.train.lr_sweep import GENERATION, train_at_chosen_rate


def run_generation(settings, result: dict, outcome, report=None, on_step=None) -> None:
    """Fill `result` (run_trial's record) and `outcome` (its TrainOutcome) for a generation task; raises UserError
    on bad input."""
    spec = delta.parse_spec(settings.spec)
    task = generation_task(settings)
    model_name = resolve_model(settings.model)
    loaded = load_generation_splits(task, settings.data_dir)  # bad columns fail before any model loads
    k = settings.protocol if isinstance(settings.protocol, int) else None
    splits = make_generation_splits(loaded, task, k, settings.split_seed, settings.dev_size)
    result.update(model=model_name, metric="bleu", spec=spec.to_dict(), summary=spec.summary(),
                  protocol=splits.info)
    if settings.threads:
        torch.set_num_threads(settings.threads)
    device = devices.pick_device(settings.device)
    with devices.PeakMemory(device) as memory:
        model, tokenizer = _train(settings, spec, task, splits, model_name, device, result, outcome, report, on_step)
    result.update(memory.record())
    if settings.out_dir:
        metadata = {"base_model": portable_name(model_name), "task": task.name, "generation": {
            "input_column": task.input_column, "target_column": task.target_column, "prompt": PROMPT}}
        result["delta_dir"] = str(delta.save_delta(model if settings.quantize else model.cpu(), spec,
                                                   Path(settings.out_dir) / "delta", metadata=metadata))


def _train(settings, spec, task, splits, model_name, device, result, outcome, report, on_step):
    tokenizer = warm.tokenizer(model_name)
    check_generation_tokenizer(tokenizer, model_name)
    if settings.quantize:  # one line where it cannot run, before the model loads
        quantize.check(settings, spec.to_dict(), load_config(model_name, 2), device)
    precision = devices.trial_precision(settings, device)
    dtype = devices.autocast_dtype(precision)
    base = warm.language_model(model_name, settings.seed, devices.load_dtype(precision),
                               quantize=settings.quantize, device=device)
    model, result["warm"]["model"] = base.model, base.warm  # its rows are encoded per trial
    check_generator(model.config)
    checkpointing = backbone.resolve_checkpointing(model, settings.gradient_checkpointing, spec, generation=True)
    backbone.set_gradient_checkpointing(model, checkpointing, spec)
    result["gradient_checkpointing"] = checkpointing
    delta.apply_delta(model, spec, seed=settings.seed)
    model.to(device)
    settle_dtypes(model, dtype)  # the delta in fp32, the frozen linears in the trial's dtype
    base.own_trainable()  # nothing it trains is the held model's
    result.update(precision=precision, params=delta.count_parameters(spec, model.config, lm=True).to_dict())
    seq2seq = bool(model.config.is_encoder_decoder)
    rows = lambda split: [encode(tokenizer, task, r, settings.max_length, seq2seq) for r in split]  # noqa: E731
    objective = Generation(model, rows(splits.train), rows(splits.dev), tokenizer.pad_token_id, device, dtype)
    trained, choice = train_at_chosen_rate(objective, settings, GENERATION, report, on_step, outcome)
    result.update(learning_rate=choice.rate, lr_choice=choice.to_dict())
    result.update(dev=trained.best["dev"], dev_metric=trained.best["dev_metric"])
    started = time.perf_counter()
    if settings.score_test:
        result["test"], samples = score_generation(model, tokenizer, splits.test, task, settings.eval_batch_size,
                                                   settings.max_new_tokens or MAX_NEW_TOKENS, device, dtype)
        result["samples"] = [{"input": i, "text": t} for i, t in samples[:5]]
    result["eval_seconds"] = trained.eval_seconds + time.perf_counter() - started
    return model, tokenizer


def score_saved_generation(settings, delta_dir) -> dict:
    """BLEU and ROUGE-L on test of a trial's saved delta, generated as the trial would have (saved.score_saved)."""
    task = generation_task(settings)
    model_name = resolve_model(settings.model)
    splits = make_generation_splits(load_generation_splits(task, settings.data_dir), task,
                                    settings.protocol if isinstance(settings.protocol, int) else None,
                                    settings.split_seed, settings.dev_size)
    if settings.threads:
        torch.set_num_threads(settings.threads)
    device = devices.pick_device(settings.device)
    tokenizer = load_tokenizer(model_name)
    precision = devices.trial_precision(settings, device)
    dtype = devices.autocast_dtype(precision)
    model = load_language_model(model_name, seed=settings.seed, dtype=devices.load_dtype(precision),
                                quantize=settings.quantize, device=device)
    delta.load_delta(model, delta_dir, seed=settings.seed)
    model.to(device)
    settle_dtypes(model, dtype)
    test, _ = score_generation(model, tokenizer, splits.test, task, settings.eval_batch_size,
                               settings.max_new_tokens or MAX_NEW_TOKENS, device, dtype)
    return test

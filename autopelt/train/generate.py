"""A generation trial: train a delta on a decoder's (or T5's) language model on the target tokens only, keep the
state of the best dev loss, then generate greedily for each distinct test input (batched, left-padded, KV cache)
and score BLEU and ROUGE-L against all of its references.

The dev loss selects (cheap: one teacher-forced pass); BLEU needs generation, so it is computed on test only, and
on a dev subset only when asked (`dev_generate`)."""

from __future__ import annotations

import math
import time

import torch
from torch import nn

from autopelt import delta
from autopelt.data.generation import (
    GenerationTask, corpus_scores, generation_task_of, load_generation_splits, make_generation_splits,
    references_by_input,
)
from autopelt.delta.sites import architecture_of
from autopelt.errors import UserError
from autopelt.train import device as devices
from autopelt.train.loop import warmup_then_linear

IGNORE = -100  # label of a token the loss skips: the prompt's and padding
DEFAULT_RATE = 1e-3  # without --lr: no learning-rate range test runs for generation yet
MAX_NEW_TOKENS = 64


def generation_task(settings) -> GenerationTask:
    task = generation_task_of(settings.task, settings.custom_task)
    if task is None:
        raise ValueError(f"{settings.task} is not a generation task (no target column)")
    return task


def is_generation(settings) -> bool:
    return generation_task_of(settings.task, settings.custom_task) is not None


def check_generator(config) -> None:
    """A one-line error unless the model can generate (a decoder or T5)."""
    arch = architecture_of(config)
    if not (arch.causal or getattr(config, "is_encoder_decoder", False)):
        raise UserError(f"a generation task needs a model that generates (llama, qwen2, mistral, gpt2, t5); "
                        f"{arch.family} is an encoder with a classifier head")


def check_generation_inputs(settings, task: GenerationTask) -> None:
    """One line before any training: the data folder and both columns exist, and the model can generate."""
    from autopelt.models import load_config, resolve_model

    load_generation_splits(task, settings.data_dir)
    check_generator(load_config(resolve_model(settings.model), 2))


def encode(tokenizer, task: GenerationTask, row: dict, max_length: int, seq2seq: bool) -> dict:
    """Token ids of one training row; `labels` marks the target tokens (ended by end-of-text), IGNORE elsewhere."""
    prompt = tokenizer(task.prompt(row))["input_ids"]
    target = tokenizer(" " + row[task.target_column], add_special_tokens=False)["input_ids"]
    target = (target + [tokenizer.eos_token_id])[: max(1, max_length - len(prompt))]
    if seq2seq:
        return {"input_ids": prompt[:max_length], "labels": target}
    ids = (prompt + target)[-max_length:]
    labels = ([IGNORE] * len(prompt) + target)[-max_length:]
    return {"input_ids": ids, "labels": labels}


def collate(examples: list[dict], pad_id: int, left: bool = False) -> dict[str, torch.Tensor]:
    """Pad to the longest row (on the left for generation), with an attention mask; labels padded with IGNORE."""
    width = max(len(e["input_ids"]) for e in examples)
    batch = {"input_ids": [], "attention_mask": []}
    for e in examples:
        pad = width - len(e["input_ids"])
        side = (lambda seq, fill: [fill] * pad + seq) if left else (lambda seq, fill: seq + [fill] * pad)
        batch["input_ids"].append(side(e["input_ids"], pad_id))
        batch["attention_mask"].append(side([1] * len(e["input_ids"]), 0))
    if "labels" in examples[0]:
        widest = max(len(e["labels"]) for e in examples)
        batch["labels"] = [e["labels"] + [IGNORE] * (widest - len(e["labels"])) for e in examples]
    return {k: torch.tensor(v, dtype=torch.long) for k, v in batch.items()}


def lm_loss(model: nn.Module, batch: dict) -> tuple[torch.Tensor, int]:
    """Mean cross-entropy over target tokens, and their number (a causal LM predicts token t+1 at t)."""
    labels = batch["labels"]
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                   **({"labels": labels} if model.config.is_encoder_decoder else {})).logits
    if not model.config.is_encoder_decoder:
        logits, labels = logits[:, -labels.shape[1]:][:, :-1], labels[:, 1:]  # a prompt may have put L tokens first
    targets = int((labels != IGNORE).sum())
    loss = nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                       ignore_index=IGNORE)
    return loss, targets


@torch.no_grad()
def dev_loss(model, examples, pad_id, batch_size, device, dtype) -> float:
    model.eval()
    total = count = 0
    for start in range(0, len(examples), batch_size):
        batch = {k: v.to(device) for k, v in collate(examples[start:start + batch_size], pad_id).items()}
        with devices.autocast(device, dtype):
            loss, targets = lm_loss(model, batch)
        total, count = total + float(loss) * targets, count + targets
    return total / max(1, count)


@torch.no_grad()
def generate(model, tokenizer, prompts: list[str], batch_size: int, max_new_tokens: int, device,
             dtype=None) -> list[str]:
    """Greedy continuations of `prompts`, longest first in left-padded batches with the KV cache, in input order
    (each cut at its first line break)."""
    model.eval()
    encoded = [tokenizer(p)["input_ids"] for p in prompts]
    order = sorted(range(len(prompts)), key=lambda i: -len(encoded[i]))
    texts: list[str] = [""] * len(prompts)
    eos = tokenizer.eos_token_id
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        batch = {k: v.to(device) for k, v in
                 collate([{"input_ids": encoded[i]} for i in rows], tokenizer.pad_token_id, left=True).items()}
        with devices.autocast(device, dtype):
            out = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                                 pad_token_id=tokenizer.pad_token_id, eos_token_id=eos)
        new = out if model.config.is_encoder_decoder else out[:, batch["input_ids"].shape[1]:]
        for i, ids in zip(rows, new):
            texts[i] = tokenizer.decode(ids, skip_special_tokens=True).strip().split("\n")[0].strip()
    return texts


def score_generation(model, tokenizer, rows, task, batch_size, max_new_tokens, device, dtype) -> tuple[dict, list]:
    """BLEU and ROUGE-L of one greedy text per distinct input of `rows`; and the (input, text) pairs."""
    inputs, references = references_by_input(rows, task)
    texts = generate(model, tokenizer, [task.prompt(r) for r in inputs], batch_size, max_new_tokens, device, dtype)
    return corpus_scores(texts, references), [(r[task.input_column], t) for r, t in zip(inputs, texts)]


def train_generation(model, train, dev, settings, pad_id, device, dtype, on_step=None, report=None) -> dict:
    """AdamW on the delta, warm-up then linear decay; the dev loss after each epoch; the best state restored."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimiser = torch.optim.AdamW(params, lr=settings.learning_rate or DEFAULT_RATE,
                                  weight_decay=settings.weight_decay)
    steps_per_epoch = math.ceil(len(train) / settings.batch_size)
    total = settings.max_steps or steps_per_epoch * settings.epochs
    schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, warmup_then_linear(total, settings.warmup_ratio))
    generator = torch.Generator().manual_seed(settings.seed)
    best, history, step, seconds = None, [], 0, 0.0
    while step < total:
        started = time.perf_counter()
        model.train()
        for index in torch.randperm(len(train), generator=generator).split(settings.batch_size):
            batch = {k: v.to(device) for k, v in collate([train[i] for i in index], pad_id).items()}
            delta.route_all(model, generator)
            with devices.autocast(device, dtype):
                loss, _ = lm_loss(model, batch)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, settings.grad_clip)
            optimiser.step(), schedule.step(), optimiser.zero_grad()
            step += 1
            if on_step:
                on_step(step, total, float(loss.detach()))
            if step >= total:
                break
        seconds += time.perf_counter() - started
        loss = dev_loss(model, dev, pad_id, settings.eval_batch_size, device, dtype)
        entry = {"epoch": round(step / steps_per_epoch, 4), "step": step, "dev": {"loss": loss}, "dev_loss": loss,
                 "dev_metric": -loss}
        history.append(entry)
        if best is None or entry["dev_loss"] < best["entry"]["dev_loss"]:
            best = {"entry": entry, "state": {id(p): p.detach().clone() for p in params}}
        if report and report(entry):
            break
    with torch.no_grad():
        for p in params:
            p.copy_(best["state"][id(p)])
    return {"best": best["entry"], "history": history, "steps": step, "train_seconds": seconds}

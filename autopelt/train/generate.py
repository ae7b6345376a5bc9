"""A generation trial: train a delta on a decoder's (or T5's) language model on the target tokens only, keep the
state of the best dev loss, then generate greedily for each distinct test input (batched, left-padded, KV cache)
and score BLEU and ROUGE-L against all of its references.

The dev loss selects (cheap: one teacher-forced pass); BLEU needs generation, so it is computed on test only, and
on a dev subset only when asked (`dev_generate`)."""

from __future__ import annotations

import copy
import math
import time

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from autopelt import delta
from autopelt.data.generation import (
    GenerationTask, corpus_scores, generation_task_of, load_generation_splits, references_by_input,
)
from autopelt.delta.families import architecture_of
from autopelt.errors import UserError
from autopelt.train import device as devices
from autopelt.train.loop import NonFiniteLoss, warmup_then_linear

IGNORE = -100  # label of a token the loss skips: the prompt's and padding
DEFAULT_RATE = 1e-3  # the rate a generation delta trains at where none is given and no sweep runs
SWEEP_START = (3e-4, 1e-3, 3e-3)  # a generation sweep's first candidates: LoRA's usual decade on decoders
SWEEP_MAX = 5  # candidates at most, walking the half-decade ladder while the best sits at an edge
MAX_NEW_TOKENS = 64
LOSS_ROWS = 512  # target tokens whose logits are computed at once: a (LOSS_ROWS, vocabulary) block in fp32 at most
# Families whose language model's logits are its head on the backbone's last states, nothing after (read in
# transformers 5's modeling files: no soft-capping as Gemma 2 and 3 have, no scale; tests/test_generation_loss.py
# checks those it has tiny models of against the model's own logits): their loss computes the head at the target
# positions alone. Any other family's loss reads the model's whole logits, in the dtype it computes in.
HEAD_ON_LAST_STATE = frozenset({"llama", "mistral", "qwen2", "qwen3", "gemma", "phi3", "olmo2", "gpt2"})


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


def check_generation_tokenizer(tokenizer, model: str) -> None:
    """A one-line error unless the tokenizer has an end-of-sequence token: it ends every target (`encode`), and
    generation stops at it."""
    if tokenizer.eos_token_id is None:
        from autopelt.models import model_name

        raise UserError(f"the tokenizer of {model_name(model)} has no end-of-sequence token, which ends every "
                        "generation target: give it one (tokenizer.eos_token = '...', then tokenizer.save_pretrained "
                        "into the model folder) or pass a model whose tokenizer has one")


def check_generation_inputs(settings, task: GenerationTask) -> None:
    """One line before any training: the data folder and both columns exist, the model can generate and its
    tokenizer ends a text."""
    from autopelt.models import load_config, load_tokenizer, resolve_model

    load_generation_splits(task, settings.data_dir)
    model = resolve_model(settings.model)
    check_generator(load_config(model, 2))
    check_generation_tokenizer(load_tokenizer(model), model)


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
    """Mean cross-entropy over target tokens, and their number (a causal LM predicts token t+1 at t).

    The logits that count are those at target positions (a decoder's prompt and padding have none): where the
    family allows (HEAD_ON_LAST_STATE) the backbone's states are taken there and only they go through the head;
    the cross-entropy then runs LOSS_ROWS targets at a time, each block cast to fp32 alone and, under autograd,
    recomputed in the backward pass instead of kept. So no (batch, length, vocabulary) tensor is ever cast to
    fp32: at batch 128 and a 128k vocabulary one would be about 20 GB."""
    labels = batch["labels"]
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    if model.config.is_encoder_decoder:  # T5: the decoder reads the targets shifted right, as labels= would
        inputs["decoder_input_ids"] = model.prepare_decoder_input_ids_from_labels(labels=labels)
        rows, head = model(**inputs).logits, None
    elif model.config.model_type in HEAD_ON_LAST_STATE:
        rows, head = architecture_of(model.config).backbone_of(model)(**inputs).last_hidden_state, \
            model.get_output_embeddings()
    else:
        rows, head = model(**inputs).logits, None
    if not model.config.is_encoder_decoder:
        rows, labels = rows[:, -labels.shape[1]:][:, :-1], labels[:, 1:]  # a prompt may have put L tokens first
    kept = labels != IGNORE
    targets = int(kept.sum())
    return _summed_cross_entropy(head, rows[kept], labels[kept]) / targets, targets


def _summed_cross_entropy(head: nn.Module | None, rows: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The summed fp32 cross-entropy of `head(rows)` ((N, H) states, or with no head (N, V) logits) against
    `targets` (N,), LOSS_ROWS rows at a time."""
    total = torch.zeros((), dtype=torch.float32, device=rows.device)
    for start in range(0, rows.shape[0], LOSS_ROWS):
        block = (head, rows[start:start + LOSS_ROWS], targets[start:start + LOSS_ROWS])
        if torch.is_grad_enabled() and rows.requires_grad:  # the block's logits are recomputed in the backward pass
            total = total + checkpoint(_block_cross_entropy, *block, use_reentrant=False, preserve_rng_state=False)
        else:
            total = total + _block_cross_entropy(*block)
    return total


def _block_cross_entropy(head: nn.Module | None, rows: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = rows if head is None else head(rows)
    return nn.functional.cross_entropy(logits.float(), targets, reduction="sum")


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
    """AdamW on the delta, warm-up then linear decay; the dev loss after each epoch; the best state restored. At
    `settings.learning_rate`, or, when it is None, at the rate `sweep_generation_rate` chooses (the result's
    "lr_choice" says which and how)."""
    if settings.learning_rate is not None:
        run = GenerationRun(model, train, dev, settings, settings.learning_rate, pad_id, device, dtype, on_step, report)
        run.run()
        return {**run.finish(), "lr_choice": {"rate": settings.learning_rate, "how": "given", "seconds": 0.0}}
    run, choice = sweep_generation_rate(model, train, dev, settings, pad_id, device, dtype, on_step)
    run.report, run.on_step = report, on_step
    for entry in run.history:  # the scheduler sees the evaluation so far, as in any trial
        if report and report(entry):
            run.stopped = True
    run.run()
    return {**run.finish(), "lr_choice": choice}


class GenerationRun:
    """One generation training run at one rate that can pause after an epoch's dev loss and go on: `snapshot` and
    `restore` carry its whole state (the delta's weights, optimiser, schedule, batch order, dropout's random
    state, what it recorded), so a sweep's winner goes on exactly as a run given its rate from the start."""

    def __init__(self, model, train, dev, settings, rate: float, pad_id, device, dtype, on_step=None, report=None):
        self.model, self.train, self.dev, self.settings = model, train, dev, settings
        self.pad_id, self.device, self.dtype, self.on_step, self.report = pad_id, device, dtype, on_step, report
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.optimiser = torch.optim.AdamW(self.params, lr=rate, weight_decay=settings.weight_decay)
        self.steps_per_epoch = math.ceil(len(train) / settings.batch_size)
        self.total = settings.max_steps or self.steps_per_epoch * settings.epochs
        self.schedule = torch.optim.lr_scheduler.LambdaLR(self.optimiser,
                                                          warmup_then_linear(self.total, settings.warmup_ratio))
        self.scaler = devices.grad_scaler(device, dtype)  # fp16's loss scale, as the classification loop's
        self.generator = torch.Generator().manual_seed(settings.seed)
        self.best, self.history, self.step, self.seconds, self.stopped = None, [], 0, 0.0, False

    def run(self, epochs: int | None = None) -> None:
        """Train `epochs` more epochs (None: to the end), each ending in a dev loss."""
        done = 0
        while self.step < self.total and not self.stopped and (epochs is None or done < epochs):
            self._epoch()
            done += 1

    def _epoch(self) -> None:
        started = time.perf_counter()
        self.model.train()
        for index in torch.randperm(len(self.train), generator=self.generator).split(self.settings.batch_size):
            batch = {k: v.to(self.device) for k, v in collate([self.train[i] for i in index], self.pad_id).items()}
            delta.route_all(self.model, self.generator)
            with devices.autocast(self.device, self.dtype):
                loss, _ = lm_loss(self.model, batch)
            if not torch.isfinite(loss):
                raise NonFiniteLoss(f"the training loss became {float(loss)} at step {self.step + 1}")
            devices.optimiser_step(loss, self.optimiser, self.scaler, self.params, self.settings.grad_clip)
            self.schedule.step(), self.optimiser.zero_grad()
            self.step += 1
            if self.on_step:
                self.on_step(self.step, self.total, float(loss.detach()))
            if self.step >= self.total:
                break
        self.seconds += time.perf_counter() - started
        loss = dev_loss(self.model, self.dev, self.pad_id, self.settings.eval_batch_size, self.device, self.dtype)
        entry = {"epoch": round(self.step / self.steps_per_epoch, 4), "step": self.step, "dev": {"loss": loss},
                 "dev_loss": loss, "dev_metric": -loss}
        self.history.append(entry)
        if math.isfinite(loss) and (self.best is None or loss < self.best["entry"]["dev_loss"]):
            self.best = {"entry": entry, "state": [p.detach().clone() for p in self.params]}
        if self.report and self.report(entry):
            self.stopped = True

    def finish(self) -> dict:
        """Put the best dev loss's state back; what the run recorded."""
        if self.best is None:
            raise NonFiniteLoss("the dev loss was never finite")
        with torch.no_grad():
            for param, value in zip(self.params, self.best["state"]):
                param.copy_(value)
        return {"best": self.best["entry"], "history": self.history, "steps": self.step,
                "train_seconds": self.seconds}

    def snapshot(self) -> dict:
        return {"params": [p.detach().clone() for p in self.params],
                "optimiser": copy.deepcopy(self.optimiser.state_dict()), "schedule": self.schedule.state_dict(),
                "scaler": self.scaler.state_dict(), "generator": self.generator.get_state(),
                "rng": devices.rng_state(self.device),
                "recorded": copy.deepcopy((self.best, self.history, self.step, self.seconds, self.stopped))}

    def restore(self, snapshot: dict) -> None:
        with torch.no_grad():
            for param, value in zip(self.params, snapshot["params"]):
                param.copy_(value)
        self.optimiser.load_state_dict(snapshot["optimiser"])
        self.schedule.load_state_dict(snapshot["schedule"])
        self.scaler.load_state_dict(snapshot["scaler"])
        self.generator.set_state(snapshot["generator"])
        devices.set_rng_state(self.device, snapshot["rng"])
        self.best, self.history, self.step, self.seconds, self.stopped = copy.deepcopy(snapshot["recorded"])


def sweep_generation_rate(model, train, dev, settings, pad_id, device, dtype, on_step=None):
    """The learning-rate sweep of a generation trial: each candidate trains from the same initial state on the same
    batches, on the trial's own schedule, to the end of epoch 1; the lowest dev loss (a candidate whose loss became
    non-finite loses) goes on from where it stands. Candidates start at SWEEP_START and walk along the half-decade
    ladder while the best sits at an edge, up to SWEEP_MAX candidates. Returns (the winner's run, its rate at
    epoch 1, restored; the choice as a result's "lr_choice": rate, "how": "sweep", each candidate's dev loss, the
    seconds the losers took)."""
    from autopelt.train.lr_sweep import LADDER

    initial = [p.detach().clone() for p in model.parameters() if p.requires_grad]
    rng = devices.rng_state(device)
    tried: dict[float, tuple] = {}  # rate -> (dev loss or inf, snapshot, seconds)

    def try_rate(rate: float) -> None:
        started = time.perf_counter()
        with torch.no_grad():
            for param, value in zip((p for p in model.parameters() if p.requires_grad), initial):
                param.copy_(value)
        devices.set_rng_state(device, rng)
        run = GenerationRun(model, train, dev, settings, rate, pad_id, device, dtype)
        try:
            run.run(epochs=1)
            loss = run.history[-1]["dev_loss"]
        except NonFiniteLoss:
            loss = math.inf
        tried[rate] = (loss if math.isfinite(loss) else math.inf, run.snapshot(), time.perf_counter() - started)

    for rate in SWEEP_START:
        try_rate(rate)
    while len(tried) < SWEEP_MAX:
        best = min(tried, key=lambda r: tried[r][0])
        edge = LADDER.index(best) + (1 if best == max(tried) else -1 if best == min(tried) else 0)
        if best not in (min(tried), max(tried)) or not 0 <= edge < len(LADDER) or LADDER[edge] in tried:
            break
        try_rate(LADDER[edge])
    best = min(tried, key=lambda r: (tried[r][0], r))
    if not math.isfinite(tried[best][0]):
        raise NonFiniteLoss(f"every rate of the sweep ({', '.join(f'{r:g}' for r in sorted(tried))}) diverged")
    winner = GenerationRun(model, train, dev, settings, best, pad_id, device, dtype, on_step)
    winner.restore(tried[best][1])
    choice = {"rate": best, "how": "sweep", "seconds": round(sum(t[2] for r, t in tried.items() if r != best), 3),
              "candidates": {f"{r:g}": {"dev_loss": None if math.isinf(t[0]) else round(t[0], 5)}
                             for r, t in sorted(tried.items())}, "steps": winner.step}
    return winner, choice

"""A generation trial's parts: a delta trains on a decoder's (or T5's) language model on the target tokens only
(`Generation`, the objective the training run is given), the state of the best dev loss is kept, then greedy
generation for each distinct test input (batched, left-padded, KV cache) is scored by BLEU and ROUGE-L against all
of its references.

The dev loss selects (cheap: one teacher-forced pass); BLEU needs generation, so it is computed on test only."""

from __future__ import annotations

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
from autopelt.train.loop import Evaluation, Objective

IGNORE = -100  # label of a token the loss skips: the prompt's and padding
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
        rows = rows[:, -labels.shape[1]:][:, :-1]  # a prompt may have put L tokens first
    labels = predicted(labels, model.config)
    kept = labels != IGNORE
    targets = int(kept.sum())
    return _summed_cross_entropy(head, rows[kept], labels[kept]) / targets, targets


def predicted(labels: torch.Tensor, config) -> torch.Tensor:
    """The labels the logits are scored against: a decoder's shifted one left (it predicts token t+1 at t)."""
    return labels if config.is_encoder_decoder else labels[:, 1:]


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


class Generation(Objective):
    """A language model (a decoder, or T5) trained on the target tokens of `train` (rows `encode` made), a
    batch in random order; dev: the mean loss over dev's target tokens, its dev metric minus that loss (the best
    evaluation: the lowest finite loss)."""

    def __init__(self, model: nn.Module, train: list[dict], dev: list[dict], pad_id: int, device: torch.device,
                 dtype: torch.dtype | None = None):
        self.model, self.train, self.dev, self.pad_id = model, train, dev, pad_id
        self.device, self.dtype, self.rows = device, dtype, len(train)

    def generators(self, seed: int) -> tuple[torch.Generator, torch.Generator]:
        generator = torch.Generator().manual_seed(seed)
        # one stream for the batch order and AdaMix's routing, as generation trials have drawn them: the same numbers
        return generator, generator

    def batches(self, batch_size: int, order: torch.Generator):
        return torch.randperm(self.rows, generator=order).split(batch_size)

    def collate(self, indices) -> dict[str, torch.Tensor]:
        return collate([self.train[i] for i in indices], self.pad_id)

    def size(self, batch: dict) -> int:
        """The batch's target tokens: its loss is their mean."""
        return int((predicted(batch["labels"], self.model.config) != IGNORE).sum())

    def loss(self, batch: dict, routing: torch.Generator) -> torch.Tensor:
        delta.route_all(self.model, routing)
        return lm_loss(self.model, batch)[0]

    def evaluate(self, settings) -> Evaluation:
        loss = dev_loss(self.model, self.dev, self.pad_id, settings.eval_batch_size, self.device, self.dtype)
        return Evaluation({"loss": loss}, -loss, loss)

    def entry(self, evaluation: Evaluation, epoch: int, step: int, fidelity: float) -> dict:
        """Its epoch is the epochs of data seen (there is no separate fidelity)."""
        return {"epoch": round(fidelity, 4), "step": step, "dev": evaluation.dev, "dev_loss": evaluation.dev_loss,
                "dev_metric": evaluation.dev_metric}

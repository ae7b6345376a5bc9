"""Knowledge distillation (Hinton et al. 2015, "Distilling the Knowledge in a Neural Network"): a student trains on
the hard labels and on a teacher's predictions for the same rows, so one model learns what an ensemble of them
knows. autopelt's teacher is a study's ensemble (autopelt/ensemble/distill.py writes its predictions); the student
is a delta trained like any other, with this loss.

For classification the loss is `(1 - alpha) * CE(z, y) + alpha * T^2 * KL(p_T || softmax(z / T))`, where `p_T` is
the teacher's probabilities at temperature T (`p^(1/T)` renormalised: the teacher gives probabilities, an averaged
ensemble having no logits) and T^2 keeps the soft term's gradients on the hard term's scale (Hinton et al., 2.1).
For a regression it is `(1 - alpha) * MSE(z, y) + alpha * MSE(z, teacher)`.

The teacher's members trained on the student's rows, so their predictions there are nearly the labels. `cutoff`
adds copies of the rows with some tokens removed (token cutoff: Shen et al. 2020, "A Simple but Tough-to-Beat Data
Augmentation Approach for Natural Language Understanding and Generation"), which the teacher labels too: rows near
the training rows where its members disagree more (AutoGluon's `distill` augments its rows for the same reason).
A copy keeps its row's label for the hard term.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from autopelt.errors import UserError

TARGETS_SPLIT = "train"  # the teacher's predictions on the student's train rows, in their order (then the copies')
LABELS_KEY = "train_labels"  # the labels of those rows, which a trial checks against its own
COPIES_PREFIX = "copies_"  # the cut-off copies' rows (Features arrays), where the teacher labelled some
CUTOFF_RATE = 0.1  # each token of a copy is removed with this probability (Shen et al.'s token cutoff ratio)


def distillation_loss(outputs: torch.Tensor, labels: torch.Tensor, soft: torch.Tensor, alpha: float,
                      temperature: float) -> torch.Tensor:
    """The student's loss on one batch: `outputs` (B, C) logits or (B, 1) values, `labels` (B,), `soft` the
    teacher's (B, C) probabilities or (B,) values."""
    outputs = outputs.float()
    if outputs.shape[-1] == 1:  # regression
        values = outputs.squeeze(-1)
        return (1 - alpha) * F.mse_loss(values, labels.float()) + alpha * F.mse_loss(values, soft.float())
    hard = F.cross_entropy(outputs, labels)
    teacher = torch.log_softmax(soft.float().clamp_min(1e-8).log() / temperature, dim=-1)  # log p_T
    student = torch.log_softmax(outputs / temperature, dim=-1)
    kl = F.kl_div(student, teacher, reduction="batchmean", log_target=True)
    return (1 - alpha) * hard + alpha * temperature ** 2 * kl


def cutoff(rows, copies: int, keep_ids, seed: int = 0, rate: float = CUTOFF_RATE):
    """`copies` copies of every row of `rows` (Features; copy j of every row, then copy j + 1), each token removed
    with probability `rate` but those in `keep_ids` (the tokenizer's special tokens) and at least one other; the
    labels kept. Deterministic in `seed`."""
    from autopelt.data.features import Features

    generator = np.random.default_rng(seed)
    special = np.isin(rows.ids, np.asarray(sorted(keep_ids), dtype=rows.ids.dtype))
    row_of = np.repeat(np.arange(len(rows)), rows.lengths)  # each token's row

    def per_row(mask: np.ndarray) -> np.ndarray:
        return np.bincount(row_of, weights=mask, minlength=len(rows)).astype(np.int64)

    has_words = per_row(~special) > 0
    parts = []
    for _ in range(copies):
        keep = special | (generator.random(len(rows.ids)) >= rate)
        for row in np.flatnonzero((per_row(keep & ~special) == 0) & has_words):  # all went: keep one
            keep[rows.offsets[row] + np.flatnonzero(~special[rows.offsets[row]:rows.offsets[row + 1]])[0]] = True
        parts.append(Features(
            ids=rows.ids[keep], offsets=np.concatenate([[0], np.cumsum(per_row(keep))]).astype(np.int64),
            token_type_ids=None if rows.token_type_ids is None else rows.token_type_ids[keep], labels=rows.labels,
            pad_id=rows.pad_id, regression=rows.regression))
    return Features.join(parts)


def save_targets(path, predictions: np.ndarray, labels: np.ndarray, copies=None) -> Path:
    """Write a teacher's predictions on a trial's train rows (in that trial's row order), then on `copies` (the
    rows' cut-off copies, Features) where given, and the train rows' labels."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    extra = {} if copies is None else {COPIES_PREFIX + k: v for k, v in copies.to_arrays().items()}
    np.savez_compressed(path, **{TARGETS_SPLIT: predictions.astype(np.float32), LABELS_KEY: labels, **extra})
    return path


def attach_targets(data, distill: dict):
    """`data` (a TrialData) with the teacher's predictions on its train rows. Raises UserError unless the file holds
    predictions for exactly these rows (same count, same labels in the same order): a teacher written for another
    data seed, K or task would silently teach the wrong rows."""
    from autopelt.data.features import Features

    path = Path(distill["targets"])
    try:
        with np.load(path) as stored:
            targets, labels = stored[TARGETS_SPLIT], stored[LABELS_KEY]
            copied = {k[len(COPIES_PREFIX):]: stored[k] for k in stored.files if k.startswith(COPIES_PREFIX)}
        copies = Features.from_arrays(copied) if copied else None
    except (OSError, KeyError, ValueError) as error:
        raise UserError(f"cannot read the distillation targets {path} ({error}); write them again") from None
    train = data.train
    rows = len(train) + (len(copies) if copies is not None else 0)
    if (len(targets) != rows or train.labels is None or not np.array_equal(labels, train.labels)
            or (copies is not None and copies.pad_id != train.pad_id)):
        raise UserError(f"the distillation targets {path} were written for other train rows ({len(targets)} rows "
                        f"vs this trial's {rows}); use the same task, K and data seed as the teacher")
    if copies is not None:
        train = Features.join([train, copies])
    return dataclasses.replace(data, train=dataclasses.replace(train, soft_targets=targets))

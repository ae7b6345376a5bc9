"""Knowledge distillation (Hinton et al. 2015, "Distilling the Knowledge in a Neural Network"): a student trains on
the hard labels and on a teacher's predictions for the same rows, so one model learns what an ensemble of them
knows. autopelt's teacher is a study's ensemble (autopelt/ensemble/distill.py writes its predictions); the student
is a delta trained like any other, with this loss.

For classification the loss is `(1 - alpha) * CE(z, y) + alpha * T^2 * KL(p_T || softmax(z / T))`, where `p_T` is
the teacher's probabilities at temperature T (`p^(1/T)` renormalised: the teacher gives probabilities, an averaged
ensemble having no logits) and T^2 keeps the soft term's gradients on the hard term's scale (Hinton et al., 2.1).
For a regression it is `(1 - alpha) * MSE(z, y) + alpha * MSE(z, teacher)`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from autopelt.errors import UserError

TARGETS_SPLIT = "train"  # the teacher's predictions on the student's train rows, in their order
LABELS_KEY = "train_labels"  # the labels of those rows, which a trial checks against its own


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


def save_targets(path, predictions: np.ndarray, labels: np.ndarray) -> Path:
    """Write a teacher's predictions on a trial's train rows (in that trial's row order) and those rows' labels."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **{TARGETS_SPLIT: predictions.astype(np.float32), LABELS_KEY: labels})
    return path


def attach_targets(data, distill: dict):
    """`data` (a TrialData) with the teacher's predictions on its train rows. Raises UserError unless the file holds
    predictions for exactly these rows (same count, same labels in the same order): a teacher written for another
    data seed, K or task would silently teach the wrong rows."""
    path = Path(distill["targets"])
    try:
        with np.load(path) as stored:
            targets, labels = stored[TARGETS_SPLIT], stored[LABELS_KEY]
    except (OSError, KeyError, ValueError) as error:
        raise UserError(f"cannot read the distillation targets {path} ({error}); write them again") from None
    train = data.train
    if len(targets) != len(train) or train.labels is None or not np.array_equal(labels, train.labels):
        raise UserError(f"the distillation targets {path} were written for other train rows ({len(targets)} rows "
                        f"vs this trial's {len(train)}); use the same task, K and data seed as the teacher")
    return dataclasses.replace(data, train=dataclasses.replace(train, soft_targets=targets))

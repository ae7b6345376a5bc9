"""Distil a study's ensemble into one delta: the ensemble's knowledge at one forward pass an input.

The teacher is the exported ensemble (one backbone load, autopelt/ensemble/model.py); its averaged probabilities
(a regression's averaged values) on the single answer's train rows are the soft targets. The student is the single
answer's configuration (its delta, rate, epochs, batch, seed and data seed) trained again with the distillation
loss (autopelt/train/distillation.py) once for each (alpha, temperature) of `GRID`; the best dev metric chooses
among them, as dev chooses every trial, and the chosen student's test is scored once, after the choice.

The teacher's members were trained on these same rows, so their soft targets are sharper there than on unseen
text; `copies` adds cut-off copies of the rows that the teacher labels too (train/distillation.cutoff), rows
near the training rows where its members disagree more, as AutoGluon's `distill` adds augmented rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from autopelt.errors import UserError

GRID = ((0.5, 1.0), (0.5, 2.0), (0.9, 1.0), (0.9, 2.0))  # (alpha, temperature): Hinton et al.'s usual range; dev
#                                                          chooses among them


@dataclass(frozen=True)
class Distilled:
    """The chosen student: its trial folder, its (alpha, temperature), dev metric, and every candidate's."""

    folder: Path
    alpha: float
    temperature: float
    dev: float
    candidates: list[dict] = field(default_factory=list)  # {"alpha", "temperature", "dev", "status"}

    def to_dict(self) -> dict:
        return {"alpha": self.alpha, "temperature": self.temperature, "dev": self.dev,
                "candidates": self.candidates}


def teacher_targets(ensemble_dir, settings, path, copies: int = 0) -> Path:
    """Write the ensemble's predictions on the train rows of `settings` (a TrialSettings: task, model, K, data
    seed) to `path`, with those rows' labels (train/distillation.save_targets); with `copies`, also on that many
    cut-off copies of each row (train/distillation.cutoff, seeded by the settings' seed), stored with them."""
    import torch

    from autopelt.data.features import Features
    from autopelt.ensemble.model import EnsembleModel
    from autopelt.models import load_tokenizer, resolve_model
    from autopelt.train.distillation import cutoff, save_targets
    from autopelt.train.classify import forward_split
    from autopelt.train.trial_data import prepare_data, resolve_task

    task = resolve_task(settings)
    tokenizer = load_tokenizer(resolve_model(settings.model))
    data = prepare_data(settings.replace(distill=None), tokenizer, task)
    extra = cutoff(data.train, copies, tokenizer.all_special_ids, seed=settings.seed) if copies else None
    rows = data.train if extra is None else Features.join([data.train, extra])
    teacher = EnsembleModel(ensemble_dir, model=settings.model)
    outputs = forward_split(teacher, rows, settings, torch.device("cpu"))  # the members' copies are on the CPU
    predictions = outputs[:, 0] if task.regression else outputs.softmax(-1)
    return save_targets(path, predictions.numpy(), data.train.labels, extra)


def train_students(single_result: dict, targets: Path, work_dir: Path, grid=GRID, say=lambda line: None) -> Distilled:
    """Train the single answer's configuration once for each (alpha, temperature) of `grid` on `targets`; the best
    dev metric is the student. Raises UserError when no student finishes."""
    from autopelt.train import TrialSettings, run_trial

    base = TrialSettings.from_dict(single_result["settings"])
    rate = single_result.get("learning_rate") or base.learning_rate
    candidates, finished = [], []
    for number, (alpha, temperature) in enumerate(grid):
        say(f"distilling: student {number + 1} of {len(grid)} (alpha {alpha:g}, temperature {temperature:g}) …")
        settings = base.replace(learning_rate=rate, out_dir=str(Path(work_dir) / f"student-{number}"),
                                score_test=False, keep_predictions=False,
                                distill={"targets": str(targets), "alpha": alpha, "temperature": temperature})
        result = run_trial(settings)
        dev = result.get("dev_metric") if result.get("status") == "ok" else None
        candidates.append({"alpha": alpha, "temperature": temperature, "dev": dev, "status": result.get("status")})
        if dev is not None:
            finished.append((dev, number, alpha, temperature))
    if not finished:
        raise UserError(f"no distilled student finished ({candidates[0]['status']}); see {work_dir}")
    dev, number, alpha, temperature = max(finished, key=lambda f: (f[0], -f[1]))  # ties: the earlier in the grid
    return Distilled(Path(work_dir) / f"student-{number}", alpha, temperature, dev, candidates)

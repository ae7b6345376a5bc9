"""Distil a study's ensemble into one delta: the ensemble's knowledge at one forward pass an input.

The teacher is the exported ensemble (one backbone load, autopelt/ensemble/model.py); its averaged probabilities
(a regression's averaged values) on the single answer's train rows are the soft targets. The student is the single
answer's configuration (its delta, rate, epochs, batch, seed and data seed) trained again with the distillation
loss (autopelt/train/distillation.py) once for each (alpha, temperature) of `GRID`; the best dev metric chooses
among them, as dev chooses every trial, and the chosen student's test is scored once, after the choice.

The teacher's members were trained on these same rows, so their soft targets are sharper there than on unseen
text; `copies` adds cut-off copies of the rows that the teacher labels too (train/distillation.cutoff), rows
near the training rows where its members disagree more, as AutoGluon's `distill` adds augmented rows; `unlabeled`
adds the user's own unlabelled texts, which the teacher labels (its soft targets, and its most likely class, or its
value, as the hard label): the transfer set of Hinton et al. (2015), larger than the labelled rows, as in
DistilBERT-style task distillation and Noisy Student's pseudo-labels (Xie et al. 2020).
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


def teacher_targets(ensemble_dir, settings, path, copies: int = 0, unlabeled: list[dict] | None = None,
                    say=lambda line: None) -> Path:
    """Write the ensemble's predictions on the train rows of `settings` (a TrialSettings: task, model, K, data
    seed) to `path`, with those rows' labels (train/distillation.save_targets); with `copies`, also on that many
    cut-off copies of each row (train/distillation.cutoff, seeded by the settings' seed), and with `unlabeled`
    (rows holding the task's text columns; any label in them is ignored) on those texts, each labelled by the
    teacher's most likely class (a regression: its value); both stored with them. A text that tokenises exactly as
    a dev or test row is left out (said through `say`): the student learning the teacher's answer there would bias
    the dev that chooses it and the test that reports it."""
    import dataclasses

    import numpy as np
    import torch

    from autopelt.data.features import Features, tokenize
    from autopelt.ensemble.model import EnsembleModel
    from autopelt.models import load_tokenizer, resolve_model
    from autopelt.train.distillation import cutoff, save_targets
    from autopelt.train.classify import forward_split
    from autopelt.train.trial_data import prepare_data, resolve_task

    task = resolve_task(settings)
    if unlabeled is not None:
        check_unlabeled(unlabeled, task)
    tokenizer = load_tokenizer(resolve_model(settings.model))
    data = prepare_data(settings.replace(distill=None), tokenizer, task)
    parts = [data.train]
    if copies:
        parts.append(cutoff(data.train, copies, tokenizer.all_special_ids, seed=settings.seed))
    if unlabeled is not None:
        texts = [{column: row[column] for column in task.text_columns} for row in unlabeled]
        encoded = tokenize(texts, task, tokenizer, settings.max_length, use_cache=False)  # as the train rows are
        held = {tuple(rows.row(i).tolist()) for rows in (data.dev, data.test) for i in range(len(rows))}
        kept = np.asarray([i for i in range(len(encoded)) if tuple(encoded.row(i).tolist()) not in held], dtype=int)
        if len(kept) < len(encoded):
            say(f"distilling: {len(encoded) - len(kept)} of the {len(encoded)} unlabelled texts are dev or test rows; "
                "left out")
        if not len(kept):
            raise UserError("every --unlabeled text is one of the task's dev or test rows; give other texts")
        parts.append(encoded.select(kept))
    teacher = EnsembleModel(ensemble_dir, model=settings.model)

    def predict(rows):
        outputs = forward_split(teacher, rows, settings, torch.device("cpu"))  # the members' copies are on the CPU
        return outputs[:, 0] if task.regression else outputs.softmax(-1)

    predictions = [predict(part) for part in parts]
    if unlabeled is not None:  # the teacher's answer is the hard label of a text that came without one
        taught = predictions[-1] if task.regression else predictions[-1].argmax(-1)
        parts[-1] = dataclasses.replace(parts[-1], labels=taught.numpy().astype(parts[0].labels.dtype))
    extra = Features.join(parts[1:]) if len(parts) > 1 else None
    return save_targets(path, torch.cat(predictions).numpy(), data.train.labels, extra)


MAX_UNLABELED = 100_000  # texts the teacher labels for a student: each is trained on every epoch


def check_unlabeled(rows: list[dict], task) -> None:
    """Raise UserError, naming the first bad row (counted without blank lines), unless there are 1 to MAX_UNLABELED
    rows and each is a JSON object holding the task's text columns as strings, not all of them blank."""
    if not rows:
        raise UserError("--unlabeled holds no rows; give a JSONL file with one text (the task's columns) a line")
    if len(rows) > MAX_UNLABELED:
        raise UserError(f"--unlabeled holds {len(rows):,} rows; at most {MAX_UNLABELED:,} (the student trains on "
                        "each, every epoch): sample them")
    columns = ", ".join(task.text_columns)
    for number, row in enumerate(rows, 1):
        if not isinstance(row, dict):
            raise UserError(f"--unlabeled row {number} is not a JSON object; every row needs {columns}")
        lacking = [c for c in task.text_columns if not isinstance(row.get(c), str)]
        if lacking:
            raise UserError(f"--unlabeled row {number} lacks {lacking[0]!r} as a text; every row needs {columns}")
        if not any(row[c].strip() for c in task.text_columns):
            raise UserError(f"--unlabeled row {number} is blank; remove it (the teacher's guess there would teach "
                            "the student nothing)")


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

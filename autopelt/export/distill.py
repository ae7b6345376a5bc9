"""`autopelt export --ensemble --distill`: a study's ensemble distilled into one delta (autopelt/ensemble/distill.py
trains the students), exported as any delta is, with the student's dev and test beside the ensemble's and the single
answer's."""

from __future__ import annotations

import shutil
from pathlib import Path

from autopelt.ensemble.distill import GRID, Distilled, teacher_targets, train_students
from autopelt.errors import UserError
from autopelt.export.export import export_result


def distill_ensemble(chosen, ensemble_dir, out_dir, grid=GRID, copies: int = 0, unlabeled: list[dict] | None = None,
                     say=lambda line: None) -> tuple[Path, Distilled]:
    """Distil the exported ensemble `chosen` (a StudyEnsemble with its test metrics, written to `ensemble_dir`) into
    one delta exported to the new folder `out_dir` (autopelt/export/export.py's layout: predict, load and peft read
    it like any export), whose metrics.json and model card set its dev and test beside the ensemble's and the single
    answer's. `copies`: cut-off copies of each train row the teacher labels too; `unlabeled`: texts (rows with
    the task's text columns) it labels for the student (ensemble/distill.teacher_targets).
    The students train in a folder beside `out_dir`, removed at the end."""
    from autopelt.train import TrialSettings

    if chosen.single.result.get("task") is None or chosen.single.result.get("settings") is None:
        raise UserError(f"the single answer {chosen.single.folder} has no readable settings to train a student from")
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise UserError(f"--out {out_dir} exists and is not empty; choose a new folder")
    work = out_dir.with_name(f".{out_dir.name}.students")
    shutil.rmtree(work, ignore_errors=True)
    try:
        settings = TrialSettings.from_dict(chosen.single.result["settings"])
        copied = f", {copies} cut-off copies of each" if copies else ""
        texts = f", {len(unlabeled)} unlabelled texts" if unlabeled else ""
        say(f"distilling: the ensemble's {len(chosen.members)} members predict the single answer's train rows"
            f"{copied}{texts} …")
        targets = teacher_targets(ensemble_dir, settings, work / "teacher.npz", copies, unlabeled, say)
        student = train_students(chosen.single.result, targets, work, grid, say)
        about = {"distilled": {**student.to_dict(), "copies": copies, "unlabeled": len(unlabeled or ()),
                               "members": len(chosen.members),
                               "metric": chosen.metric,
                               "ensemble": {"dev": chosen.dev, "test": chosen.test},
                               "single": {"summary": chosen.single.summary, "dev": chosen.single_dev,
                                          "test": chosen.single_test}}}
        folder = export_result(student.folder, out_dir, about)
        shutil.copy2(targets, folder / "teacher.npz")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return folder, student


"""`autopelt export`: the best (or a chosen, or every Pareto) delta of a study, as files to take away."""

from __future__ import annotations

import os

from autopelt.study.storage import DEFAULT_STORAGE


def add_arguments(parser) -> None:
    parser.add_argument("--study", required=True, help="study name (as `autopelt search` printed it)")
    parser.add_argument("--storage", default=os.environ.get("AUTOPELT_STORAGE", DEFAULT_STORAGE),
                        help=f"SQLAlchemy URL of the study database (default: {DEFAULT_STORAGE})")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--trial", type=int, help="export this trial number (default: the best)")
    which.add_argument("--pareto", action="store_true", help="export every trial on the Pareto front")
    which.add_argument("--ensemble", action="store_true",
                       help="export the ensemble of the study's trials (docs/ensembles.md)")
    parser.add_argument("--max-members", type=int, metavar="K", help="with --ensemble: keep its K heaviest members")
    parser.add_argument("--distill", action="store_true",
                        help="with --ensemble: write instead one delta trained on the ensemble's predictions "
                             "(knowledge distillation): one forward pass an input, its test beside the ensemble's")
    parser.add_argument("--copies", type=int, default=0, metavar="N",
                        help="with --distill: the ensemble also labels N token-cutoff copies of each train row for "
                             "the student to learn from (default 0)")
    parser.add_argument("--unlabeled", metavar="FILE",
                        help="with --distill: a JSONL file of texts without labels (the task's text columns, one "
                             "row a line) that the ensemble labels for the student to learn from too (each "
                             "student trains on them every epoch: time grows with their number); in-domain texts "
                             "kept more of the ensemble's gain than the train rows alone (docs/ensembles.md)")
    parser.add_argument("--out", required=True, help="folder to create (with --pareto: one sub-folder a trial)")
    parser.add_argument("--reseed", type=int, default=0, metavar="N",
                        help="re-run the chosen config with seeds 0..N-1 and record mean ± std")


def run(args) -> int:
    from pathlib import Path

    from autopelt.errors import UserError
    from autopelt.export.export import ensemble_beside, export_trial, nothing_learned_note, pick_trials, trial_outputs
    from autopelt.study.info import floors_of
    from autopelt.study.storage import load_study, open_existing

    if args.reseed < 0:
        raise UserError("--reseed takes a number of seeds ≥ 1 (or leave it out)")
    if args.distill and not args.ensemble:
        raise UserError("--distill distils a study's ensemble: add --ensemble")
    if args.copies and not args.distill:
        raise UserError("--copies gives a distilled student more rows: add --ensemble --distill")
    if args.unlabeled is not None and not args.distill:
        raise UserError("--unlabeled gives a distilled student texts the ensemble labels: add --ensemble --distill")
    if args.copies < 0 or args.copies > 16:
        raise UserError(f"--copies must be a whole number from 0 to 16, not {args.copies}")
    study = load_study(open_existing(args.storage), args.study, args.storage)
    if args.ensemble:
        return _ensemble(args, study)
    trials = pick_trials(study, args.trial, args.pareto)
    for trial in trials:
        trial_outputs(trial)  # every chosen trial must have weights before anything is written
    out = Path(args.out)
    beside = ensemble_beside(study, say=print) if args.trial is None and not args.pareto else None
    for trial in trials:
        target = out / f"trial-{trial.number}" if args.pareto else out
        floors = floors_of(study)
        export_trial(trial, target, args.reseed, study.study_name, floors, ensemble=beside)
        print(f"exported trial {trial.number} ({trial.summary or ''}) to {target}")
        note = nothing_learned_note(floors, trial_outputs(trial)[0])
        if note:
            print(note)
    print(f"next: autopelt predict --delta {out / f'trial-{trials[0].number}' if args.pareto else out} --text \"…\"")
    return 0


def _ensemble(args, study) -> int:
    from autopelt.errors import UserError
    from autopelt.export.ensemble import export_ensemble
    from autopelt.study.record import trial_dirs

    if args.reseed or (args.max_members is not None and args.max_members < 1):
        raise UserError("--ensemble takes --max-members K ≥ 1 and no --reseed")
    from autopelt.study import answers
    from autopelt.study.record import read_all

    found = answers.best(read_all(study))
    answer_dir = found.result_dir if found else None
    if args.distill:
        return _distilled(args, study, trial_dirs(study), answer_dir)
    out, chosen = export_ensemble(trial_dirs(study), args.out, args.max_members, study.study_name,
                                  answer_dir=answer_dir, say=print)
    print("\n".join(chosen.lines()))
    print(f"exported the ensemble ({chosen.forward_passes} forward passes an input) to {out}")
    print(f"next: autopelt predict --delta {out} --text \"…\"")
    return 0


def _distilled(args, study, trial_dirs: list, answer_dir) -> int:
    """The ensemble built in a folder beside --out (the teacher, removed at the end), distilled into --out."""
    import json
    import shutil
    from pathlib import Path

    from autopelt.ensemble.distill import check_unlabeled
    from autopelt.errors import UserError
    from autopelt.export.distill import distill_ensemble
    from autopelt.export.ensemble import export_ensemble
    from autopelt.export.predict import read_rows
    from autopelt.train import TrialSettings
    from autopelt.train.trial_data import resolve_task

    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        raise UserError(f"--out {out} exists and is not empty; choose a new folder")
    unlabeled = read_rows(args.unlabeled, "--unlabeled") if args.unlabeled is not None else None
    if unlabeled is not None:  # checked before the teacher is built, on the answer's task where it can be read
        #                        (and again where the teacher labels them)
        try:
            task = resolve_task(TrialSettings.from_dict(
                json.loads((Path(answer_dir) / "result.json").read_text())["settings"]))
        except (TypeError, OSError, KeyError, ValueError, UserError):
            task = None
        if task is not None:
            check_unlabeled(unlabeled, task)
    teacher = out.with_name(f".{out.name}.teacher")
    shutil.rmtree(teacher, ignore_errors=True)
    try:
        _, chosen = export_ensemble(trial_dirs, teacher, args.max_members, study.study_name, answer_dir=answer_dir,
                                    say=print)
        print("\n".join(chosen.lines()))
        folder, student = distill_ensemble(chosen, teacher, out, copies=args.copies, unlabeled=unlabeled, say=print)
    finally:
        shutil.rmtree(teacher, ignore_errors=True)
    print(f"distilled the ensemble of {len(chosen.members)} into one delta (alpha {student.alpha:g}, temperature "
          f"{student.temperature:g}, chosen by dev {student.dev:.4f}; test in {folder / 'metrics.json'}) to {folder}")
    if unlabeled is None:
        print("more of the ensemble's gain: give the student in-domain texts without labels, --unlabeled FILE "
              "(docs/ensembles.md)")
    print(f"next: autopelt predict --delta {folder} --text \"…\"")
    return 0

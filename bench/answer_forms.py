"""What each form of a search's answer is worth on test, and what it costs at inference.

For each task and seed, one `autopelt search` (as a user runs it: `--train-file/--validation-file` from
../shared/data/tasks, K rows, `--budget N` trials, one worker, the seed as its rows' and training seed), then from
its study, each chosen on dev alone and scored on test once:

- `single`: the study's answer (one delta, one forward pass);
- `ensemble`: the study's ensemble as the search's summary chooses it (greedy selection with replacement,
  autopelt/ensemble/study.py), its members' test predictions averaged;
- `k3`: the same selection kept to its 3 heaviest members (`export --ensemble --max-members 3`);
- `soup`: the members averaged into one LoRA delta (autopelt/ensemble/soup.py) where they share one LoRA
  structure, else the reason it does not apply;
- `distilled`: `export --ensemble --distill`: the single answer's configuration trained on the ensemble's
  probabilities (autopelt/ensemble/distill.py), alpha and temperature chosen by dev;
- `distilled_copies`: the same with `--copies 2`: the ensemble also labels two token-cutoff copies of each train
  row, on which the student learns too (train/distillation.cutoff);
- `distilled_unlabeled`: the same with `--unlabeled`: the ensemble also labels up to 1,000 texts of the task's
  train file that are none of the search's train, dev or test rows (their labels dropped), as a user's unlabelled
  texts (`distilled_unlabeled_rows` says how many; none left: the form is left out of the row);
- `distilled_members`: the student chosen by dev among `distilled`'s and one trained for each of up to
  MEMBER_STUDENTS other configurations among the ensemble's members (heaviest first; at `distilled`'s alpha and
  temperature, on its teacher's targets): the student need not be the answer's configuration
  (`distilled_members_from` names the one chosen; none other: the form is left out of the row).

A row written before a form existed gets it with `run --fill` where its study is still in `--scratch`.
`--copies 2` becomes `--distill`'s default when, over at least six studies on at least three tasks, `distilled_copies`
gains at least 0.5 points of test more than `distilled` on the mean, and loses no more than 1.0 to it on any (fixed
2026-12-02, after one study: trec seed 1). The docs recommend `--unlabeled` when, by the same rule (fixed
2026-12-03, before it had run), `distilled_unlabeled` gains at least 0.5 points over `distilled` on the mean over at
least six studies on three tasks and loses no more than 1.0 on any. `--distill` chooses its student among the members'
configurations by default when `distilled_members` passes the same rule (fixed 2026-12-03, before any had run).
A variant that can no longer pass its rule (one study already lost more than 1.0 to plain distillation) is left out
of the rows run after that.

Each form's inference cost: forward passes an input, and the seconds to predict the task's test split on this
CPU (one process, the base model loaded once); `--threads 1` runs two at once on one core each, so compare forms
by `time_vs_single`, the seconds over the single answer's in the same row. Every (task, seed) is one row of
`<work>/rows.jsonl`, written when it ends, so a killed run resumes at the next one; the search itself resumes inside
its own study (in `--scratch`).

    python bench/answer_forms.py run --tasks trec,tweeteval_emotion,qnli,snips --seeds 0 1 2 [--k 500 --budget 12]
    python bench/answer_forms.py summary      # benchmarks/results/answer-forms-<date>.json, printed
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from results import ROOT, write_results  # noqa: E402

TASKS_DIR = ROOT.parent / "shared" / "data" / "tasks"
DEFAULT_WORK = ROOT / "benchmarks" / "runs" / "answer-forms"  # rows.jsonl, committed: a later session resumes
DEFAULT_SCRATCH = Path("/tmp/answer-forms")  # the studies, their trials and the forms' folders (large, not kept)
VARIANTS = ("distilled_copies", "distilled_unlabeled", "distilled_members")  # what `--fill` adds to an older row
FORMS = ("single", "ensemble", "k3", "soup", "distilled", *VARIANTS)
COPIES = 2  # distilled_copies' cut-off copies of each train row
UNLABELED = 1000  # distilled_unlabeled's texts (fewer where the train file has fewer left)
MEMBER_STUDENTS = 2  # distilled_members' students beyond the answer's configuration


def search(task: str, seed: int, args, work: Path) -> tuple[str, str, Path]:
    """Run (or resume) the task's search; (storage URL, study name, its trials' folder)."""
    name, out = f"{task}-s{seed}", work / "studies" / f"{task}-s{seed}"
    storage = f"sqlite:///{work / 'studies' / 'studies.db'}"
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "autopelt.cli", "search", "--train-file", str(TASKS_DIR / task / "train.jsonl"),
               "--validation-file", str(TASKS_DIR / task / "validation.jsonl"), "--k", str(args.k),
               "--seed", str(seed), "--budget", str(args.budget), "--workers", "1", "--storage", storage,
               "--sampler", "tpe",  # as every row ran (the default then), so rows stay comparable
               "--study-name", name, "--out", str(out)]
    if args.threads:
        command += ["--cpus-per-trial", str(args.threads)]
    done = subprocess.run(command, capture_output=True, text=True)
    (out / "search.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return storage, name, out


def predict_seconds(folder: Path, data) -> float:
    """Seconds to predict `data.test` with the delta or ensemble folder (loaded first, not timed)."""
    import torch

    import autopelt
    from autopelt.ensemble.folder import is_ensemble
    from autopelt.ensemble.model import EnsembleModel
    from autopelt.train.classify import forward_split
    from autopelt.train.settings import TrialSettings

    model = EnsembleModel(folder) if is_ensemble(folder) else autopelt.load(None, folder)
    settings = TrialSettings(task="x", spec={"methods": []})
    started = time.perf_counter()
    forward_split(model, data.test, settings, torch.device("cpu"))
    return round(time.perf_counter() - started, 2)


def forms(storage: str, name: str, work: Path, settled: frozenset = frozenset()) -> dict:
    """Every form's test metric and inference cost for one finished study, but the `settled` variants."""
    from autopelt.ensemble.soup import soup_folders, why_not_soup
    from autopelt.export.ensemble import export_ensemble
    from autopelt.models import load_tokenizer, resolve_model
    from autopelt.study import answers
    from autopelt.study.record import read_all, trial_dirs
    from autopelt.study.storage import load_study
    from autopelt.train import TrialSettings
    from autopelt.train.trial_data import prepare_data, resolve_task

    study = load_study(storage, name, storage)
    found = answers.best(read_all(study))
    folders = trial_dirs(study)
    target = work / "forms" / name
    row: dict = {}
    ensemble_dir, chosen = export_ensemble(folders, target / "ensemble", answer_dir=found.result_dir)
    settings = TrialSettings.from_dict(chosen.single.result["settings"])
    data = prepare_data(settings, load_tokenizer(resolve_model(settings.model)), resolve_task(settings))
    single_dir = Path(chosen.single.folder) / "delta"
    row.update(metric=chosen.metric, members=len(chosen.members), single_test=chosen.single_test,
               single_passes=1, single_seconds=predict_seconds(single_dir, data), ensemble_test=chosen.test,
               ensemble_passes=chosen.forward_passes, ensemble_seconds=predict_seconds(ensemble_dir, data))
    k3_dir, k3 = export_ensemble(folders, target / "k3", max_members=3, answer_dir=found.result_dir)
    row.update(k3_test=k3.test, k3_passes=k3.forward_passes, k3_seconds=predict_seconds(k3_dir, data))
    from autopelt.delta import read_delta_header

    reason = why_not_soup([read_delta_header(m.folder / "delta")["spec"] for m in chosen.members])
    if reason is None:
        soup_dir = soup_folders([m.folder / "delta" for m in chosen.members], chosen.weights, target / "soup")
        row.update(soup_test=_score(soup_dir, data, chosen.metric), soup_passes=1,
                   soup_seconds=predict_seconds(soup_dir, data))
    else:
        row["soup_reason"] = reason
    row.update(distilled(chosen, ensemble_dir, target / "distilled", data, "distilled", 0))
    if "distilled_copies" not in settled:
        row.update(distilled(chosen, ensemble_dir, target / "distilled_copies", data, "distilled_copies", COPIES))
    if "distilled_unlabeled" not in settled:
        row.update(distilled_unlabeled(chosen, ensemble_dir, target, data, settings))
    if "distilled_members" not in settled:
        row.update(distilled_members(chosen, target, data, row))
    return row


def distilled_members(chosen, target: Path, data, row: dict) -> dict:
    """The `distilled_members` columns: students of up to MEMBER_STUDENTS members' configurations other than the
    answer's (heaviest member first, one per delta spec), each trained once at the (alpha, temperature) `distilled`
    chose, on the targets its teacher wrote (`target`/distilled/teacher.npz); the best dev among them and
    `distilled`'s own student (ties: `distilled`'s) is the form, its test scored once, after that choice. None
    where the members hold no other configuration."""
    from autopelt.ensemble.distill import train_students
    from autopelt.export.export import export_result

    form = "distilled_members"
    spec = lambda member: json.dumps(member.result["settings"]["spec"], sort_keys=True)  # noqa: E731
    seen, others = {spec(chosen.single)}, []
    for member, _ in sorted(zip(chosen.members, chosen.weights), key=lambda m: -m[1]):
        if spec(member) not in seen and len(others) < MEMBER_STUDENTS:
            seen.add(spec(member))
            others.append(member)
    if not others:
        return {}
    teacher = target / "distilled" / "teacher.npz"
    grid = ((row["distilled_alpha"], row["distilled_temperature"]),)
    best = {"dev": row["distilled_dev"], "test": row["distilled_test"], "seconds": row["distilled_seconds"],
            "from": chosen.single.summary}
    shutil.rmtree(target / form, ignore_errors=True)
    for number, member in enumerate(others):
        student = train_students(member.result, teacher, target / form / f"member-{number}", grid)
        if student.dev > best["dev"]:
            best = {"dev": student.dev, "folder": student.folder, "from": member.summary}
    if "folder" in best:
        folder = export_result(best["folder"], target / form / "export", {})
        metrics = json.loads((folder / "metrics.json").read_text())
        best.update(test=metrics["test"][chosen.metric], seconds=predict_seconds(folder, data))
    return {f"{form}_test": best["test"], f"{form}_passes": 1, f"{form}_seconds": best["seconds"],
            f"{form}_dev": best["dev"], f"{form}_from": best["from"], f"{form}_students": 1 + len(others)}


def distilled_unlabeled(chosen, ensemble_dir: Path, target: Path, data, settings) -> dict:
    """The `distilled_unlabeled` columns, or none where the train file has no text left beyond the search's."""
    texts = unlabeled_texts(settings)
    if not texts:
        return {}
    form = "distilled_unlabeled"
    return {**distilled(chosen, ensemble_dir, target / form, data, form, 0, texts), f"{form}_rows": len(texts)}


def unlabeled_texts(settings, count: int = UNLABELED) -> list[dict]:
    """Up to `count` rows of the task's train file whose text is none of the search's train, dev or test rows, their
    labels dropped: a stand-in for a user's unlabelled texts. Seeded by the trial's data seed."""
    import numpy as np

    from autopelt.data.loading import load_task_splits
    from autopelt.data.protocols import make_splits
    from autopelt.train.trial_data import resolve_task

    task = resolve_task(settings)
    loaded = load_task_splits(task, settings.data_dir)
    splits = make_splits(loaded, task, settings.protocol, seed=settings.split_seed, dev_size=settings.dev_size)
    text = lambda row: tuple(str(row[c]) for c in task.text_columns)  # noqa: E731
    used = {text(row) for row in (*splits.train, *splits.dev, *loaded.get(task.test_split, ()))}
    pool = list({text(row): row for row in loaded[task.train_split] if text(row) not in used}.values())
    chosen = np.random.default_rng(settings.split_seed).permutation(len(pool))[:count]
    return [{c: pool[i][c] for c in task.text_columns} for i in sorted(chosen)]


def distilled(chosen, ensemble_dir: Path, folder: Path, data, form: str, copies: int,
              unlabeled: list[dict] | None = None) -> dict:
    """The distilled form's columns (`form`_test, …) for the exported ensemble `chosen`."""
    from autopelt.export.distill import distill_ensemble

    distilled_dir, student = distill_ensemble(chosen, ensemble_dir, folder, copies=copies, unlabeled=unlabeled)
    metrics = json.loads((distilled_dir / "metrics.json").read_text())
    return {f"{form}_test": metrics["test"][chosen.metric], f"{form}_passes": 1,
            f"{form}_seconds": predict_seconds(distilled_dir, data), f"{form}_alpha": student.alpha,
            f"{form}_temperature": student.temperature, f"{form}_dev": student.dev}


def fill(rows_file: Path, scratch: Path) -> None:
    """Add the distilled VARIANTS to the rows written before they existed, where their study is still in `scratch`
    (the session that ran it); `distilled_members` only where the row's `distilled` student's teacher is still there."""
    from autopelt.export.ensemble import export_ensemble
    from autopelt.models import load_tokenizer, resolve_model
    from autopelt.study import answers
    from autopelt.study.record import read_all, trial_dirs
    from autopelt.study.storage import load_study
    from autopelt.train import TrialSettings
    from autopelt.train.trial_data import prepare_data, resolve_task

    rows = [json.loads(line) for line in rows_file.read_text().splitlines()]
    storage = f"sqlite:///{scratch / 'studies' / 'studies.db'}"
    for row in rows:
        name = f"{row['task']}-s{row['seed']}"
        missing = [f for f in VARIANTS if f"{f}_test" not in row and f"{f}_left_out" not in row]
        if not missing or not (scratch / "studies" / name).is_dir():
            continue
        study = load_study(storage, name, storage)
        target = scratch / "forms" / name
        shutil.rmtree(target / "ensemble-fill", ignore_errors=True)
        ensemble_dir, chosen = export_ensemble(trial_dirs(study), target / "ensemble-fill",
                                               answer_dir=answers.best(read_all(study)).result_dir)
        settings = TrialSettings.from_dict(chosen.single.result["settings"])
        data = prepare_data(settings, load_tokenizer(resolve_model(settings.model)), resolve_task(settings))
        for form in missing:
            if form == "distilled_members":
                if not (target / "distilled" / "teacher.npz").is_file():
                    continue  # its `distilled` student's teacher is gone: rerunning it would change that form
                row.update(distilled_members(chosen, target, data, row) or {f"{form}_left_out": "one configuration"})
                rows_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
                continue
            shutil.rmtree(target / form, ignore_errors=True)
            row.update(distilled(chosen, ensemble_dir, target / form, data, form, COPIES) if form == "distilled_copies"
                       else distilled_unlabeled(chosen, ensemble_dir, target, data, settings))
            rows_file.write_text("".join(json.dumps(r) + "\n" for r in rows))  # each filled form kept at once
        print(json.dumps(row), flush=True)


def _score(folder: Path, data, metric: str) -> float:
    """The task's test metric of a delta folder's predictions."""
    import torch

    import autopelt
    from autopelt.train.classify import forward_split
    from autopelt.train.settings import TrialSettings

    model = autopelt.load(None, folder)
    outputs = forward_split(model, data.test, TrialSettings(task="x", spec={"methods": []}), torch.device("cpu"))
    return float(data.task.compute_metrics(outputs, data.test.labels)[metric])


def run(args) -> None:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    rows_file = work / "rows.jsonl"
    if args.threads:  # this process's distillation and predictions; the search gets --cpus-per-trial
        import torch

        torch.set_num_threads(args.threads)
    if args.fill:
        return fill(rows_file, Path(args.scratch))
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()] if rows_file.is_file() else []
    done, settled = {row["key"] for row in rows}, settled_variants(summarise(rows))
    if settled:
        print(f"not run again (a study already lost more than 1.0 to plain distillation): {', '.join(settled)}")
    for seed in args.seeds:
        for task in args.tasks.split(","):
            key = f"{task}|k{args.k}|b{args.budget}|seed{seed}"
            if key in done:
                continue
            started = time.monotonic()
            scratch = Path(args.scratch)
            storage, name, _ = search(task, seed, args, scratch)
            row = {"key": key, "task": task, "seed": seed, "k": args.k, "budget": args.budget,
                   **forms(storage, name, scratch, settled), "seconds": round(time.monotonic() - started)}
            if args.threads:
                row["threads"] = args.threads
            with rows_file.open("a") as out:
                out.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)


def summarise(rows: list[dict]) -> list[dict]:
    """Per form: its mean test, the paired difference to the single answer (mean, std, worst), forward passes and
    predict seconds (means), over every (task, seed) where it applies; and the distilled delta's share of the
    ensemble's gain."""
    table = []
    for form in FORMS:
        usable = [r for r in rows if r.get(f"{form}_test") is not None]
        if not usable:
            continue
        gains = [100 * (r[f"{form}_test"] - r["single_test"]) for r in usable]
        table.append({"form": form, "runs": len(usable), "tasks": len({r["task"] for r in usable}),
                      "test": round(statistics.fmean(100 * r[f"{form}_test"] for r in usable), 2),
                      "gain": round(statistics.fmean(gains), 2),
                      "gain_std": round(statistics.stdev(gains), 2) if len(gains) > 1 else 0.0,
                      "worst": round(min(gains), 2),
                      "passes": round(statistics.fmean(r[f"{form}_passes"] for r in usable), 1),
                      "seconds": round(statistics.fmean(r[f"{form}_seconds"] for r in usable), 2),
                      "time_vs_single": round(statistics.fmean(r[f"{form}_seconds"] / r["single_seconds"]
                                                               for r in usable), 2)})
    for entry in table:  # a distilled form's gain over the ensemble's on the same rows
        if entry["form"].startswith("distilled"):
            usable = [r for r in rows if r.get(f"{entry['form']}_test") is not None]
            ensemble_gain = statistics.fmean(100 * (r["ensemble_test"] - r["single_test"]) for r in usable)
            if ensemble_gain:
                entry["share_of_ensemble_gain"] = round(entry["gain"] / ensemble_gain, 2)
    for entry in table:  # a distilled variant's paired difference to plain distillation, which decides its use
        form = entry["form"]
        both = [r for r in rows if r.get(f"{form}_test") is not None and r.get("distilled_test") is not None]
        if form.startswith("distilled_") and both:
            over = [100 * (r[f"{form}_test"] - r["distilled_test"]) for r in both]
            entry.update(over_distilled=round(statistics.fmean(over), 2), worst_over_distilled=round(min(over), 2))
    return table


def pays_over_distilled(table: list[dict], form: str) -> bool:
    """The rule fixed before the variant had run on more than one study (`distilled_copies`: 2026-12-02;
    `distilled_unlabeled` and `distilled_members`: 2026-12-03, before any): over at least six studies on at least
    three tasks, the variant gains at least 0.5 points of test over plain distillation on the mean and loses no more
    than 1.0 to it on any."""
    entry = next((e for e in table if e["form"] == form and "over_distilled" in e), None)
    return (entry is not None and entry["runs"] >= 6 and entry["tasks"] >= 3  # every row runs both distilled forms
            and entry["over_distilled"] >= 0.5 and entry["worst_over_distilled"] >= -1.0)


def settled_variants(table: list[dict]) -> frozenset:
    """The variants `pays_over_distilled` can no longer pass, whatever runs next: a study already lost more than 1.0
    to plain distillation. New rows leave them out (each costs four students' training a row)."""
    return frozenset(e["form"] for e in table if e.get("worst_over_distilled", 0.0) < -1.0)


def copies_by_default(table: list[dict]) -> bool:
    """`--copies 2` becomes `--distill`'s default by `pays_over_distilled`."""
    return pays_over_distilled(table, "distilled_copies")


def summary(args) -> None:
    rows_file = Path(args.work) / "rows.jsonl"
    rows = [json.loads(line) for line in rows_file.read_text().splitlines()] if rows_file.is_file() else []
    table = summarise(rows)
    for entry in table:
        print(json.dumps(entry))
    if table:
        settings = {"runs": sorted(r["key"] for r in rows), "copies_by_default": copies_by_default(table),
                    "unlabeled_pays": pays_over_distilled(table, "distilled_unlabeled"),
                    "members_student_pays": pays_over_distilled(table, "distilled_members")}
        print(f"--copies 2 by default, by the rule fixed before it ran: {settings['copies_by_default']}")
        print(f"--unlabeled pays, by the rule fixed before it ran: {settings['unlabeled_pays']}")
        print(f"a student among the members' configurations pays, by the same rule: {settings['members_student_pays']}")
        columns = ["form", "runs", "tasks", "test", "gain", "gain_std", "worst", "share_of_ensemble_gain",
                   "over_distilled", "worst_over_distilled", "passes", "seconds", "time_vs_single"]
        path = write_results("answer-forms", table, columns, settings=settings,
                             notes="test in points; gain: paired difference to the single answer, same study; "
                                   "share_of_ensemble_gain: a distilled form's gain over the ensemble's on the same "
                                   "studies; seconds: predicting the task's test split on this CPU (rows with "
                                   "threads=1 ran two at once, one core each); time_vs_single: those seconds over "
                                   "the single answer's in the same row, averaged; over_distilled: a distilled "
                                   "variant's paired difference to plain distillation (mean, worst); the rows ran "
                                   "on the machines of the sessions that ran them, the one above wrote the summary")
        print(f"wrote {path}")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    go = commands.add_parser("run", help="search and score every form (resumes)")
    go.add_argument("--tasks", default="trec,tweeteval_emotion,qnli,snips")
    go.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    go.add_argument("--k", type=int, default=500)
    go.add_argument("--budget", type=int, default=12, help="trials a search runs")
    go.add_argument("--work", default=str(DEFAULT_WORK))
    go.add_argument("--scratch", default=str(DEFAULT_SCRATCH))
    go.add_argument("--threads", type=int, default=0,
                    help="CPU threads for the search's trials and this process (default: all; 1 to run two at once)")
    go.add_argument("--fill", action="store_true", help="only add the forms rows written before them lack")
    show = commands.add_parser("summary", help="the table, written to benchmarks/results/")
    show.add_argument("--work", default=str(DEFAULT_WORK))
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    run(args) if args.command == "run" else summary(args)


if __name__ == "__main__":
    main()

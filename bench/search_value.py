"""What the search is worth: autopelt's pick against random search, tuned LoRA and the baselines, at equal compute.

Compute is counted in full-trial equivalents: the seconds of one LoRA r8 trial trained to its last epoch, measured
first on the task itself by a calibration study (two such trials per worker, side by side as the searches run
them). A worker's first trial also loads the model and the data, so the calibration times two things: one full
trial, the median of the second round, and a start-up allowance, how much longer the first round's median took.
Every strategy gets the same budget, --equivalents full trials' worth of training seconds (default 20), as a wall
time of seconds / workers plus the start-up allowance (every study's workers start cold). On one task the script
runs, each as `autopelt search` in a subprocess as a user would:
  1. autopelt   the default: default space, TPE, ASHA, the baselines first, `--budget <that wall time>`, so the
                baselines' cost is inside the budget;
  2. random     the same space and early stopping, drawn at random. It starts from a copy of study 1's
                baselines (same trials, not run again) and gets the training seconds study 1 spent on its
                searched trials;
  3. tuned-lora LoRA r8 on query/value with only its learning rate searched (log-uniform 1e-4..1e-2, TPE,
                ASHA, no baselines): the recipe a user reaches for with an HPO tool around peft. It gets the
                whole budget.
  4. the baselines, as study 1 ran them (each its paper structure at the learning rate it swept).
  5. autopelt's ensemble: study 1's trials combined as the search's summary combines them (autopelt/ensemble,
     greedy selection with replacement on dev predictions), the same members and weights at every re-run seed.

Then every strategy's pick, every baseline and every member of autopelt's ensemble is trained again with seeds 1..S
(--seed + 1 to --seed + S) on the same rows (the study's data seed) at the learning rate it trained with, keeping
its predictions; at each seed the ensemble averages its members' re-runs with the study's weights. The script prints
one table: test mean ± std over those seeds, stored params %, and the paired difference to autopelt's pick (mean ±
std over seeds).
--seed (default 0) sets every study's rows and training seed: another seed is another draw of K rows. It also prints
the best dev metric against cumulative training seconds for strategies 1 and 2, and the targets of issue 10.

Everything is kept in --work-dir (one SQLite file, trial outputs, re-runs); a second run with the same
arguments reuses what finished and runs only what is missing. --reuse DIR starts a new --work-dir from an
earlier one's calibration and tuned-LoRA study (with tuned LoRA's re-runs): neither goes through autopelt's
sweep, baselines or sampler, so a change to those leaves them as they were, and the run costs about 40% less.
Tuned LoRA is copied only where it ran at this run's wall-time budget (another --equivalents or --workers trains
it again).
A re-run that the earlier dir already trained with the very same settings (delta, learning rate, batch, rows,
seed, model, task, threads, ...) is copied too, not trained again; each copy is listed in --work-dir/COPIED.txt
and counted under the table. (On CPU such a run reproduces to the last digit; on a GPU it may not.) --copy-reruns
DIR copies such re-runs alone, from a dir whose searches are not wanted (a run at another calibration). Within a
run, two rows of the same settings (a finalist's re-run of a portfolio member and the member) train once.

`summary` writes one table over several runs' results files (each arm's test accuracy, worst seed and paired
difference to autopelt's pick, a row per task, from the newest `search-value-<task>[-LABEL]` files), as
`search-value-held-out[-LABEL]`.

Usage:
  python bench/search_value.py summary --tasks trec,tweeteval_emotion,qnli[:LABEL] [--label LABEL] [--name NAME]
  python bench/search_value.py --data-dir ../shared/data/glue-full --task sst2 --work-dir /tmp/value-sst2
  python bench/search_value.py --data-dir ../shared/data/own --task snli --text-columns premise,hypothesis \\
      --label-column relation --label-names entailment,neutral,contradiction --work-dir /tmp/value-snli
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from autopelt.study.record import baseline_of

STRATEGIES = ("autopelt", "random", "tuned-lora")
CALIBRATION = "calibration"
CALIBRATION_ROUNDS = 2  # of trials on every worker: the first round is cold, the second warm
TUNED_LORA_SPACE = """\
# tuned LoRA: LoRA r8 alpha 16 on query/value, only the learning rate searched (bench/search_value.py); the head
# reads the model as it was trained to be read (the mean of the token states, for a sentence-transformers model)
methods:
  lora:
    rank: {choice: [8]}
    alpha: {choice: [16]}
    targets: {choice: [[query, value]]}
head:
  pooling: {choice: [%(pooling)s]}
train:
  learning_rate: {float: [1.0e-4, 1.0e-2], log: true}
  epochs: %(epochs)d
  batch_size: 32
"""


def main() -> None:
    if sys.argv[1:2] == ["summary"]:
        return summary_main(sys.argv[2:])
    args = parse_args()
    work = Path(args.work_dir).resolve()
    source = reusable(Path(args.reuse).resolve(), args) if args.reuse else None  # before anything is written
    if args.copy_reruns and not (Path(args.copy_reruns) / "reruns").is_dir():
        raise SystemExit(f"--copy-reruns {args.copy_reruns}: no re-runs there; give an earlier --work-dir")
    work.mkdir(parents=True, exist_ok=True)
    storage = f"sqlite:///{work / 'studies.db'}"
    print(f"studies in {storage}", flush=True)
    if source:
        reuse(args, source, work, storage, CALIBRATION)

    space = work / "tuned-lora.yaml"
    space.write_text(TUNED_LORA_SPACE % {"epochs": args.epochs, "pooling": own_pooling(args.model)})
    run_study(args, work, storage, CALIBRATION, str(CALIBRATION_ROUNDS * args.workers),
              ["--space", str(space), "--no-baselines", "--no-early-stopping"])
    full, start_up = calibrate(finished_trials(storage, study_name(args, CALIBRATION)), args.workers)
    budget = args.equivalents * full
    print(f"one full trial: {full:.0f} s, and {start_up:.0f} s more for a worker's first; the budget of each "
          f"strategy: {args.equivalents:g} full trials, {budget:.0f} training seconds, "
          f"{wall(budget, args, start_up)} of wall time on {args.workers} workers with the start-up", flush=True)
    if source:
        reuse(args, source, work, storage, "tuned-lora", wall(budget, args, start_up))

    run_study(args, work, storage, "autopelt", wall(budget, args, start_up), ["--portfolio", args.portfolio])
    first = finished_trials(storage, study_name(args, "autopelt"))
    spent = sum(seconds(t) for t in first)
    baseline_spent = sum(seconds(t) for t in first if baseline_of(t))
    copy_baselines(storage, study_name(args, "autopelt"), study_name(args, "random"))
    run_study(args, work, storage, "random", wall(spent - baseline_spent, args, start_up),
              ["--sampler", "random", "--no-baselines", "--portfolio", "none"])  # it has study 1's baselines
    run_study(args, work, storage, "tuned-lora", wall(budget, args, start_up),
              ["--space", str(space), "--no-baselines"])

    studies = {name: finished_trials(storage, study_name(args, name)) for name in STRATEGIES}
    picks = pick_and_baselines(studies, args.rerun_baselines)
    members, ensemble_dev = ensemble_members(storage, study_name(args, "autopelt"), studies["autopelt"])
    reruns = rerun_all({**picks, **{label: record for label, record, _ in members}}, args, work,
                       Path(args.copy_reruns).resolve() if args.copy_reruns else source)
    if len(members) > 1:  # one member is the single answer again
        picks[ENSEMBLE] = EnsembleRow(members, ensemble_dev)
        reruns[ENSEMBLE] = ensemble_reruns(members, {**picks, **{label: r for label, r, _ in members}}, work,
                                           rerun_seeds(args))
    budgets, table = print_report(args, metric_of(storage, study_name(args, "autopelt")), studies, picks, reruns,
                                  full, start_up)
    save_results(args, budgets, table)


def own_pooling(model: str | None) -> str:
    """How `model` was trained to be read: mean for a sentence-transformers checkpoint (the default model), else
    cls, as `autopelt train` fills it in."""
    from autopelt.models import own_pooling as pooling_of, resolve_model

    return pooling_of(resolve_model(model))


def save_results(args, budgets: list[dict], table: list[dict]) -> None:
    """The two tables as benchmarks/results files (bench/results.py), for docs/benchmarks.md."""
    from results import write_results

    settings = {"task": args.task, "k": args.k, "epochs": args.epochs, "equivalents": args.equivalents,
                "seed": args.seed, "rerun_seeds": rerun_seeds(args), "workers": args.workers,
                "model": args.model or "all-MiniLM-L6-v2"}
    name = f"search-value-{args.task}" + (f"-{args.label}" if args.label else "")
    write_results(f"{name}-budgets", budgets, settings=settings, out_dir=args.results_dir)
    write_results(name, table, settings=settings, out_dir=args.results_dir,
                  columns=["delta", "what", "lr", "params_pct", "study_dev", "test_mean", "test_std", "test_min",
                           "paired_delta"])


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--task", default="sst2")
    parser.add_argument("--model", help="base model (default: autopelt's)")
    parser.add_argument("--k", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--equivalents", type=float, default=20,
                        help="each strategy's budget, in full LoRA trials' worth of training seconds")
    parser.add_argument("--seed", type=int, default=0,
                        help="every study's seed: the rows it trains and picks on, and its training seed")
    parser.add_argument("--seeds", type=int, default=5,
                        help="re-train picks and baselines with N seeds after --seed: 1..N by default")
    parser.add_argument("--rerun-baselines", choices=("all", "best"), default="all",
                        help="re-train every baseline, or only UniPELT(APL) and the single method best on dev")
    parser.add_argument("--portfolio", default="auto",
                        help="autopelt's portfolio: auto (the shipped one), none, or a file, e.g. one built without "
                             "this task: PYTHONPATH=lab python -m metalearning prior --leave-out TASK --out FILE")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cpus-per-trial", type=int, default=1)
    parser.add_argument("--text-columns")
    parser.add_argument("--label-column")
    parser.add_argument("--label-names")
    parser.add_argument("--regression", action="store_true", help="a real-valued label (autopelt search --regression)")
    parser.add_argument("--work-dir", required=True, help="studies, trial outputs and re-runs are kept here")
    parser.add_argument("--reuse", metavar="DIR",
                        help="take the calibration and tuned-LoRA studies from this earlier --work-dir")
    parser.add_argument("--copy-reruns", metavar="DIR",
                        help="copy from this earlier --work-dir every re-run trained there with the very same "
                             "settings, rather than train it again (with --reuse: from that dir)")
    parser.add_argument("--verbose", action="store_true", help="show each search's own output")
    parser.add_argument("--results-dir", help="where the results files go (default: benchmarks/results)")
    parser.add_argument("--label", help="results named search-value-TASK-LABEL (default: search-value-TASK)")
    return parser.parse_args()


def rerun_seeds(args) -> list[int]:
    """The re-runs' training seeds: none is a study's own (--seed) or its finalists' (--seed + 1000)."""
    return list(range(args.seed + 1, args.seed + args.seeds + 1))


def study_name(args, strategy: str) -> str:
    return f"value-{args.task}-{strategy}"


def wall(training_seconds: float, args, start_up: float) -> str:
    """The --budget of a study that may spend `training_seconds` on its workers, each of which starts cold."""
    return f"{max(1, round(training_seconds / args.workers + start_up))}s"


def run_study(args, work: Path, storage: str, strategy: str, budget: str, flags: list[str]) -> None:
    if (work / f"{strategy}.done").exists():
        print(f"{strategy}: done before, kept", flush=True)
        return
    name = study_name(args, strategy)
    command = [sys.executable, "-m", "autopelt.cli", "search", "--task", args.task, "--data-dir", args.data_dir,
               "--k", str(args.k), "--epochs", str(args.epochs), "--budget", budget, "--storage", storage,
               "--study-name", name, "--out", str(work / name), "--workers", str(args.workers),
               "--cpus-per-trial", str(args.cpus_per_trial), "--seed", str(args.seed), *flags]
    for flag in ("model", "text_columns", "label_column", "label_names"):
        if getattr(args, flag):
            command += [f"--{flag.replace('_', '-')}", getattr(args, flag)]
    if args.regression:
        command.append("--regression")
    print(f"$ autopelt {' '.join(command[3:])}", flush=True)
    subprocess.run(command, check=True, stdout=None if args.verbose else subprocess.DEVNULL)
    (work / f"{strategy}.done").write_text(budget)


def reusable(source: Path, args) -> Path:
    if not (source / f"{CALIBRATION}.done").exists() or not (source / "tuned-lora.done").exists():
        raise SystemExit(f"--reuse {source}: no finished calibration and tuned-LoRA study there; run it first")
    seed = study_seed(f"sqlite:///{source / 'studies.db'}", study_name(args, CALIBRATION))
    if seed != args.seed:
        raise SystemExit(f"--reuse {source}: its studies ran with --seed {seed}, not {args.seed}; give the same seed")
    return source


def study_seed(storage: str, name: str) -> int | None:
    """The training seed a study's first finished trial ran with (every trial of a study has the study's)."""
    from autopelt.export.export import trial_outputs
    from autopelt.study.record import read

    trials = [t for t in finished_trials(storage, name) if t.state.name == "COMPLETE"]
    return trial_outputs(read(trials[0]))[0]["settings"]["seed"] if trials else None


def reuse(args, source: Path, work: Path, storage: str, strategy: str, budget: str | None = None) -> None:
    """Copy a strategy that runs none of autopelt's own search code from `source`, once; with a `budget`, only if
    it ran at that budget there (else it is trained here)."""
    import optuna

    ran = (source / f"{strategy}.done").read_text()
    if (work / f"{strategy}.done").exists():
        return
    if budget is not None and ran != budget:
        print(f"{strategy}: not copied from {source}, which ran it at a budget of {ran}, not {budget}", flush=True)
        return
    name = study_name(args, strategy)
    if name in optuna.get_all_study_names(storage):  # copied before, interrupted before the marker
        optuna.delete_study(study_name=name, storage=storage)
    optuna.copy_study(from_study_name=name, from_storage=f"sqlite:///{source / 'studies.db'}",
                      to_storage=storage)
    if (source / "reruns" / f"{strategy}-pick").exists():
        shutil.copytree(source / "reruns" / f"{strategy}-pick", work / "reruns" / f"{strategy}-pick",
                        dirs_exist_ok=True)
    (work / f"{strategy}.done").write_text(ran)
    print(f"{strategy}: copied from {source}", flush=True)


def finished_trials(storage: str, name: str) -> list:
    """The study's trials that ended (complete, stopped early, failed), in the order they ended."""
    import optuna

    study = optuna.load_study(study_name=name, storage=storage)
    return sorted((t for t in study.get_trials(deepcopy=False) if t.datetime_complete),
                  key=lambda t: t.datetime_complete)


def seconds(trial) -> float:
    return (trial.datetime_complete - trial.datetime_start).total_seconds()


def copy_baselines(storage: str, source: str, target: str) -> None:
    """Create `target` with `source`'s attributes and its finished baseline trials (once)."""
    import optuna

    if target in optuna.get_all_study_names(storage):
        return
    old = optuna.load_study(study_name=source, storage=storage)
    new = optuna.create_study(study_name=target, storage=storage, directions=old.directions)
    for key, value in old.user_attrs.items():
        new.set_user_attr(key, value)
    new.set_metric_names(old.metric_names)
    for trial in finished_trials(storage, source):
        if baseline_of(trial) and trial.state == optuna.trial.TrialState.COMPLETE:
            new.add_trial(optuna.trial.create_trial(
                state=trial.state, values=trial.values, params=trial.params, distributions=trial.distributions,
                user_attrs=trial.user_attrs, intermediate_values=trial.intermediate_values))


def calibrate(trials: list, workers: int) -> tuple[float, float]:
    """(one full trial, the start-up allowance) in seconds: the median full trial of the calibration's second round,
    and how much longer the first round's median took (a worker's first trial also loads the model and the data).
    A calibration of one round (made before there were two) gives its median and no allowance."""
    ordered = sorted(trials, key=lambda t: t.datetime_start)
    cold, warm = (ordered[:workers], ordered[workers:]) if len(ordered) > workers else (ordered, ordered)
    full = full_trial_seconds(warm)
    return full, max(0.0, full_trial_seconds(cold) - full)


def full_trial_seconds(trials: list) -> float:
    """The median wall time of these LoRA trials trained to their last epoch."""
    from autopelt.study.record import read

    full = [seconds(t) for t in trials if read(t).full_fidelity and t.state.name == "COMPLETE"]
    return statistics.median(full) if full else float("nan")


CALIBRATION_TOLERANCE = 0.15


def calibration_check(full: float, tuned_lora: list) -> str:
    """The calibration against tuned LoRA's own trials trained to the end (the same delta, at the same time of
    the run as the searches): a calibration timed on a busier machine makes every budget larger than it says."""
    again = full_trial_seconds(tuned_lora)
    if not math.isfinite(again):
        return "(calibration check: tuned LoRA trained no trial to its end)"
    ratio = again / full
    verdict = "agrees" if abs(ratio - 1) <= CALIBRATION_TOLERANCE else \
        f"DOES NOT AGREE: each budget held about {1 / ratio:.2f}x as many such trials as it says"
    return (f"(calibration check: tuned LoRA's trials trained to the end took a median of {again:.0f} s, "
            f"{ratio:.2f}x the calibration's: {verdict})")


def pick_and_baselines(studies: dict, baselines: str = "all") -> dict:
    """{label: TrialRecord}: each strategy's pick (the study's own rule), the baselines of study 1 (all, or
    UniPELT(APL) and the best single method on dev) and, where study 1 ran a portfolio, its first member."""
    from autopelt.study import answers
    from autopelt.study.record import read

    out = {}
    for name, trials in studies.items():
        best = answers.best(r for r in map(read, trials) if r.full_fidelity)  # what `autopelt export` would take
        if best is not None:
            out[f"{name} pick"] = best
    ran = [r for r in map(read, studies["autopelt"]) if r.baseline and r.full_fidelity]
    if baselines == "best":
        single = answers.best(r for r in ran if r.baseline != "unipelt_apl")
        ran = [r for r in ran if r.baseline == "unipelt_apl" or r is single]
    for record in ran:
        out[f"baseline {record.baseline}"] = record
    first = [r for r in map(read, studies["autopelt"]) if r.portfolio.get("rank") == 0 and r.full_fidelity]
    if first:  # the portfolio's first member: the best single configuration across the other tasks
        out["portfolio first"] = first[0]
    return out


def rerun_all(picks: dict, args, work: Path, source: Path | None = None) -> dict:
    """{label: {seed: (dev, test)}}: each delta trained again with `rerun_seeds` at its own learning rate. A trial
    that is two things (autopelt's pick is often one of its baselines) is trained once and reported under both.
    A run `source` (--reuse) trained with the same settings is copied instead (copy_same_run)."""
    from autopelt.export.export import trial_outputs

    jobs, same = [], {}  # same: label -> the first label of the same trial
    for label, record in picks.items():
        first = owner(label, picks)
        if first != label:
            same[label] = first
            continue
        result, _ = trial_outputs(record)
        settings = dict(result["settings"])
        split_seed = settings.get("data_seed")
        split_seed = settings["seed"] if split_seed is None else split_seed
        for seed in rerun_seeds(args):
            out = rerun_dir(work, label, seed)
            jobs.append((label, seed, {**settings, "seed": seed, "data_seed": split_seed,
                                       "learning_rate": result["learning_rate"], "threads": args.cpus_per_trial,
                                       "score_test": True, "keep_predictions": True, "out_dir": str(out)}))
            if source is not None:
                copy_same_run(jobs[-1][2], source, work)
    # a trial of the same settings as one before it (a finalist re-run of a member, an ensemble member that is a
    # pick) trains once: the later one is copied from it when it has finished (COPIED.txt lists each copy)
    from autopelt.train import TrialSettings

    seen, unique, copies = set(), [], []
    for job in jobs:
        key = json.dumps(run_key(TrialSettings.from_dict(job[2]).to_dict()), sort_keys=True, default=str)
        (copies if key in seen else unique).append(job)
        seen.add(key)
    reruns: dict = {label: {} for label in picks}
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        for (label, seed, _), scores in zip(unique, pool.map(rerun, [job[2] for job in unique])):
            reruns[label][seed] = scores
    for label, seed, settings in copies:
        copy_same_run(settings, work, work)
        reruns[label][seed] = rerun(settings)
    for label, first in same.items():
        reruns[label] = reruns[first]
    return reruns


def owner(label: str, picks: dict) -> str:
    """The first label of `picks` naming the same trial as `label`: the one whose re-runs are trained."""
    return next((other for other, seen in picks.items() if seen.result_dir == picks[label].result_dir), label)


def rerun_dir(work: Path, label: str, seed: int) -> Path:
    return work / "reruns" / label.replace(" ", "-") / f"seed-{seed}"


ENSEMBLE = "autopelt ensemble"


class EnsembleRow:
    """The ensemble as a row of the report: what it is, and no single rate or size of its own."""

    def __init__(self, members: list, dev: float):
        self.members, self.dev = members, dev  # dev: the ensemble's on the study's dev set, where it was selected
        self.summary = f"{len(members)} members: " + ", ".join(f"{w:.2f} × {r.summary}" for _, r, w in members)
        self.learning_rate, self.result_dir = None, None
        self.params_pct = sum(r.params_pct or 0.0 for _, r, _ in members)  # every member's delta is stored


def ensemble_members(storage: str, name: str, trials: list) -> tuple[list[tuple[str, object, float]], float | None]:
    """([(label, TrialRecord, weight)], its dev metric) of the ensemble the search's summary shows for study `name`
    (autopelt/ensemble/study.py's default rule), heaviest first; ([], None) when no trial has predictions."""
    import optuna

    from autopelt.ensemble.study import study_ensemble
    from autopelt.errors import UserError
    from autopelt.study.record import trial_dirs
    from autopelt.study.record import read

    try:
        chosen = study_ensemble(trial_dirs(optuna.load_study(study_name=name, storage=storage)))
    except UserError:
        return [], None
    by_folder = {str(Path(r.result_dir)): r for r in map(read, trials) if r.result_dir}
    return [(f"ensemble member {i}", by_folder[str(member.folder)], weight)
            for i, (member, weight) in enumerate(zip(chosen.members, chosen.weights))], chosen.dev


def ensemble_reruns(members: list, picks: dict, work: Path, seeds: list[int]) -> dict:
    """{seed: (dev, test)} of the ensemble at each re-run seed: its members' re-runs at that seed (their kept
    predictions), averaged with the study's weights, scored by the task's metric."""
    from autopelt.ensemble.select import combine
    from autopelt.ensemble.study import metric_of
    from autopelt.train.predictions import dense, load

    out = {}
    for seed in seeds:
        runs = [rerun_dir(work, owner(label, picks), seed) for label, _, _ in members]
        kept = [load(run) for run in runs]
        result = json.loads((runs[0] / "result.json").read_text())
        regression = dense(kept[0], "dev").ndim == 1
        metric = metric_of(result["task"], result["metric"], regression)
        weights = [weight for _, _, weight in members]
        out[seed] = tuple(metric(combine([dense(k, split) for k in kept], weights), kept[0][f"{split}_labels"])
                          for split in ("dev", "test"))
    return out


def run_key(settings: dict) -> dict:
    """What makes two runs the same run: all their settings but where they write, the spec in its normal form."""
    from autopelt.delta import parse_spec

    key = {name: value for name, value in settings.items() if name not in ("out_dir", "cache_dir")}
    key["spec"] = parse_spec(key["spec"]).to_dict() if key.get("spec") else None
    return key


def copy_same_run(settings: dict, source: Path, work: Path) -> Path | None:
    """Copy into settings["out_dir"] a finished re-run of `source` trained with the same settings, once; each
    copy is a line of work/COPIED.txt. Returns the run copied, or None."""
    out = Path(settings["out_dir"])
    if (out / "result.json").exists():
        return None
    from autopelt.train import TrialSettings

    want = run_key(TrialSettings.from_dict(settings).to_dict())  # the form a run records its settings in
    for done in sorted((source / "reruns").glob(f"*/seed-{settings['seed']}/result.json")):
        result = json.loads(done.read_text())
        if result.get("status") == "ok" and run_key(result.get("settings", {})) == want:
            staging = out.with_name(out.name + ".copying")
            shutil.copytree(done.parent, staging, dirs_exist_ok=True)
            result["settings"]["out_dir"] = str(out)
            if result.get("delta_dir"):
                result["delta_dir"] = str(out / "delta")
            (staging / "result.json").write_text(json.dumps(result, indent=2))
            if out.exists():
                shutil.rmtree(out)  # a run interrupted before its result: nothing to keep
            staging.rename(out)  # whole or not at all
            with open(work / "COPIED.txt", "a") as log:
                log.write(f"{out.relative_to(work)} <- {done.parent} (same settings)\n")
            print(f"{out.relative_to(work)}: copied from {done.parent}", flush=True)
            return done.parent
    return None


def rerun(settings: dict) -> tuple[float, float]:
    """(dev, test) of one re-run; a run that finished before is read back, not trained again."""
    out = Path(settings["out_dir"])
    done = out / "result.json"
    if done.exists():
        result = json.loads(done.read_text())
    else:
        from autopelt.train import TrialSettings, run_trial

        result = run_trial(TrialSettings.from_dict(settings))
    if result["status"] != "ok":
        raise SystemExit(f"re-run in {out} failed: {result.get('reason')}")
    metric = result["metric"]
    return result["dev"][metric], result["test"][metric]


def metric_of(storage: str, name: str) -> str:
    import optuna

    from autopelt.study.info import read_study

    return read_study(optuna.load_study(study_name=name, storage=storage)).metric


def print_report(args, metric: str, studies: dict, picks: dict, reruns: dict, full: float,
                 start_up: float) -> tuple[list[dict], list[dict]]:
    """Print the report; return its two tables as rows: each strategy's trials and seconds against its allowance,
    and each delta's re-runs."""
    from autopelt.study.record import CUT_BY_DEADLINE, read

    print()
    seeds = rerun_seeds(args)
    print(f"## {args.task} · K={args.k} · {args.epochs} epochs · test {metric}, seeds {seeds[0]}-{seeds[-1]} on the "
          f"study's rows")
    print()
    print("| strategy | trials (complete / stopped early / cut by the deadline / never started / failed) | "
          "training seconds | "
          "full-trial equivalents after start-up |")
    print("|---|---|---:|---:|")
    budgets, table = [], []
    for name, trials in studies.items():
        own = [t for t in trials if not (name == "random" and baseline_of(t))]
        states = [t.state.name for t in own]
        records = [read(t) for t in own]
        timed = sum(r.stopped_by in CUT_BY_DEADLINE for r in records)  # pruned at the deadline
        interrupted = sum(r.fail_reason == "interrupted" for r in records)  # cut in its first epoch
        never = sum(r.fail_reason == "budget reached" for r in records)  # queued (a portfolio member), not begun
        spent = sum(seconds(t) for t in own)
        print(f"| {name} | {states.count('COMPLETE')} / {states.count('PRUNED') - timed} / {timed + interrupted} / "
              f"{never} / {states.count('FAIL') - interrupted - never} | {spent:.0f} | "
              f"{max(0.0, spent - args.workers * start_up) / full:.1f} |")
        budgets.append({"strategy": name, "complete": states.count("COMPLETE"), "never_started": never,
                        "training_seconds": spent,
                         "allowance_seconds": allowance(args, name) * args.workers,
                         "equivalents": max(0.0, spent - args.workers * start_up) / full})
    print(f"(one full trial: {full:.0f} s, the median LoRA r8 trial of the calibration's second round, trained to its "
          f"last epoch; a worker's first trial took {start_up:.0f} s more, which every study's budget allows each "
          f"worker once; random also had study 1's "
          f"{sum(1 for t in studies['random'] if baseline_of(t))} baselines)")
    print(calibration_check(full, studies["tuned-lora"]))
    print()
    reference = reruns.get("autopelt pick", {})
    print("| delta | what | lr | params % | study dev | test mean ± std | worst seed | paired Δ to autopelt's pick |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    means = {}
    for label, record in picks.items():
        dev = record.dev if label == ENSEMBLE else study_dev(record, studies[study_of(label)])
        tests = [reruns[label][s][1] for s in sorted(reruns[label])]
        means[label] = statistics.fmean(tests)
        diffs = [reruns[label][s][1] - reference[s][1] for s in sorted(reruns[label]) if s in reference]
        delta = "–" if label == "autopelt pick" or not diffs else f"{100 * statistics.fmean(diffs):+.1f} ± " \
                                                                  f"{100 * _std(diffs):.1f}"
        rate = f"{record.learning_rate:.2g}" if record.learning_rate else "–"  # the ensemble's members have their own
        print(f"| {label} | {record.summary or '–'} | {rate} | "
              f"{record.params_pct if record.params_pct is not None else float('nan'):.3f} | "
              f"{100 * dev:.1f} | {100 * means[label]:.1f} ± "
              f"{100 * _std(tests):.1f} | {100 * min(tests):.1f} | {delta} |")
        table.append({"delta": label, "what": record.summary, "lr": record.learning_rate,
                      "params_pct": record.params_pct, "study_dev": dev,
                      "tests": {str(s): reruns[label][s][1] for s in sorted(reruns[label])},
                      "test_mean": means[label], "test_std": _std(tests), "test_min": min(tests),
                      "paired_delta": statistics.fmean(diffs) if diffs and label != "autopelt pick" else None})
    own, other = work_copies(args)
    if own or other:
        source = "--copy-reruns" if args.copy_reruns else "--reuse"
        parts = ([f"{other} from {source}, trained there"] if other else []) + \
            ([f"{own} from this run's re-runs of another row"] if own else [])
        print(f"({' and '.join(parts)} with the same settings were copied, not trained again: "
              f"{Path(args.work_dir) / 'COPIED.txt'})")
    print()
    for name in ("autopelt", "random"):
        print(f"best dev against cumulative training seconds, {name}: {curve(studies[name], name)}")
    print()
    print_targets(means)
    return budgets, table


def allowance(args, strategy: str) -> float:
    """The wall-time budget (s) the strategy's study ran with, as written when it finished."""
    done = Path(args.work_dir).resolve() / f"{strategy}.done"
    return float(done.read_text().rstrip("s")) if done.exists() else float("nan")


def work_copies(args) -> tuple[int, int]:
    """(re-runs copied from this run's own, from another --work-dir), as COPIED.txt lists them."""
    work = Path(args.work_dir).resolve()
    log = work / "COPIED.txt"
    sources = [line.split(" <- ", 1)[1] for line in log.read_text().splitlines() if " <- " in line] \
        if log.exists() else []
    own = sum(Path(source.removesuffix(" (same settings)")).is_relative_to(work) for source in sources)
    return own, len(sources) - own


def study_of(label: str) -> str:
    """The study a row of the table comes from: a strategy's pick from its own, the baselines from study 1's."""
    return label.removesuffix(" pick") if label.endswith(" pick") else "autopelt"


def study_dev(record, trials: list) -> float:
    """The dev metric `record`'s own study picked by: a finalist's mean over its seeds there (finalists.py). Random's
    copies of the baselines share their result dirs and numbers with study 1's trials, not their finalists."""
    from autopelt.study import answers
    from autopelt.study.record import read

    return answers.dev_score(record, answers.seed_devs([read(t) for t in trials]))


def curve(trials: list, name: str) -> str:
    from autopelt.study.record import read

    from autopelt.study import answers

    points, spent, seen = [], 0.0, []
    for trial in trials:  # the answer's dev as the study stood after each trial (a finalist's: its mean over seeds)
        record = read(trial)
        seen.append(record)
        spent += seconds(trial) if not (name == "random" and record.baseline) else 0.0
        best = answers.best(seen)
        dev = answers.dev_score(best, answers.seed_devs(seen)) if best else None
        point = f"{spent:.0f}s→{dev:.3f}" if dev is not None else f"{spent:.0f}s→–"
        if not points or point != points[-1]:  # a trial that never trained (budget reached) moves neither
            points.append(point)
    return ", ".join(points)


def print_targets(means: dict) -> None:
    pick = means.get("autopelt pick")
    if pick is None:
        print("target: autopelt picked nothing")
        return
    baselines = {k: v for k, v in means.items() if k.startswith("baseline ")}
    rivals = {"tuned LoRA": means.get("tuned-lora pick"), "UniPELT(APL)": means.get("baseline unipelt_apl"),
              "the best baseline": max(baselines.values()) if baselines else None}
    for name, value in rivals.items():
        if value is not None:
            gap = 100 * (pick - value)
            print(f"target: autopelt's pick beats {name} by ≥ 1 point: {gap:+.1f} points → "
                  f"{'met' if gap >= 1 else 'missed'}")
    if means.get("random pick") is not None:
        gap = 100 * (pick - means["random pick"])
        print(f"target: autopelt's pick is not below random search: {gap:+.1f} points → "
              f"{'met' if gap >= 0 else 'missed'}")


def _std(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


ARMS = {"autopelt pick": "autopelt", "autopelt ensemble": "ensemble", "tuned-lora pick": "tuned LoRA",
        "baseline unipelt_apl": "UniPELT(APL)", "random pick": "random"}
GAINS = ("autopelt ensemble",)  # arms whose Δ reads "the arm minus autopelt's pick": what they add to it


def summary(tasks: list[str], run_label: str | None = None, folder: Path | None = None) -> list[dict]:
    """A row per task from its newest `search-value-<task>[-<run_label>]` file (a task given as TASK:LABEL reads
    its own label), then the mean of each Δ column."""
    from render_docs import newest  # bench/render_docs.py

    rows = []
    for entry in tasks:
        task, _, own = entry.partition(":")
        label = own or run_label
        results = f"search-value-{task}" + (f"-{label}" if label else "")
        record = newest(results, *([folder] if folder else []))
        if record is None:
            raise SystemExit(f"no {results} results: run bench/search_value.py --task {task} first")
        arms = {row["delta"]: row for row in record["rows"]}
        row = {"task": task, "equivalents": record["settings"].get("equivalents"),
               "seeds": len(record["settings"].get("rerun_seeds", []))}
        for label, name in ARMS.items():
            arm = arms.get(label)
            if arm is None:
                continue
            mean, worst = 100 * arm["test_mean"], 100 * arm["test_min"] if arm.get("test_min") is not None else None
            row[name] = f"{mean:.1f}" + (f" (worst {worst:.1f})" if worst is not None else "")
            if label in GAINS and arm.get("paired_delta") is not None:
                row[f"{name} − autopelt"] = round(100 * arm["paired_delta"], 1)
            elif label != "autopelt pick" and arm.get("paired_delta") is not None:
                row[f"Δ vs {name}"] = round(-100 * arm["paired_delta"], 1) + 0.0  # autopelt's pick minus the arm
        rows.append(row)
    deltas = list(dict.fromkeys(k for r in rows for k in r if k.startswith("Δ") or k.endswith("− autopelt")))
    rows.append({"task": "mean", **{k: round(statistics.fmean(r[k] for r in rows if k in r), 1) for k in deltas}})
    return rows


def summary_main(argv: list[str]) -> None:
    """`search_value.py summary`: the table over several tasks' runs, printed and written."""
    from results import write_results  # bench/results.py

    parser = argparse.ArgumentParser(prog="search_value.py summary", description="one table over several runs"
                                     "' results files")
    parser.add_argument("--tasks", required=True, type=lambda s: s.split(","),
                        help="TASK or TASK:LABEL (that task's --label), comma-separated")
    parser.add_argument("--label", help="read search-value-TASK-LABEL (search_value.py --label) for a task given "
                                        "without one")
    parser.add_argument("--name", help="results name (default: search-value-held-out[-LABEL])")
    args = parser.parse_args(argv)
    rows = summary(args.tasks, args.label)
    gains = [f"{ARMS[label]} − autopelt" for label in GAINS]
    columns = ["task", "equivalents", *ARMS.values(), *gains,
               *[f"Δ vs {name}" for label, name in list(ARMS.items())[1:] if label not in GAINS]]
    columns = [c for c in columns if any(c in row for row in rows)]  # an arm no run has (older runs: no ensemble)
    for row in rows:
        print(" | ".join(str(row.get(c, "")) for c in columns))
    name = args.name or "search-value-held-out" + (f"-{args.label}" if args.label else "")
    write_results(name, rows, columns=columns, settings={"tasks": args.tasks},
                  notes="Test metric x 100 (accuracy; Pearson r for a regression) over the re-run seeds of each arm's "
                        "pick (worst seed in brackets); equivalents: each arm's budget in full LoRA trials' worth "
                        "of training seconds; Δ vs an arm: autopelt's pick minus the arm, paired by seed, in "
                        "points; ensemble − autopelt: the study's ensemble minus its single answer, paired by seed; "
                        "from the search-value-<task> files.")


if __name__ == "__main__":
    main()

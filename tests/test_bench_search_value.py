"""bench/search_value.py end to end on the tiny model: three searches, the baselines, re-runs over seeds, its tables
as results files whose numbers are checked against the studies and the re-runs."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from tinymodels import make_settings, sst2_dir, tiny_model_dir, trial_cache  # noqa: F401  (fixtures)

BENCH = Path(__file__).resolve().parents[1] / "bench" / "search_value.py"


def run_bench(command: list[str], timeout: float = 1200) -> subprocess.CompletedProcess:
    """The bench in a process group of its own, so that a timeout also ends the searches it started."""
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise
    return subprocess.CompletedProcess(command, process.returncode, out, err)


@pytest.mark.slow
def test_the_search_value_benchmark_runs_end_to_end_on_a_tiny_model(tmp_path, tiny_model_dir, sst2_dir):
    # a warm tiny trial takes about 0.2 s and a worker's first 7 s more: 300 of them is about a minute a study
    results = tmp_path / "results"
    command = [sys.executable, str(BENCH), "--data-dir", str(sst2_dir), "--task", "sst2", "--model",
               str(tiny_model_dir), "--k", "24", "--epochs", "1", "--equivalents", "300", "--seeds", "2",
               "--workers", "1", "--work-dir", str(tmp_path / "work"), "--results-dir", str(results)]
    done = run_bench(command)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for line in ("| autopelt |", "| random |", "| tuned-lora |", "| autopelt pick |", "| tuned-lora pick |",
                 "| baseline unipelt_apl |", "best dev against cumulative training seconds, random"):
        assert line in out, out
    assert "(calibration check: tuned LoRA's trials trained to the end took a median of" in out

    # every strategy spent its training seconds within its allowance: its wall budget on its one worker, plus the
    # last trial's overrun to its next report (a tiny trial reports within a second)
    budgets = {row["strategy"]: row for row in results_file(results, "search-value-sst2-budgets")["rows"]}
    assert set(budgets) == {"autopelt", "random", "tuned-lora"}
    for name, row in budgets.items():
        assert 0 < row["training_seconds"] <= row["allowance_seconds"] + 5, (name, row)
        assert row["complete"] >= 1
    # random search gets what study 1 spent on its searched trials, so at most study 1's allowance
    assert budgets["random"]["allowance_seconds"] <= budgets["autopelt"]["allowance_seconds"]

    # the table is the re-runs' own figures: each mean and std from the result.json files of its seeds
    table = {row["delta"]: row for row in results_file(results, "search-value-sst2")["rows"]}
    assert {"autopelt pick", "random pick", "tuned-lora pick", "baseline unipelt_apl"} <= set(table)  # the portfolio's one
    pick = table["tuned-lora pick"]
    reruns = sorted((tmp_path / "work" / "reruns" / "tuned-lora-pick").glob("seed-*/result.json"))
    tests = {path.parent.name.removeprefix("seed-"): json.loads(path.read_text()) for path in reruns}
    assert sorted(tests) == sorted(pick["tests"]) == ["1", "2"]
    metric = tests["1"]["metric"]
    assert pick["tests"] == {seed: result["test"][metric] for seed, result in tests.items()}
    assert pick["test_mean"] == pytest.approx(statistics.fmean(pick["tests"].values()))
    tests_of_pick = list(pick["tests"].values())
    row = next(line for line in out.splitlines() if line.startswith("| tuned-lora pick |"))
    assert f"{100 * pick['test_mean']:.1f} ± {100 * pick['test_std']:.1f} | {100 * min(tests_of_pick):.1f} |" in row
    assert pick["test_min"] == min(tests_of_pick)
    assert (tmp_path / "work" / "reruns" / "tuned-lora-pick" / "seed-1" / "predictions.npz").is_file()
    if "autopelt ensemble" in table:  # study 1's trials combined: its members' re-runs at each seed
        assert sorted(table["autopelt ensemble"]["tests"]) == ["1", "2"] and "| autopelt ensemble |" in out

    # a re-run trained again reproduces its recorded test metric to the last digit (CPU, same settings)
    from autopelt.train import TrialSettings, run_trial

    settings = TrialSettings.from_dict({**tests["1"]["settings"], "out_dir": None,
                                        "precision": tests["1"]["precision"]})  # as `auto` resolved there
    assert run_trial(settings)["test"][metric] == tests["1"]["test"][metric]

    # the random study starts from study 1's baselines instead of training them again
    import optuna
    storage = f"sqlite:///{tmp_path / 'work' / 'studies.db'}"
    random = optuna.load_study(study_name="value-sst2-random", storage=storage)
    first = optuna.load_study(study_name="value-sst2-autopelt", storage=storage)
    copied = [t.user_attrs["baseline"] for t in random.trials if t.user_attrs.get("baseline")]
    ran = [t.user_attrs["baseline"] for t in first.trials if t.user_attrs.get("baseline") and t.state.name == "COMPLETE"]
    assert copied == ran and "unipelt_apl" in ran
    # a second run reuses the searches and the re-runs: the same table, nothing trained again
    again = run_bench(command)
    assert again.returncode == 0 and "done before, kept" in again.stdout
    assert again.stdout.split("## ")[1] == out.split("## ")[1]

    # --reuse and --copy-reruns refuse a source they cannot use, before anything is written
    missing = run_bench([*command[:-3], str(tmp_path / "work3"), "--reuse", str(tmp_path / "nothing")])
    assert missing.returncode != 0 and "no finished calibration and tuned-LoRA study there" in missing.stderr
    assert not (tmp_path / "work3").exists()  # nothing written
    other = run_bench([*command[:-3], str(tmp_path / "work3"), "--reuse", str(tmp_path / "work"), "--seed", "3"])
    assert other.returncode != 0 and "its studies ran with --seed 0, not 3" in other.stderr
    missing = run_bench([*command[:-3], str(tmp_path / "work3"), "--copy-reruns", str(tmp_path / "nothing")])
    assert missing.returncode != 0 and "--copy-reruns" in missing.stderr and "no re-runs there" in missing.stderr
    assert not (tmp_path / "work3").exists()


def results_file(folder: Path, name: str) -> dict:
    files = sorted(folder.glob(f"{name}-2*.json"))
    assert len(files) == 1, files
    return json.loads(files[0].read_text())


def load_bench():
    spec = importlib.util.spec_from_file_location("search_value", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_reuse_copies_a_rerun_only_when_every_setting_is_the_same(make_settings, tmp_path):
    bench = load_bench()
    source, work = tmp_path / "source", tmp_path / "work"
    spec = {"methods": [{"method": "lora", "rank": 8}]}
    before = source / "reruns" / "autopelt-pick" / "seed-1"
    (before / "delta").mkdir(parents=True)
    (before / "delta" / "delta.safetensors").write_bytes(b"weights")
    settings = make_settings(spec=spec, seed=1, data_seed=0, learning_rate=1e-3, out_dir=str(before)).to_dict()
    (before / "result.json").write_text(json.dumps({"status": "ok", "settings": settings, "test": {"accuracy": 0.7},
                                                    "delta_dir": str(before / "delta")}))
    failed = source / "reruns" / "baseline-lora" / "seed-2"
    failed.mkdir(parents=True)
    (failed / "result.json").write_text(json.dumps({"status": "failed", "settings": {**settings, "seed": 2}}))

    def job(**changes):
        out = work / "reruns" / "baseline-lora" / f"seed-{changes.get('seed', 1)}"
        return {**settings, **changes, "out_dir": str(out)}

    # a different rate, seed, batch or delta is another run; a run that failed there is not copied
    for changes in ({"learning_rate": 2e-3}, {"seed": 2}, {"batch_size": 2 * settings["batch_size"]},
                    {"spec": {"methods": [{"method": "lora", "rank": 16}]}}):
        assert bench.copy_same_run(job(**changes), source, work) is None, changes
    assert not (work / "reruns").exists() and not (work / "COPIED.txt").exists()

    # the same settings, the spec written with its defaults: copied whole, where it now lives, and listed
    same = job(spec={"methods": [{"method": "lora", "rank": 8, "alpha": 16, "targets": ["query", "value"]}]})
    assert bench.copy_same_run(same, source, work) == before
    out = Path(same["out_dir"])
    copied = json.loads((out / "result.json").read_text())
    assert copied["test"] == {"accuracy": 0.7} and copied["settings"]["out_dir"] == str(out)
    assert copied["delta_dir"] == str(out / "delta")
    assert (out / "delta" / "delta.safetensors").read_bytes() == b"weights"
    assert (work / "COPIED.txt").read_text() == f"reruns/baseline-lora/seed-1 <- {before} (same settings)\n"
    assert not list(out.parent.glob("*.copying"))
    # once: a run already there is kept and not listed again
    assert bench.copy_same_run(same, source, work) is None
    assert len((work / "COPIED.txt").read_text().splitlines()) == 1


def test_a_picks_study_dev_is_its_own_studys_mean_over_seeds():
    """random's copy of a baseline has study 1's result dir but its own number: its finalist is its study's."""
    from optuna.distributions import FloatDistribution
    from optuna.trial import TrialState, create_trial

    def trial(number, dev, result_dir, **attrs):
        made = create_trial(state=TrialState.COMPLETE, value=dev, params={"x": 0.5},
                            distributions={"x": FloatDistribution(0, 1)},
                            user_attrs={"result_dir": result_dir, "full_fidelity": True, **attrs})
        made.number = number
        return made

    first = [trial(0, 0.53, "/w/unipelt", baseline="unipelt_apl"), trial(1, 0.58, "/w/lora", baseline="lora"),
             trial(2, 0.34, "/w/unipelt-again", confirms={"trial": 0, "seed": 1000}),
             trial(3, 0.63, "/w/lora-again", confirms={"trial": 1, "seed": 1000})]
    random = [trial(0, 0.53, "/w/unipelt", baseline="unipelt_apl"), trial(1, 0.58, "/w/lora", baseline="lora"),
              trial(2, 0.61, "/w/lora-again-r", confirms={"trial": 1, "seed": 1000})]  # numbered as study 1's
    from autopelt.study.record import read

    bench = load_bench()
    assert bench.study_of("random pick") == "random" and bench.study_of("baseline lora") == "autopelt"
    assert bench.study_dev(read(random[1]), random) == pytest.approx((0.58 + 0.61) / 2)
    assert bench.study_dev(read(first[1]), first) == pytest.approx((0.58 + 0.63) / 2)
    assert bench.study_dev(read(first[0]), first) == pytest.approx((0.53 + 0.34) / 2)
    assert bench.study_dev(read(random[0]), random) == pytest.approx(0.53)  # no finalist in random's study


def timed_trial(seconds, full=True, start=0):
    """A finished trial that started `start` s into the study and took `seconds`."""
    import datetime

    from optuna.distributions import FloatDistribution
    from optuna.trial import TrialState, create_trial

    made = create_trial(state=TrialState.COMPLETE, value=0.8, params={"x": 0.5},
                        distributions={"x": FloatDistribution(0, 1)}, user_attrs={"full_fidelity": full})
    made.datetime_start = datetime.datetime(2026, 1, 1) + datetime.timedelta(seconds=start)
    made.datetime_complete = made.datetime_start + datetime.timedelta(seconds=seconds)
    return made


def test_the_calibration_times_a_warm_trial_and_allows_each_worker_its_cold_start():
    """Two workers, two rounds: the first round also loads the model and the data (33 s against 21 s). A full trial
    is the second round's median; the first round's extra is a start-up allowance, once per worker, on top of
    the budget's seconds / workers."""
    bench = load_bench()
    trials = [timed_trial(21, start=34), timed_trial(33, start=0), timed_trial(22, start=33),
              timed_trial(34, start=1)]  # in the order they ended, not started
    full, start_up = bench.calibrate(trials, workers=2)
    assert (full, start_up) == (21.5, 12.0)
    assert bench.wall(20 * full, argparse.Namespace(workers=2), start_up) == "227s"  # 215 + 12
    # a calibration of one round (made before there were two): its median, no allowance
    assert bench.calibrate([timed_trial(33), timed_trial(35)], workers=2) == (34.0, 0.0)
    # a warm round slower than the cold one allows nothing, not a negative start-up
    assert bench.calibrate([timed_trial(20, start=0), timed_trial(25, start=30)], workers=1) == (25.0, 0.0)


def test_a_rerun_of_the_same_settings_as_another_pick_is_trained_once_and_copied(make_settings, tmp_path,
                                                                                    monkeypatch):
    """A finalist re-run of the portfolio's first member is another trial with the same delta, rate and rows: its
    re-runs are the member's, copied, not trained again."""
    from types import SimpleNamespace

    bench = load_bench()
    settings = make_settings(spec={"methods": [{"method": "lora", "rank": 8}]}, seed=0, data_seed=0,
                             learning_rate=1e-3, out_dir=str(tmp_path / "unused")).to_dict()
    picks = {}
    for label, seed, rate in (("portfolio first", 0, 1e-3), ("ensemble member 0", 1000, 1e-3),
                              ("tuned-lora pick", 0, 3e-3)):
        trial = tmp_path / "study" / label.replace(" ", "-")
        (trial / "delta").mkdir(parents=True)
        (trial / "delta" / "delta.safetensors").write_bytes(b"weights")
        (trial / "result.json").write_text(json.dumps({"settings": {**settings, "seed": seed, "learning_rate": rate},
                                                       "learning_rate": rate}))
        picks[label] = SimpleNamespace(result_dir=str(trial))
    trained = []

    def fake_rerun(job):
        out = Path(job["out_dir"])
        if not (out / "result.json").exists():
            trained.append(str(out.relative_to(tmp_path / "work")))
            out.mkdir(parents=True)
            (out / "result.json").write_text(json.dumps({"status": "ok", "settings": job, "metric": "accuracy",
                                                         "dev": {"accuracy": job["seed"] / 10},
                                                         "test": {"accuracy": job["learning_rate"]}}))
        result = json.loads((out / "result.json").read_text())
        return result["dev"]["accuracy"], result["test"]["accuracy"]

    monkeypatch.setattr(bench, "rerun", fake_rerun)
    monkeypatch.setattr(bench, "ProcessPoolExecutor", lambda max_workers: _SerialPool())
    args = SimpleNamespace(seed=0, seeds=2, workers=2, cpus_per_trial=1)
    reruns = bench.rerun_all(picks, args, tmp_path / "work")
    assert sorted(trained) == ["reruns/portfolio-first/seed-1", "reruns/portfolio-first/seed-2",
                               "reruns/tuned-lora-pick/seed-1", "reruns/tuned-lora-pick/seed-2"]
    assert reruns["ensemble member 0"] == reruns["portfolio first"] == {1: (0.1, 1e-3), 2: (0.2, 1e-3)}
    assert reruns["tuned-lora pick"] == {1: (0.1, 3e-3), 2: (0.2, 3e-3)}
    copied = (tmp_path / "work" / "COPIED.txt").read_text().splitlines()
    assert [line.split(" <- ")[0] for line in copied] == ["reruns/ensemble-member-0/seed-1",
                                                          "reruns/ensemble-member-0/seed-2"]


class _SerialPool:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def map(self, function, items):
        return map(function, list(items))


def test_no_rerun_repeats_a_studys_own_seed_or_its_finalists():
    bench = load_bench()
    assert bench.rerun_seeds(argparse.Namespace(seed=0, seeds=5)) == [1, 2, 3, 4, 5]
    assert bench.rerun_seeds(argparse.Namespace(seed=10, seeds=3)) == [11, 12, 13]  # not 10, not 1010


def test_the_report_checks_the_calibration_against_tuned_loras_own_full_trials():
    """A calibration timed on a busier machine (65 s where the same trial later took 43 s) makes every budget
    larger than it says: the report says so."""
    trial = timed_trial
    bench = load_bench()
    tuned = [trial(43), trial(44), trial(42), trial(10, full=False)]  # a trial stopped early does not count
    assert "43 s, 0.66x the calibration's: DOES NOT AGREE: each budget held about 1.51x" in \
        bench.calibration_check(65.0, tuned)
    assert "1.05x the calibration's: agrees" in bench.calibration_check(41.0, tuned)
    assert "trained no trial to its end" in bench.calibration_check(41.0, [trial(10, full=False)])


def test_reuse_copies_tuned_lora_only_from_a_run_at_the_same_budget(tmp_path, capsys):
    import optuna

    bench = load_bench()
    args = argparse.Namespace(task="trec")
    source, other, same = tmp_path / "source", tmp_path / "other", tmp_path / "same"
    for folder in (source, other, same):
        folder.mkdir()
    study = optuna.create_study(study_name=bench.study_name(args, "tuned-lora"),
                                storage=f"sqlite:///{source / 'studies.db'}", direction="maximize")
    study.enqueue_trial({"x": 0.5})
    study.optimize(lambda trial: trial.suggest_float("x", 0, 1), n_trials=1)
    (source / "tuned-lora.done").write_text("449s")  # an 8-equivalent run's wall time on 2 workers
    bench.reuse(args, source, other, f"sqlite:///{other / 'studies.db'}", "tuned-lora", "1130s")
    assert not (other / "tuned-lora.done").exists() and not (other / "studies.db").exists()  # trained here
    assert "not copied" in capsys.readouterr().out
    bench.reuse(args, source, same, f"sqlite:///{same / 'studies.db'}", "tuned-lora", "449s")
    assert (same / "tuned-lora.done").read_text() == "449s"
    copied = optuna.load_study(study_name=bench.study_name(args, "tuned-lora"),
                               storage=f"sqlite:///{same / 'studies.db'}")
    assert [t.params for t in copied.trials] == [{"x": 0.5}]


def test_the_summary_is_a_row_per_task_and_the_mean_of_each_paired_difference(tmp_path):
    """`search_value.py summary`: each arm's mean (worst seed) and autopelt's pick minus the arm, from the newest
    search-value-<task> file of each task."""
    from support.benches import load_bench

    bench = load_bench("search_value")

    def arm(delta, mean, worst, paired=None):
        return {"delta": delta, "test_mean": mean, "test_min": worst, "paired_delta": paired}

    for task, (ours, lora, day) in {"a": (0.90, 0.85, "2026-01-02"), "b": (0.70, 0.72, "2026-01-02")}.items():
        record = {"settings": {"equivalents": 8, "rerun_seeds": [1, 2, 3]},
                  "rows": [arm("autopelt pick", ours, ours - 0.01), arm("tuned-lora pick", lora, lora - 0.02,
                                                                         paired=lora - ours)]}
        (tmp_path / f"search-value-{task}-{day}.json").write_text(json.dumps(record))
    (tmp_path / "search-value-a-2026-01-01.json").write_text(json.dumps({"settings": {}, "rows": []}))  # older
    rows = bench.summary(["a", "b"], folder=tmp_path)
    assert rows[0] == {"task": "a", "equivalents": 8, "seeds": 3, "autopelt": "90.0 (worst 89.0)",
                       "tuned LoRA": "85.0 (worst 83.0)", "Δ vs tuned LoRA": 5.0}
    assert rows[1]["Δ vs tuned LoRA"] == -2.0 and rows[2] == {"task": "mean", "Δ vs tuned LoRA": 1.5}
    # the ensemble's column is what it adds to the pick (the arm minus the pick), averaged over the tasks that have it
    record = {"settings": {"equivalents": 20, "rerun_seeds": [1, 2]},
              "rows": [arm("autopelt pick", 0.80, 0.79), arm("autopelt ensemble", 0.82, 0.815, paired=0.02)]}
    (tmp_path / "search-value-c-2026-01-03.json").write_text(json.dumps(record))
    rows = bench.summary(["a", "c"], folder=tmp_path)
    assert rows[1]["ensemble"] == "82.0 (worst 81.5)" and rows[1]["ensemble − autopelt"] == 2.0
    assert rows[2] == {"task": "mean", "Δ vs tuned LoRA": 5.0, "ensemble − autopelt": 2.0}
    with pytest.raises(SystemExit, match="search-value-d"):
        bench.summary(["d"], folder=tmp_path)
    # a task of another run label (another budget) beside them
    (tmp_path / "search-value-c-8eq-2026-01-04.json").write_text(json.dumps(
        {**record, "settings": {"equivalents": 8, "rerun_seeds": [1, 2]}}))
    rows = bench.summary(["a", "c:8eq"], folder=tmp_path)
    assert [r.get("equivalents") for r in rows] == [8, 8, None]
    with pytest.raises(SystemExit, match="search-value-c-20eq"):
        bench.summary(["a", "c:20eq"], folder=tmp_path)


def test_the_ensemble_arm_averages_its_members_reruns_with_the_studys_weights(tmp_path):
    """At each re-run seed the ensemble's outputs are its members' re-run predictions averaged with the weights the
    study chose; a member that is also a pick is read from the pick's re-runs (trained once)."""
    from types import SimpleNamespace

    import numpy as np

    from autopelt.train.predictions import save

    bench = load_bench()
    labels = np.array([0, 1, 1, 0])
    outputs = {"autopelt pick": np.array([[0.9, 0.1], [0.4, 0.6], [0.2, 0.8], [0.45, 0.55]]),  # each 3 of 4 right,
               "ensemble member 1": np.array([[0.6, 0.4], [0.45, 0.55], [0.6, 0.4], [0.9, 0.1]])}  # their mean 4
    for label, probabilities in outputs.items():
        run = bench.rerun_dir(tmp_path, label, 1)
        run.mkdir(parents=True)
        (run / "result.json").write_text(json.dumps({"task": "t", "metric": "accuracy"}))
        save(run, {"dev": probabilities.astype(np.float16), "dev_labels": labels,
                   "test": probabilities.astype(np.float16), "test_labels": labels})
    pick = SimpleNamespace(result_dir="/study/trial-3")
    members = [("ensemble member 0", SimpleNamespace(result_dir="/study/trial-3"), 0.5),
               ("ensemble member 1", SimpleNamespace(result_dir="/study/trial-7"), 0.5)]
    picks = {"autopelt pick": pick, **{label: record for label, record, _ in members}}
    scores = bench.ensemble_reruns(members, picks, tmp_path, [1])
    averaged = (outputs["autopelt pick"] + outputs["ensemble member 1"]) / 2
    expected = float((averaged.argmax(axis=1) == labels).mean())
    assert scores == {1: (pytest.approx(expected), pytest.approx(expected))}
    assert expected == 1.0 and all((o.argmax(axis=1) == labels).mean() == 0.75 for o in outputs.values())


def test_a_regression_task_reaches_every_search_as_one(tmp_path, monkeypatch):
    bench = load_bench()
    commands = []
    monkeypatch.setattr(bench.subprocess, "run", lambda command, **_: commands.append(command))
    for regression in (False, True):
        args = argparse.Namespace(task="emobank_valence", data_dir="pool", k=1000, epochs=3, workers=2,
                                  cpus_per_trial=1, seed=0, model=None, text_columns="text", label_column=None,
                                  label_names=None, regression=regression, verbose=False)
        bench.run_study(args, tmp_path, "sqlite://", f"autopelt-{regression}", "60", ["--portfolio", "auto"])
    assert "--regression" not in commands[0] and "--regression" in commands[1]

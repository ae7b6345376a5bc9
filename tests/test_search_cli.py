"""`autopelt search` with bad input: one line on stderr, exit code 2, and the database exactly as it was."""

from __future__ import annotations

import gc

import pytest

from conftest import GLUE_DIR

from autopelt.cli import main
from autopelt.search.plan import SearchOptions, prepare
from autopelt.search.resume import open_study


def run_cli(args, capsys):
    code = main(["search", *args])
    err = capsys.readouterr().err.strip().splitlines()
    return code, err


LOCAL = ["--data-dir", str(GLUE_DIR)]  # the tests run offline: without local data, that error would come first
BAD_INPUTS = {
    "budget 0": (["--task", "rte", "--budget", "0"], "--budget must be at least 1 trial"),
    "malformed budget": (["--task", "rte", "--budget", "2 hours"], "--budget '2 hours'"),
    "unknown task": (["--task", "nosuchtask", "--budget", "3"], "unknown task 'nosuchtask'"),
    "unknown space": (["--task", "rte", "--space", "nosuchspace", *LOCAL], "unknown search space 'nosuchspace'"),
    "missing model": (["--task", "rte", "--model", "./no/such/model"], "model folder ./no/such/model does not exist"),
    "bad max params": (["--task", "rte", "--max-params", "5x"], "--max-params '5x'"),
    "no workers": (["--task", "rte", "--workers", "0"], "--workers must be at least 1"),
    "more CPUs than the machine": (["--task", "rte", "--cpus-per-trial", "4096"], "--cpus-per-trial 4096, but"),
    "missing data dir": (["--task", "rte", "--data-dir", "./no/such/dir"], "--data-dir ./no/such/dir is not a folder"),
    "data dir without the task": (["--task", "rte", "--data-dir", "."], "--data-dir .: no rte/train.jsonl|csv|parquet"),
    "storage folder missing": (["--task", "rte", "--storage", "sqlite:///no/such/dir/s.db", *LOCAL],
                               "--storage: folder no/such/dir does not exist"),
    "not a URL": (["--task", "rte", "--storage", "autopelt.db", *LOCAL], "--storage 'autopelt.db' is not a database URL"),
    "unreachable Ray cluster": (["--task", "rte", "--ray-address", "127.0.0.1:9", *LOCAL],
                                "cannot reach the Ray cluster at 127.0.0.1:9 (Connection refused)"),
    "unreachable database": (["--task", "rte", "--storage", "postgresql://nobody@127.0.0.1:9/none", *LOCAL],
                             "cannot reach database postgresql+psycopg2://nobody@127.0.0.1:9/none: "),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_line_exit_2_and_no_database(case, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args, message = BAD_INPUTS[case]
    code, err = run_cli(args, capsys)
    assert code == 2
    assert len(err) == 1 and err[0].startswith("autopelt: error: ") and message in err[0], err
    assert list(tmp_path.iterdir()) == []  # no autopelt.db, no run folder


def test_malformed_space_file_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.yaml").write_text("methods:\n  lora:\n    rank: {choice: []}\ntrain:\n  learning_rate: 1e-3\n")
    (tmp_path / "unknown.yaml").write_text("methods:\n  sparse_magic: {}\ntrain:\n  learning_rate: 1e-3\n")
    for name in ("bad.yaml", "unknown.yaml"):
        code, err = run_cli(["--task", "rte", "--space", name, *LOCAL], capsys)
        assert code == 2 and len(err) == 1 and err[0].startswith(f"autopelt: error: {name}"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml", "unknown.yaml"]


def test_a_study_made_for_another_task_is_refused_and_its_database_unchanged(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    plan = prepare(SearchOptions(task="mrpc", study_name="mine", data_dir=str(GLUE_DIR)))
    open_study(plan)
    gc.collect()  # the first study's storage lets go of the file before its bytes are read (else, when the collector
    #               runs, SQLite may finish writing it later, inside the command below)
    before = (tmp_path / "autopelt.db").read_bytes()
    capsys.readouterr()
    code, err = run_cli(["--task", "rte", "--study-name", "mine", "--budget", "3", "--data-dir", str(GLUE_DIR)],
                        capsys)
    assert code == 2 and len(err) == 1 and "study 'mine'" in err[0] and "task 'mrpc'" in err[0], err
    assert (tmp_path / "autopelt.db").read_bytes() == before


def test_asking_for_a_gpu_on_a_machine_without_one_is_refused(tmp_path, monkeypatch, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.device_count():
        pytest.skip("this machine has a GPU")
    monkeypatch.chdir(tmp_path)
    code, err = run_cli(["--task", "rte", "--gpus-per-trial", "1"], capsys)
    assert code == 2 and err == ["autopelt: error: --gpus-per-trial 1, but this machine has no CUDA GPU"]
    assert list(tmp_path.iterdir()) == []


def test_no_data_anywhere_is_one_error_before_the_study_exists(tmp_path, monkeypatch, capsys):
    """Offline without --data-dir: the hub is tried once, up front; no trial runs and no database is written."""
    import autopelt.data.loading as loading
    from autopelt.cli import main

    def unreachable(path, name):
        raise ConnectionError("Couldn't reach 'nyu-mll/glue' on the Hub")

    monkeypatch.setattr(loading, "_hub_load_dataset", unreachable)
    monkeypatch.delenv("AUTOPELT_DATA_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    assert main(["search", "--task", "rte", "--budget", "10"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("autopelt: error: cannot load GLUE task 'rte': the hub is unreachable") and "--data-dir" in err
    assert "\n" not in err
    assert list(tmp_path.iterdir()) == []  # no autopelt.db, no autopelt_runs

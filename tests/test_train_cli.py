"""`autopelt train`: a run on the tiny model prints its summary and writes result.json; bad input is exit
code 2 with one `autopelt: error:` line, before any training."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from tinymodels import sst2_dir, tiny_model_dir  # noqa: F401  (fixtures)

from autopelt import cli, delta
from autopelt.train import lr_sweep


@pytest.fixture
def train(tiny_model_dir, sst2_dir, capsys):
    """Run `autopelt train` in-process on the tiny model and data: (exit code, stdout, stderr)."""
    def run(*flags: str, model: str | None = None, data_dir: str | None = None):
        argv = ["train", "--model", model or str(tiny_model_dir), "--data-dir", data_dir or str(sst2_dir),
                "--epochs", "1", "--batch-size", "16", "--lr", "0.01", "--max-length", "32", "--threads", "1",
                *flags]
        code = cli.main(argv)
        out, err = capsys.readouterr()
        return code, out, err

    return run


def test_train_lora_prints_a_summary_and_writes_the_result(train, tmp_path):
    out_dir = tmp_path / "out"
    code, out, _ = train("--task", "sst2", "--method", "lora", "--rank", "4", "--out", str(out_dir))
    assert code == 0, out
    result = json.loads((out_dir / "result.json").read_text())
    assert result["status"] == "ok"
    assert result["spec"] == delta.parse_spec({"methods": [{"method": "lora", "rank": 4}]}).to_dict()
    assert (out_dir / "delta" / "delta.safetensors").is_file()
    summary = out[out.index("sst2 · lora r4 · seed 0"):]  # after the per-evaluation progress lines
    assert f"dev       accuracy {result['dev']['accuracy']:.4f}  (best epoch 1 of 1)" in summary
    assert f"test      accuracy {result['test']['accuracy']:.4f}" in summary
    assert f"{result['params']['trainable']:,} trainable" in summary
    assert f"saved     {out_dir / 'delta'}" in summary
    assert "train 58 · dev 6 · test 32 (full)" in summary


def test_a_data_seed_keeps_the_rows_while_the_seed_changes_the_training(train, tmp_path):
    code, out, _ = train("--task", "sst2", "--method", "bitfit", "--k", "16", "--seed", "3", "--data-seed", "0",
                         "--out", str(tmp_path))
    assert code == 0, out
    settings = json.loads((tmp_path / "result.json").read_text())["settings"]
    assert settings["seed"] == 3 and settings["data_seed"] == 0


def test_train_adamix_over_lora_from_flags(train, tmp_path):
    code, out, _ = train("--task", "sst2", "--method", "adamix", "--inner", "lora", "--experts", "2", "--rank", "4",
                         "--out", str(tmp_path))
    assert code == 0, out
    spec = json.loads((tmp_path / "result.json").read_text())["spec"]
    expected = {"methods": [{"method": "adamix", "experts": 2, "delta": {"method": "lora", "rank": 4}}]}
    assert spec == delta.parse_spec(expected).to_dict()
    assert spec["methods"][0]["delta"]["rank"] == 4 and spec["methods"][0]["experts"] == 2
    assert "sst2 · adamix M2[lora r4] · seed 0" in out.splitlines()


def test_train_from_a_spec_file_and_from_a_preset(train, tmp_path):
    spec = {"methods": [{"method": "bitfit", "targets": ["query"]}]}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    code, out, _ = train("--task", "sst2", "--delta", str(tmp_path / "spec.json"), "--out", str(tmp_path / "a"))
    assert code == 0, out
    assert json.loads((tmp_path / "a" / "result.json").read_text())["spec"] == delta.parse_spec(spec).to_dict()
    code, out, _ = train("--task", "sst2", "--preset", "lora", "--out", str(tmp_path / "b"))
    assert code == 0, out
    saved = json.loads((tmp_path / "b" / "result.json").read_text())["spec"]
    assert saved == delta.parse_spec(delta.PRESETS["lora"]).to_dict()


def test_train_with_mean_pooling_records_it_in_the_spec_and_the_saved_delta(train, tmp_path):
    code, out, _ = train("--task", "sst2", "--preset", "lora", "--pooling", "mean", "--out", str(tmp_path))
    assert code == 0, out
    assert json.loads((tmp_path / "result.json").read_text())["spec"]["pooling"] == "mean"
    assert json.loads((tmp_path / "delta" / "delta.json").read_text())["spec"]["pooling"] == "mean"
    assert "sst2 · lora r8, mean pooling · seed 0" in out.splitlines()


def test_without_lr_a_trial_chooses_its_rate_and_records_how(tiny_model_dir, sst2_dir, tmp_path, capsys,
                                                              monkeypatch):
    def trained(*flags: str) -> dict:
        out = tmp_path / str(len(list(tmp_path.iterdir())))
        argv = ["train", "--model", str(tiny_model_dir), "--data-dir", str(sst2_dir), "--task", "sst2", "--epochs", "1",
                "--max-length", "32", "--threads", "1", "--max-train-examples", "16", "--out", str(out), *flags]
        assert cli.main(argv) == 0, capsys.readouterr()
        return json.loads((out / "result.json").read_text())

    for flags in (("--preset", "prompt"), ("--method", "lora")):
        result = trained(*flags)
        assert result["settings"]["learning_rate"] is None  # asked: choose one
        assert result["lr_choice"]["how"] == "sweep" and result["learning_rate"] == result["lr_choice"]["rate"]
        training_line = next(line for line in capsys.readouterr().out.splitlines() if "  training  " in line)
        assert "(swept " in training_line and "0.001, 0.003, 0.01" in training_line  # says how it was chosen
    given = trained("--preset", "prompt", "--lr", "0.002")
    assert given["learning_rate"] == given["settings"]["learning_rate"] == 0.002
    assert given["lr_choice"]["how"] == "given"

    monkeypatch.setattr(lr_sweep, "learned_margin", lambda floor, rows: 10.0)  # nothing learns by epoch 1
    second = trained("--method", "lora", "--epochs", "2")["lr_choice"]["second"]
    training_line = [line for line in capsys.readouterr().out.splitlines() if "  training  " in line][-1]
    assert f"{' and '.join(second)} on to the 2nd evaluation" in training_line


def test_own_data_with_text_labels(train, tmp_path, capsys):
    """A user's CSV with labels written as words: --text-columns and --label-names are all it takes."""
    import csv
    import random

    rng = random.Random(0)
    for split, rows in (("train", 64), ("validation", 16)):
        (tmp_path / "reviews").mkdir(exist_ok=True)
        with open(tmp_path / "reviews" / f"{split}.csv", "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["review", "sentiment"])
            for _ in range(rows):
                label = rng.choice(["neg", "pos"])
                writer.writerow([" ".join(rng.choice("abcdefgh") for _ in range(6)), label])
    code, out, err = train("--task", "reviews", "--data-dir", str(tmp_path), "--text-columns", "review",
                           "--label-column", "sentiment", "--label-names", "neg,pos", "--method", "bitfit",
                           "--out", str(tmp_path / "out"))
    assert code == 0, err
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert result["status"] == "ok" and result["protocol"]["test_size"] == 16
    assert set(result["test"]) == {"accuracy", "f1_macro"}
    # the delta remembers the task's columns and label names: predict needs nothing else
    assert cli.main(["predict", "--delta", str(tmp_path / "out" / "delta"), "--text", "a b c d"]) == 0
    predicted = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert predicted["label_name"] in ("neg", "pos")


def test_train_k_shot_flag(train, tmp_path):
    code, out, _ = train("--task", "sst2", "--method", "lora", "--k", "16", "--out", str(tmp_path))
    assert code == 0, out
    protocol = json.loads((tmp_path / "result.json").read_text())["protocol"]
    assert (protocol["name"], protocol["train_size"], protocol["dev_size"]) == ("k-shot", 16, 48)
    assert "(k-shot K=16)" in out


BAD_INPUTS = {
    "unknown task": (["--task", "nope", "--method", "lora"], "unknown task 'nope'"),
    "unknown method": (["--task", "sst2", "--method", "nope"], "unknown method 'nope'"),
    "unknown preset": (["--task", "sst2", "--preset", "nope"], "unknown preset 'nope'"),
    "rank not a number": (["--task", "sst2", "--method", "lora", "--rank", "x"], "--rank takes a number, not 'x'"),
    "bad field value": (["--task", "sst2", "--method", "lora", "--rank", "0"], "lora.rank = 0 is invalid"),
    "zero epochs": (["--task", "sst2", "--method", "lora", "--epochs", "0"], "epochs must be a positive integer"),
    "k of zero": (["--task", "sst2", "--method", "lora", "--k", "0"], "protocol 0"),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_input_is_one_error_line_and_exit_2(name, train, tmp_path):
    flags, message = BAD_INPUTS[name]
    code, out, err = train(*flags, "--out", str(tmp_path / "out"))
    assert_one_error_line(code, err, message)
    assert out == "" and not (tmp_path / "out").exists()  # nothing ran


def test_missing_data_dir_is_exit_2(train, tmp_path):
    missing = tmp_path / "no-such-dir"
    code, _, err = train("--task", "sst2", "--method", "lora", data_dir=str(missing))
    assert_one_error_line(code, err, f"--data-dir {missing} is not a folder")


@pytest.mark.parametrize("relative", [False, True], ids=["absolute", "relative"])
def test_missing_model_folder_is_exit_2(relative, train, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model = "./no-such-model" if relative else str(tmp_path / "models" / "no-such-model")
    code, out, err = train("--task", "sst2", "--method", "lora", model=model)
    assert_one_error_line(code, err, f"model folder {model} does not exist")


def assert_one_error_line(code: int, err: str, message: str) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("autopelt: error: ") and message in lines[0], lines[0]


def test_the_real_command_exits_2_with_one_line():
    """The installed entry point's exit code and stderr, in a fresh process (no warnings, no traceback)."""
    done = subprocess.run([sys.executable, "-m", "autopelt.cli", "train", "--task", "nope", "--method", "lora"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    tasks = "cola, sst2, mrpc, qqp, stsb, mnli, mnli-mm, qnli, rte, wnli"
    assert done.stderr.strip().splitlines() == [f"autopelt: error: unknown task 'nope'; valid tasks: {tasks}"]
    assert done.stdout == ""


def test_building_the_train_parser_imports_no_torch():
    """cli.py: heavy imports happen inside `run`, so `autopelt train --help` stays fast."""
    code = ("import argparse, sys; from autopelt.train import command; "
            "command.add_arguments(argparse.ArgumentParser()); "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", f"imported while building the parser: {done.stdout.strip()}"


def test_the_cli_imports_only_the_command_it_runs():
    """cli.py: `autopelt --help` imports no command module, and `autopelt methods` only its own."""
    code = ("import contextlib, io, sys; from autopelt.cli import main\n"
            "def commands(): return sorted(m for m in sys.modules if m.startswith('autopelt.') and 'command' in m)\n"
            "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
            "    try: main(['--help'])\n"
            "    except SystemExit: pass\n"
            "print(commands(), 'search' in out.getvalue() and 'dashboard' in out.getvalue())\n"
            "with contextlib.redirect_stdout(io.StringIO()): main(['methods'])\n"
            "print(commands())\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[] True", "['autopelt.delta.command']"]

"""`autopelt train` output that reads well anywhere: a bar on a terminal; in a file, one line per epoch."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios

import pytest
from tinymodels import sst2_dir, tiny_model_dir  # noqa: F401  (fixtures)

from autopelt import cli
from autopelt.train import progress as progress_module

STEPS_PER_EPOCH = 15  # 58 training rows of the synthetic SST-2 in batches of 4


def train_argv(model, data) -> list[str]:
    return [sys.executable, "-m", "autopelt.cli", "train", "--task", "sst2", "--method", "lora", "--rank", "2",
            "--model", str(model), "--data-dir", str(data), "--epochs", "2", "--batch-size", "4", "--lr", "0.01",
            "--max-length", "32", "--threads", "1"]


@pytest.mark.slow
def test_off_a_terminal_train_prints_one_line_per_epoch_and_no_bar(tiny_model_dir, sst2_dir):
    done = subprocess.run(train_argv(tiny_model_dir, sst2_dir), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    output = done.stdout + done.stderr
    assert "\r" not in output and "step/s" not in output  # no progress bar
    lines = output.strip().splitlines()
    before = lines[: lines.index("sst2 · lora r2 · seed 0")]
    echoed = [line for line in before if not line.startswith("epoch ")]  # what was inferred, a small dev's warning
    assert [line.split(":")[0] for line in echoed] == ["data", "warning"]
    progress = [line for line in before if line.startswith("epoch ")]
    assert [line.split(":")[0] for line in progress] == [f"epoch 1 step {STEPS_PER_EPOCH}/{2 * STEPS_PER_EPOCH}",
                                                          f"epoch 2 step {2 * STEPS_PER_EPOCH}/{2 * STEPS_PER_EPOCH}"]
    assert all(": dev accuracy " in line for line in progress)
    assert len(lines) == len(before) + 7  # the summary: title, data, training, params, dev, test, time lines


@pytest.mark.slow
def test_on_a_terminal_train_draws_its_bar(tiny_model_dir, sst2_dir):
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))  # a new pty is 0 x 0: no room
    process = subprocess.Popen(train_argv(tiny_model_dir, sst2_dir), stdout=subprocess.DEVNULL, stderr=follower)
    os.close(follower)
    try:
        bar = _read_all(leader)  # while it runs: a full terminal buffer would block the child
    finally:
        os.close(leader)
    assert process.wait(timeout=300) == 0
    assert "\r" in bar and f"/{2 * STEPS_PER_EPOCH}" in bar and "loss=" in bar


def test_a_long_epoch_off_a_terminal_says_it_is_alive(tiny_model_dir, sst2_dir, monkeypatch, capsys):
    monkeypatch.setattr(progress_module, "QUIET_LINE_SECONDS", 0.0)  # every step counts as "a while since the last line"
    argv = train_argv(tiny_model_dir, sst2_dir)[3:]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    alive = [line for line in out if line.startswith("step ")]
    epochs = [line for line in out if line.startswith("epoch ")]
    assert len(epochs) == 2 and len(alive) == 2 * STEPS_PER_EPOCH
    assert alive[0].startswith(f"step 1/{2 * STEPS_PER_EPOCH}: loss ") and alive[0].endswith(" left")
    assert alive[-1].endswith("about 0s left")  # the last step: nothing left


def _read_all(fd: int) -> str:
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the other end closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")

"""Offline, fast: the hub is asked once (or not at all in offline mode), and the one-line error comes in seconds,
not after the hub client's half a minute of retries. Each command runs in a fresh process, timed whole."""

from __future__ import annotations

import glob
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import GLUE_DIR

from autopelt import hub

REFUSED = "http://127.0.0.1:9"  # nothing listens on the discard port: every connection is refused at once


def offline_env(tmp_path: Path, **changes) -> dict:
    """The environment of a machine without the hub: no offline flags, an endpoint that refuses, empty caches."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "AUTOPELT_DATA_DIR")}
    env.update(HF_ENDPOINT=REFUSED, HF_HOME=str(tmp_path / "hf"), HF_DATASETS_CACHE=str(tmp_path / "hf" / "datasets"))
    env.update(changes)
    return env


def timed(args: list[str], env: dict, cwd: Path) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "autopelt.cli", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=120)
    return done, time.monotonic() - started


def assert_one_error_line(done: subprocess.CompletedProcess, *words: str) -> None:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("autopelt: error: ") and all(w in lines[0] for w in words), lines[0]


def test_search_without_the_hub_fails_in_one_line_under_5_seconds(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    done, seconds = timed(["search", "--task", "rte", "--budget", "10"], offline_env(tmp_path), work)
    assert_one_error_line(done, "cannot load GLUE task 'rte': the hub is unreachable", REFUSED, "--data-dir")
    assert seconds < 15, f"the offline error took {seconds:.1f} s (the hub client's retries take 25 s)"
    assert list(work.iterdir()) == []  # no database, no run folder


def test_train_with_a_hub_model_that_is_not_cached_fails_under_5_seconds(tmp_path):
    done, seconds = timed(["train", "--task", "rte", "--preset", "lora", "--model", "bert-base-uncased",
                           "--data-dir", str(GLUE_DIR)], offline_env(tmp_path), tmp_path)
    assert_one_error_line(done, "cannot load model 'bert-base-uncased'", "the hub is unreachable", "--model")
    assert seconds < 15, f"the offline error took {seconds:.1f} s (the hub client's retries take 25 s)"
    done, seconds = timed(["train", "--task", "rte", "--preset", "lora"], offline_env(tmp_path), tmp_path)
    assert_one_error_line(done, "cannot load GLUE task 'rte'", "--data-dir")  # exit 2 before training, not a failure
    assert seconds < 15, f"the offline error took {seconds:.1f} s (the hub client's retries take 25 s)"


class CountingHub(http.server.BaseHTTPRequestHandler):
    """A hub endpoint that answers 404 to everything and counts what it was asked."""

    requests: list[str] = []

    def do_HEAD(self):  # noqa: N802 (the handler's protocol)
        CountingHub.requests.append(self.path)
        self.send_response(404)
        self.end_headers()

    do_GET = do_HEAD

    def log_message(self, *args):
        pass


@pytest.fixture
def local_hub():
    CountingHub.requests = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), CountingHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_the_probe_tells_an_answering_hub_from_a_refusing_one_and_offline_mode_asks_nothing(local_hub, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(hub, "_answers", {})
    monkeypatch.setenv("HF_ENDPOINT", local_hub)
    assert hub.unreachable() is None  # a 404 is an answer
    assert hub.unreachable() is None and len(CountingHub.requests) == 1  # asked once, then remembered
    monkeypatch.setenv("HF_ENDPOINT", REFUSED)
    assert hub.unreachable() == f"{REFUSED}: Connection refused"
    monkeypatch.setenv("HF_ENDPOINT", local_hub)
    monkeypatch.setattr(hub, "_answers", {})
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub.unreachable() == "offline mode: HF_HUB_OFFLINE is set"
    assert len(CountingHub.requests) == 1  # offline mode is honoured up front: no request at all
    monkeypatch.delenv("HF_HUB_OFFLINE")
    assert hub.unreachable() is None and hub.unreachable(datasets=False) is None
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    assert hub.unreachable(datasets=True) == "offline mode: HF_DATASETS_OFFLINE is set"


def test_offline_mode_reaches_no_endpoint_from_the_command_either(tmp_path, local_hub):
    done, seconds = timed(["search", "--task", "rte", "--budget", "10"],
                          offline_env(tmp_path, HF_ENDPOINT=local_hub, HF_HUB_OFFLINE="1"), tmp_path)
    assert_one_error_line(done, "offline mode: HF_HUB_OFFLINE is set", "--data-dir")
    assert CountingHub.requests == [] and seconds < 15  # at once: the hub client's retries take 25 s


def fake_glue_cache(cache: Path, task: str = "rte") -> None:
    """A real `datasets` cache entry for nyu-mll/glue (config `task`), prepared from the local GLUE files, as a
    machine that once loaded the task from the hub has it."""
    script = f"""
import datasets, glob, json, os, shutil
files = {{s: "{GLUE_DIR}/{task}/" + s + ".jsonl" for s in ("train", "validation")}}
datasets.load_dataset("json", data_files=files)
source = glob.glob("{cache}/json/*/*/*")[0]
target = "{cache}/nyu-mll___glue/{task}/0.0.0/" + os.path.basename(source)
shutil.copytree(source, target)
for path in glob.glob(target + "/json-*.arrow"):
    os.rename(path, path.replace("/json-", "/glue-"))
info = json.load(open(target + "/dataset_info.json"))
json.dump({{**info, "config_name": "{task}"}}, open(target + "/dataset_info.json", "w"))
"""
    env = {**os.environ, "HF_DATASETS_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    subprocess.run([sys.executable, "-c", script], check=True, env=env, capture_output=True, timeout=300)
    shutil.rmtree(cache / "json")


@pytest.mark.slow
def test_a_task_in_the_datasets_cache_loads_without_the_hub_and_without_retries(tmp_path):
    fake_glue_cache(tmp_path / "hf" / "datasets")
    script = ("import json; from autopelt.data import load_task_splits; "
              "rows = load_task_splits('rte'); print(json.dumps({s: r[:3] + [len(r)] for s, r in rows.items()}))")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=offline_env(tmp_path),
                          timeout=120)
    seconds = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    from autopelt.data import load_task_splits

    local = load_task_splits("rte", GLUE_DIR)
    assert json.loads(done.stdout) == {s: r[:3] + [len(r)] for s, r in local.items()}
    assert seconds < 15, f"{seconds:.1f} s: the hub client's retries alone take 25 s"
    assert glob.glob(str(tmp_path / "hf" / "datasets" / "nyu-mll___glue" / "rte" / "*" / "*"))

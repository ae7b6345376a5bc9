"""`autopelt dashboard`: optuna-dashboard on the study's storage, on 127.0.0.1; bad input is one line, exit 2."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

optuna = pytest.importorskip("optuna")
pytest.importorskip("optuna_dashboard")

from autopelt.cli import main  # noqa: E402
from support import example_study as example  # noqa: E402

# Python, optuna and optuna-dashboard start slowly on a busy 2-core machine (~15 s seen), so the server gets a
# minute to answer.
STARTUP_SECONDS = 60


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


@pytest.fixture(scope="module")
def storage(tmp_path_factory) -> str:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'x.db'}"
    example.build(url)
    return url


@pytest.mark.slow
def test_dashboard_serves_the_study_on_loopback(storage, tmp_path):
    port = free_port()
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    with out.open("w") as stdout, err.open("w") as stderr:
        server = subprocess.Popen(
            [sys.executable, "-m", "autopelt.cli", "dashboard", "--storage", storage, "--port", str(port),
             "--study", example.STUDY], stdout=stdout, stderr=stderr, start_new_session=True,
        )
    try:
        studies, deadline = None, time.monotonic() + STARTUP_SECONDS
        while studies is None and time.monotonic() < deadline:
            assert server.poll() is None, f"the dashboard exited: {err.read_text()}"
            try:
                studies = get_json(f"http://127.0.0.1:{port}/api/studies")["study_summaries"]
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.3)
        assert studies is not None, f"no answer within {STARTUP_SECONDS} s: {err.read_text()}"
        assert [s["study_name"] for s in studies] == [example.STUDY]
        (study_id,) = [s["study_id"] for s in studies]
        detail = get_json(f"http://127.0.0.1:{port}/api/studies/{study_id}")
        assert len(detail["trials"]) == 13  # every record, waiting one included
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/dashboard", timeout=5) as page:
            assert page.status == 200
        first, best = out.read_text().splitlines()[:2]
        assert first == f"optuna-dashboard on {storage}: http://127.0.0.1:{port}/dashboard/studies/{study_id}"
        assert best == "best trial: #9 adapter b16 + prefix L5 + lora r4 (gated) (dev accuracy 0.7200)"
        address = _non_loopback_address()
        if address is not None:  # bound to loopback only: this machine's other address refuses
            with pytest.raises(OSError):
                socket.create_connection((address, port), timeout=2).close()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def _non_loopback_address() -> str | None:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("10.255.255.255", 1))  # no packet is sent: this only picks the outgoing interface
            address = probe.getsockname()[0]
    except OSError:
        return None
    return None if address.startswith("127.") else address


def dashboard(capsys, *argv) -> tuple[int, str]:
    code = main(["dashboard", *argv])
    return code, capsys.readouterr().err


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("autopelt: error: "), err
    return lines[0]


def test_missing_sqlite_file_is_an_error_and_is_not_created(tmp_path, capsys):
    db = tmp_path / "x.db"
    code, err = dashboard(capsys, "--storage", f"sqlite:///{db}", "--port", str(free_port()))
    assert code == 2 and "no database file" in one_error_line(err)
    assert not db.exists()


def test_unreachable_server_is_one_line(capsys):
    url = f"postgresql+psycopg2://user:secret@127.0.0.1:{free_port()}/db"
    code, err = dashboard(capsys, "--storage", url, "--port", str(free_port()))
    line = one_error_line(err)
    assert code == 2 and "secret" not in line
    assert "cannot reach database" in line or "driver is missing" in line


def test_port_in_use_is_one_line(storage, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, err = dashboard(capsys, "--storage", storage, "--port", str(port))
    assert code == 2 and f"cannot listen on 127.0.0.1:{port}" in one_error_line(err)


def test_unknown_study_lists_the_studies_there(storage, capsys):
    code, err = dashboard(capsys, "--storage", storage, "--study", "nope", "--port", str(free_port()))
    assert code == 2 and one_error_line(err).endswith("studies there: example")


def test_bad_port(storage, capsys):
    code, err = dashboard(capsys, "--storage", storage, "--port", "70000")
    assert code == 2 and "is not a port number" in one_error_line(err)

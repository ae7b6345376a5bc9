"""`autopelt report`: one self-contained HTML file, written atomically; bad input is one line and exit code 2."""

from __future__ import annotations

import re
import socket
import sqlite3

import pytest

optuna = pytest.importorskip("optuna")
pytest.importorskip("plotly")

from optuna.trial import create_trial  # noqa: E402

from autopelt.cli import main  # noqa: E402
from support import example_study as example  # noqa: E402


@pytest.fixture(scope="module")
def storage(tmp_path_factory) -> str:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'studies.db'}"
    example.build(url)
    example.build(url, name="second", multi_objective=True)
    return url


def report(capsys, *argv) -> tuple[int, str, str]:
    code = main(["report", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("autopelt: error: "), err
    return lines[0]


def test_report_is_one_self_contained_file(storage, tmp_path, capsys):
    out = tmp_path / "report.html"
    code, printed, _ = report(capsys, "--study", "example", "--storage", storage, "--out", str(out))
    assert code == 0 and printed.startswith(f"wrote {out} (")
    page = out.read_text(encoding="utf-8")
    from plotly.offline import get_plotlyjs

    assert f"<script>{get_plotlyjs()}</script>" in page  # the library itself, inlined in the head
    ours = page.replace(get_plotlyjs(), "")
    assert not re.search(r"<script[^>]+src=|<link[^>]+href=|https?://|@import", ours)  # nothing fetched
    assert page.count('class="plotly-graph-div"') == 6  # history, Pareto, baselines, importances, 2 gate maps
    assert '<meta name="autopelt-figures" content="6">' in page
    assert "Best trial <b>#9</b> (searched): <b>adapter b16 + prefix L5 + lora r4 (gated)</b>" in page
    assert "dev accuracy <b>0.7200</b>" in page and "test accuracy <b>0.7100</b>" in page
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]  # no temporary file left


def test_report_of_a_multi_objective_study_and_default_out(storage, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, _ = report(capsys, "--study", "second", "--storage", storage)
    assert code == 0 and (tmp_path / "second.html").is_file()


def test_report_replaces_an_existing_file(storage, tmp_path, capsys):
    out = tmp_path / "r.html"
    out.write_text("old")
    assert report(capsys, "--study", "example", "--storage", storage, "--out", str(out))[0] == 0
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


def test_text_from_the_study_is_escaped(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    study = optuna.create_study(study_name="<b>odd</b>", storage=url)
    study.set_user_attr("task", "<script>alert(1)</script>")
    study.add_trial(create_trial(value=0.5, user_attrs={"full_fidelity": True, "params_pct": 0.1,
                                                        "summary": "</script><script>alert(2)</script>"}))
    out = tmp_path / "x.html"
    assert report(capsys, "--study", "<b>odd</b>", "--storage", url, "--out", str(out))[0] == 0
    page = out.read_text(encoding="utf-8")
    assert "alert(1)" in page and "<script>alert" not in page and "<b>odd</b>" not in page


def test_unknown_study_lists_the_studies_there(storage, tmp_path, capsys):
    code, _, err = report(capsys, "--study", "nope", "--storage", storage, "--out", str(tmp_path / "r.html"))
    assert code == 2
    assert one_error_line(err) == f"autopelt: error: no study 'nope' in {storage}; studies there: example, second"
    assert not (tmp_path / "r.html").exists()


def test_missing_sqlite_file_is_not_created(tmp_path, capsys):
    db = tmp_path / "missing.db"
    code, _, err = report(capsys, "--study", "x", "--storage", f"sqlite:///{db}", "--out", str(tmp_path / "r.html"))
    assert code == 2 and "no database file" in one_error_line(err)
    assert not db.exists()


def test_files_that_hold_no_studies(tmp_path, capsys):
    text = tmp_path / "notes.db"
    text.write_text("not a database")
    code, _, err = report(capsys, "--study", "x", "--storage", f"sqlite:///{text}")
    assert code == 2 and "is not an SQLite database" in one_error_line(err)
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as connection:
        connection.execute("CREATE TABLE t (x)")
    code, _, err = report(capsys, "--study", "x", "--storage", f"sqlite:///{other}")
    assert code == 2 and "holds no Optuna studies" in one_error_line(err)
    with sqlite3.connect(other) as connection:  # and reading did not add Optuna's tables
        assert connection.execute("SELECT name FROM sqlite_master").fetchall() == [("t",)]


def test_unreachable_server_is_one_line_without_the_password(tmp_path, capsys):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"postgresql+psycopg2://user:secret@127.0.0.1:{port}/db"
    code, _, err = report(capsys, "--study", "x", "--storage", url, "--out", str(tmp_path / "r.html"))
    line = one_error_line(err)
    assert code == 2 and "secret" not in line
    assert "cannot reach database" in line or "driver is missing" in line


@pytest.mark.parametrize("argv, message", [
    (["--storage", "not a url"], "is not a database URL"),
    (["--out", "/no/such/folder/r.html"], "folder /no/such/folder does not exist"),
    (["--top", "0"], "--top must be at least 1"),
])
def test_bad_arguments(storage, capsys, argv, message):
    argv = ["--study", "example", "--storage", storage, *argv]
    code, _, err = report(capsys, *argv)
    assert code == 2 and message in one_error_line(err)

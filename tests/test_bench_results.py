"""bench/results.py writes a benchmark's table with where and how it was measured; bench/render_docs.py puts the
newest one of each name into the pages' marked blocks, and nothing else."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from support.benches import load_bench


def test_a_results_file_holds_the_rows_and_their_provenance(tmp_path, monkeypatch):
    results = load_bench("results")
    monkeypatch.setattr(sys, "argv", ["bench/x.py", "--task", "sst2"])
    rows = [{"method": "lora", "test": 0.8123, "seconds": 12.5}, {"method": "bitfit", "test": 0.79, "seconds": 9.0}]
    path = results.write_results("step-x", rows, columns=["method", "test"], precision="fp32",
                                 settings={"k": 1000}, out_dir=tmp_path)
    record = json.loads(path.read_text())
    assert path.name == f"step-x-{record['date'][:10]}.json"
    assert record["rows"] == rows and record["columns"] == ["method", "test"] and record["settings"] == {"k": 1000}
    assert record["command"] == "bench/x.py --task sst2" and record["precision"] == "fp32"
    assert record["commit"] != "" and record["hardware"]["cpu"]["cores"] == os.cpu_count()
    assert set(record["hardware"]["cpu"]["flags"]) <= set(results.SPEED_FLAGS)
    assert record["torch"].split(".")[0].isdigit()
    with pytest.raises(ValueError, match="benchmark name"):
        results.write_results("Bad Name", rows, out_dir=tmp_path)


def test_render_fills_each_marked_block_from_the_newest_file_and_leaves_the_rest(tmp_path):
    render = load_bench("render_docs")
    record = {"name": "speed", "date": "2026-01-02T00:00:00Z", "command": "bench/speed.py", "commit": "abc",
              "hardware": {"cpu": {"model": "Some CPU", "cores": 2, "flags": ["avx2"]}, "gpu": None},
              "torch": "2.13.0", "precision": "bf16", "settings": {}, "columns": ["method", "ms"],
              "rows": [{"method": "lora", "ms": 12.345}, {"method": "a|b", "ms": None}], "notes": None}
    (tmp_path / "speed-2026-01-01.json").write_text(json.dumps({**record, "rows": []}))
    (tmp_path / "speed-2026-01-02.json").write_text(json.dumps(record))
    page = "intro\n<!-- results: speed -->\nold table\n<!-- /results -->\nend\n"
    out = render.render(page, tmp_path)
    assert out.startswith("intro\n<!-- results: speed -->\n| method | ms |\n|---|---|\n| lora | 12.3 |\n")
    assert "| a\\|b | – |" in out and "old table" not in out and out.count("end\n") == 1
    assert "*Some CPU (2 cores, avx2) · torch 2.13.0 · bf16 · 2026-01-02 · commit abc · `bench/speed.py`*" in out
    assert render.render(out, tmp_path) == out  # rendering twice changes nothing
    with pytest.raises(render.MissingResults, match="none"):  # a block whose benchmark has no file: no empty block
        render.render(page + "<!-- results: none -->\n<!-- /results -->\n", tmp_path)


def test_a_value_in_a_sentence_is_read_from_the_newest_file_as_it_stands(tmp_path):
    render = load_bench("render_docs")
    record = {"settings": {"tasks": ["a", "b"]}, "notes": "x",
              "rows": [{"budget": 8, "single": 75.77002566245811, "answer": 76.34385379547422, "kind": "pair"},
                       {"budget": 16, "single": 75.7, "answer": 76.5, "kind": "mean", "oracle": "77.03"}]}
    (tmp_path / "loo-2026-01-01.json").write_text(json.dumps({**record, "rows": [{"budget": 8, "answer": 0.0}]}))
    (tmp_path / "loo-2026-01-02.json").write_text(json.dumps(record))
    page = ("ensembles add <!-- value: loo:rows/budget=8/answer - rows/budget=8/single %+.2f -->+0.5<!-- /value -->; "
            "the oracle <!-- value: loo:rows/kind=mean/oracle -->77<!-- /value -->, "
            "<!-- value: loo:rows/1/answer -->?<!-- /value --> on <!-- value: loo:settings/tasks/1 --><!-- /value -->")
    out = render.render(page, tmp_path)
    assert out == ("ensembles add <!-- value: loo:rows/budget=8/answer - rows/budget=8/single %+.2f -->+0.57"
                   "<!-- /value -->; the oracle <!-- value: loo:rows/kind=mean/oracle -->77.03<!-- /value -->, "
                   "<!-- value: loo:rows/1/answer -->76.5<!-- /value --> on <!-- value: loo:settings/tasks/1 -->b"
                   "<!-- /value -->")  # a string as written (not re-rounded), a float as a table cell shows it
    assert render.render(out, tmp_path) == out
    pinned = ("<!-- value: loo@2026-01-01:rows/budget=8/answer -->?<!-- /value --> then "
              "<!-- value: loo:rows/budget=8/single - rows/1/single %+.1f x100 -->?<!-- /value -->")
    assert render.render(pinned, tmp_path) == ("<!-- value: loo@2026-01-01:rows/budget=8/answer -->0<!-- /value --> then "
                                               "<!-- value: loo:rows/budget=8/single - rows/1/single %+.1f x100 -->+7.0"
                                               "<!-- /value -->")  # a superseded day's file, and a scaled difference
    with pytest.raises(render.MissingResults, match="loo@2026-01-03"):
        render.render("<!-- value: loo@2026-01-03:rows/0/answer -->?<!-- /value -->", tmp_path)
    with pytest.raises(render.MissingResults, match="does not close"):  # a marker wrapped over two lines
        render.render("a <!-- value: loo:rows/0/answer -->1<!--\n/value --> b", tmp_path)
    syntax = "write `<!-- value: NAME:PATH -->…<!-- /value -->`"  # a page that explains the marker is left alone
    assert render.render(syntax, tmp_path) == syntax
    both = "<!-- value: loo:rows/budget=16&kind=mean/answer -->?<!-- /value -->"  # several conditions: one row
    assert render.render(both, tmp_path) == both.replace("?", "76.5")
    for spec, error in (("none:rows/0/answer", "no results file"), ("loo:rows/budget=9/answer", "0 rows"),
                        ("loo:rows/budget=16&kind=pair/answer", "0 rows"),
                        ("loo:rows/budget=8/oracle", "nothing at `oracle`"), ("loo:notes %.2f", "not a number")):
        with pytest.raises(render.MissingResults, match=error):  # no number the file does not hold
            render.render(f"<!-- value: {spec} -->1<!-- /value -->", tmp_path)


def test_the_newest_file_of_a_name_is_read_across_folders(tmp_path):
    render = load_bench("render_docs")
    for folder, day in (("a", "2026-01-03"), ("b", "2026-01-02")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / f"speed-{day}.json").write_text(json.dumps({"day": day}))
    assert render.newest("speed", tmp_path / "a", tmp_path / "b") == {"day": "2026-01-03"}
    assert render.newest("spee", tmp_path / "a", tmp_path / "b") is None  # a name is matched whole


def test_every_page_renders_from_the_committed_results():
    """Every block of README.md and docs/ has a results file, and the pages are as the files render them."""
    render = load_bench("render_docs")
    assert render.main(["--check"]) == 0


def test_only_changes_outside_the_results_folder_mark_the_commit_dirty(tmp_path):
    """A bench that writes several files must not read its own first file as a change to the code it ran."""
    import importlib.util
    import shutil
    import subprocess

    bench = tmp_path / "bench"
    bench.mkdir()
    shutil.copy(Path(load_bench("results").__file__), bench / "results.py")
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results" / "a.json").write_text("{}\n")

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "x")
    spec = importlib.util.spec_from_file_location("results_copy", bench / "results.py")
    copy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copy)
    assert not copy.commit().endswith("+dirty")
    (tmp_path / "benchmarks" / "results" / "a.json").write_text('{"rows": []}\n')  # a bench's own output
    assert not copy.commit().endswith("+dirty")
    (bench / "results.py").write_text((bench / "results.py").read_text() + "\n# changed\n")  # the code
    assert copy.commit().endswith("+dirty")


def test_bench_commit_names_the_tree_a_copy_ran(monkeypatch):
    """A copy sent to a GPU machine may carry a stale .git: the commit its caller names wins."""
    monkeypatch.setenv("BENCH_COMMIT", "123f277be62c")
    assert load_bench("results").commit() == "123f277be62c"
    monkeypatch.delenv("BENCH_COMMIT")
    assert load_bench("results").commit() != "123f277be62c"

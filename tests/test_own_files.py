"""Your own data as two files (`--train-file`, `--validation-file`): text columns, label column and label names
read from the train file where no flag gives them; a file it cannot read is one error line listing its columns."""

from __future__ import annotations

import csv
import json
import random

import pytest
from tinymodels import tiny_model_dir  # noqa: F401  (fixture)

from autopelt import cli
from autopelt.data.own_files import task_from_files
from autopelt.errors import UserError

INTENTS = [f"intent_{i:02d}" for i in range(77)]


def write_csv(path, header, rows) -> str:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return str(path)


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def intent_rows(rng: random.Random, per_class: int) -> list[list[str]]:
    """(text, label) rows: each text says its intent by a word of its own, in shuffled order."""
    rows = [[f"please help with {name.replace('_', ' ')} {rng.choice(['now', 'today', 'soon'])}", name]
            for name in INTENTS for _ in range(per_class)]
    rng.shuffle(rows)
    return rows


def train_cli(tiny_model_dir, *flags):
    return cli.main(["train", "--model", str(tiny_model_dir), "--epochs", "1", "--batch-size", "16", "--lr", "0.01",
                     "--max-length", "16", "--threads", "1", "--method", "lora", *flags])


def test_a_77_class_csv_with_text_labels_trains_without_label_names(tiny_model_dir, tmp_path, capsys):
    rng = random.Random(0)
    train = write_csv(tmp_path / "a.csv", ["text", "label"], intent_rows(rng, 3))
    validation = write_csv(tmp_path / "b.csv", ["text", "label"], intent_rows(rng, 1))
    out = tmp_path / "out"
    code = train_cli(tiny_model_dir, "--train-file", train, "--validation-file", validation, "--out", str(out))
    assert code == 0, capsys.readouterr().err
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "ok" and result["task"] == "a" and result["protocol"]["test_size"] == 77
    header = json.loads((out / "delta" / "delta.json").read_text())
    assert header["label_names"] == sorted(INTENTS) and header["text_columns"] == ["text"]
    capsys.readouterr()
    assert cli.main(["predict", "--delta", str(out / "delta"), "--text", "please help with intent 05"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["label_name"] in INTENTS


@pytest.mark.parametrize("columns, expected", [
    (["premise", "hypothesis", "label"], ["premise", "hypothesis"]),
    (["idx", "sentence1", "sentence2", "label"], ["sentence1", "sentence2"]),
    (["question", "sentence", "label"], ["question", "sentence"]),
    (["id", "review", "label"], ["review"]),  # the one text column besides the label (id holds numbers)
])
def test_text_columns_are_inferred_when_unambiguous(columns, expected, tmp_path):
    rows = [{c: (str(i) if c == "id" else i if c == "idx" else "neg" if c == "label" else f"words {i}")
             for c in columns} for i in range(4)]
    rows[1]["label"] = "pos"
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    fields = task_from_files("t", path, path, {"label_column": "label"})
    assert fields["text_columns"] == expected and fields["label_names"] == ["neg", "pos"]


def test_whole_number_labels_give_classes_and_other_numbers_a_regression(tmp_path):
    classes = write_jsonl(tmp_path / "c.jsonl", [{"text": "a", "label": n} for n in (0, 2, 1)])
    scores = write_jsonl(tmp_path / "s.jsonl", [{"text": "a", "label": x} for x in (0.5, 4.2)])
    assert task_from_files("c", classes, classes, {})["num_labels"] == 3
    assert task_from_files("s", scores, scores, {})["regression"] is True
    given = task_from_files("c", classes, classes, {"label_names": ["x", "y", "z"], "text_columns": ["text"]})
    assert given["label_names"] == ["x", "y", "z"]


def test_parquet_is_read_too(tmp_path):
    import pyarrow
    import pyarrow.parquet

    path = tmp_path / "train.parquet"
    pyarrow.parquet.write_table(pyarrow.table({"utterance": ["a b", "c d"], "label": ["x", "y"]}), path)
    fields = task_from_files("p", str(path), str(path), {})
    assert fields["text_columns"] == ["utterance"] and fields["files"]["train"] == str(path.resolve())


def test_a_file_whose_text_column_cannot_be_inferred_is_one_line_listing_its_columns(tiny_model_dir, tmp_path,
                                                                                     capsys):
    rows = [["a title", "a body", "neg"], ["t", "b", "pos"]]
    train = write_csv(tmp_path / "a.csv", ["title", "body", "label"], rows)
    code = train_cli(tiny_model_dir, "--train-file", train, "--validation-file", train, "--out", str(tmp_path / "o"))
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("autopelt: error:")
    assert "title, body, label" in err and "--text-columns" in err
    assert not (tmp_path / "o").exists()


def test_a_missing_label_column_and_a_lone_train_file_are_errors(tmp_path):
    path = write_jsonl(tmp_path / "t.jsonl", [{"text": "a", "y": 1}])
    with pytest.raises(UserError, match=r"no label column 'label' \(columns: text, y\)"):
        task_from_files("t", path, path, {})
    assert cli.main(["train", "--train-file", path, "--method", "lora"]) == 2


def test_search_prepares_a_plan_on_the_files_without_a_data_dir(tiny_model_dir, tmp_path):
    from autopelt.search.plan import SearchOptions, prepare

    rows = [{"premise": f"p {i}", "hypothesis": f"h {i}", "relation": ("yes", "no")[i % 2]} for i in range(8)]
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    fields = task_from_files("nli", path, path, {"label_column": "relation"})
    plan = prepare(SearchOptions(task="nli", model=str(tiny_model_dir), custom_task=fields, budget="2",
                                 storage=f"sqlite:///{tmp_path}/s.db", baselines=False))
    assert plan.data_dir is None and plan.num_labels == 2 and plan.task == "nli"

"""Loading splits from a local directory (synthetic and the real GLUE files) or the (monkeypatched) hub."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from autopelt.data import loading
from autopelt.data.loading import load_task_splits
from autopelt.data.tasks import GLUE_TASKS, custom_task, get_task
from autopelt.errors import UserError


def synthetic_rows(task, count: int, offset: int = 0) -> list[dict]:
    """Rows in the hub schema of `task`: its text columns, a label, an idx."""
    rows = []
    for i in range(offset, offset + count):
        row = {column: f"{column} number {i}" for column in task.text_columns}
        row["label"] = round(i * 0.37 % 5, 2) if task.regression else i % task.num_labels
        row["idx"] = i
        rows.append(row)
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def write_task(data_dir: Path, task, sizes: dict[str, int]) -> dict[str, list[dict]]:
    written, offset = {}, 0
    for split, size in sizes.items():
        written[split] = synthetic_rows(task, size, offset)
        write_jsonl(data_dir / task.dataset / f"{split}.jsonl", written[split])
        offset += size
    return written


@pytest.mark.parametrize("name", sorted(GLUE_TASKS))
def test_every_task_loads_from_a_local_dir(tmp_path, name):
    task = get_task(name)
    written = write_task(tmp_path, task, {"train": 7, task.test_split: 3, **{s: 2 for s in task.extra_test_splits}})
    assert load_task_splits(name, tmp_path) == written


def test_mnli_matched_and_mismatched_share_a_folder(tmp_path):
    mnli = get_task("mnli")
    write_task(tmp_path, mnli, {"train": 6, "validation_matched": 3, "validation_mismatched": 4})
    matched = load_task_splits("mnli", tmp_path)
    mismatched = load_task_splits("mnli-mm", tmp_path)
    assert set(matched) == {"train", "validation_matched", "validation_mismatched"}  # mismatched: an extra test
    assert len(matched["validation_matched"]) == 3 and len(matched["validation_mismatched"]) == 4
    assert set(mismatched) == {"train", "validation_mismatched"} and len(mismatched["validation_mismatched"]) == 4
    assert matched["train"] == mismatched["train"]


def test_a_local_mnli_without_mismatched_still_loads(tmp_path):
    write_task(tmp_path, get_task("mnli"), {"train": 6, "validation_matched": 3})
    assert set(load_task_splits("mnli", tmp_path)) == {"train", "validation_matched"}
    with pytest.raises(UserError, match="no validation_mismatched split"):
        load_task_splits("mnli-mm", tmp_path)  # there it is the test set


def test_stsb_regression_labels_load_as_floats(tmp_path):
    written = write_task(tmp_path, get_task("stsb"), {"train": 5, "validation": 2})
    rows = load_task_splits("stsb", tmp_path)
    assert [row["label"] for row in rows["train"]] == [row["label"] for row in written["train"]]
    assert any(isinstance(row["label"], float) for row in rows["train"])


def test_csv_and_parquet(tmp_path):
    task = get_task("sst2")
    rows = synthetic_rows(task, 4)
    folder = tmp_path / "sst2"
    folder.mkdir()
    with (folder / "train.csv").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    pyarrow = pytest.importorskip("pyarrow")
    import pyarrow.parquet

    pyarrow.parquet.write_table(pyarrow.Table.from_pylist(rows), folder / "validation.parquet")
    loaded = load_task_splits("sst2", tmp_path)
    assert loaded["validation"] == rows
    assert [row["sentence"] for row in loaded["train"]] == [row["sentence"] for row in rows]
    assert [task.encode_label(row["label"]) for row in loaded["train"]] == [0, 1, 0, 1]  # CSV gives "0", "1"


def test_extra_splits_on_request(glue_dir):
    rows = load_task_splits("mrpc", glue_dir, splits=["test"])
    assert list(rows) == ["test"] and len(rows["test"]) == 1725


@pytest.mark.parametrize("name, train, validation", [("rte", 2490, 277), ("sst2", 1000, 872), ("mrpc", 3668, 408)])
def test_real_glue_row_counts(glue_dir, name, train, validation):
    rows = load_task_splits(name, glue_dir)
    assert (len(rows["train"]), len(rows["validation"])) == (train, validation)
    assert len({row["idx"] for row in rows["train"]}) == train


def test_real_rte_schema(glue_dir):
    first = load_task_splits("rte", glue_dir)["train"][0]
    assert set(first) == {"sentence1", "sentence2", "label", "idx"}
    assert first["label"] in (0, 1)


def test_env_var_is_the_default_data_dir(tmp_path, monkeypatch):
    written = write_task(tmp_path, get_task("rte"), {"train": 3, "validation": 2})
    monkeypatch.setenv("AUTOPELT_DATA_DIR", str(tmp_path))
    monkeypatch.setattr(loading, "_hub_load_dataset", _must_not_be_called)
    assert load_task_splits("rte") == written


def _must_not_be_called(*args):
    raise AssertionError("the hub was used although local data was given")


def test_custom_task_from_local_files(tmp_path):
    task = custom_task("reviews", "text", label_column="stars", label_names=["bad", "good"])
    write_jsonl(tmp_path / "reviews" / "train.jsonl", [{"text": "great", "stars": "good"}] * 3)
    write_jsonl(tmp_path / "reviews" / "validation.jsonl", [{"text": "awful", "stars": "bad"}])
    rows = load_task_splits(task, tmp_path)
    assert len(rows["train"]) == 3 and rows["validation"][0]["stars"] == "bad"


# --- the hub, monkeypatched: never the network ---


@pytest.fixture
def hub_answers(monkeypatch):
    """The hub counts as reachable (the tests run with HF_HUB_OFFLINE=1); `_hub_load_dataset` is faked below."""
    from autopelt import hub

    monkeypatch.setattr(hub, "unreachable", lambda datasets=False: None)


class FakeSplit:
    def __init__(self, rows):
        self.rows = rows

    def to_list(self):
        return list(self.rows)


def test_hub_path_asks_for_nyu_mll_glue(hub_answers, monkeypatch):
    monkeypatch.delenv("AUTOPELT_DATA_DIR", raising=False)
    calls = []
    rows = synthetic_rows(get_task("mnli"), 4)

    def fake_load(path, name):
        calls.append((path, name))
        return {"train": FakeSplit(rows), "validation_mismatched": FakeSplit(rows[:1]), "test_matched": None}

    monkeypatch.setattr(loading, "_hub_load_dataset", fake_load)
    loaded = load_task_splits("mnli-mm")
    assert calls == [("nyu-mll/glue", "mnli")]
    assert loaded == {"train": rows, "validation_mismatched": rows[:1]}


def test_hub_rows_equal_local_rows_through_datasets(hub_answers, tmp_path, monkeypatch, glue_dir):
    datasets = pytest.importorskip("datasets")
    local = load_task_splits("rte", glue_dir)
    hub = datasets.DatasetDict({split: datasets.Dataset.from_list(rows[:20]) for split, rows in local.items()})
    monkeypatch.delenv("AUTOPELT_DATA_DIR", raising=False)
    monkeypatch.setattr(loading, "_hub_load_dataset", lambda path, name: hub)
    assert load_task_splits("rte") == {split: rows[:20] for split, rows in local.items()}


def test_no_data_anywhere_is_one_message_naming_both_ways(hub_answers, monkeypatch):
    def offline(path, name):
        raise ConnectionError("Couldn't reach 'nyu-mll/glue' on the Hub (OfflineModeIsEnabled)\nmore detail")

    monkeypatch.delenv("AUTOPELT_DATA_DIR", raising=False)
    monkeypatch.setattr(loading, "_hub_load_dataset", offline)
    with pytest.raises(UserError) as raised:
        load_task_splits("rte")
    message = str(raised.value)
    assert "\n" not in message
    assert "cannot load GLUE task 'rte'" in message and "hub is unreachable" in message
    assert "OfflineModeIsEnabled" in message
    assert "--data-dir DIR" in message and "DIR/rte/train.jsonl" in message and "AUTOPELT_DATA_DIR" in message


def test_real_datasets_offline_gives_the_same_message(monkeypatch):
    datasets = pytest.importorskip("datasets")
    if not datasets.config.HF_HUB_OFFLINE:
        pytest.skip("datasets is not in offline mode here; the test must not touch the network")
    monkeypatch.delenv("AUTOPELT_DATA_DIR", raising=False)
    with pytest.raises(UserError, match="hub is unreachable .*--data-dir DIR"):
        load_task_splits("wnli")


def test_custom_task_without_local_data(monkeypatch):
    monkeypatch.delenv("AUTOPELT_DATA_DIR", raising=False)
    with pytest.raises(UserError, match="has no hub dataset; pass --data-dir DIR with DIR/mine/train.jsonl"):
        load_task_splits(custom_task("mine", "text", num_labels=2))


# --- local error paths: one line each ---


def _one_line_error(*args, **kwargs) -> str:
    with pytest.raises(UserError) as raised:
        load_task_splits(*args, **kwargs)
    assert "\n" not in str(raised.value)
    return str(raised.value)


def test_missing_task_folder(tmp_path):
    assert f"no folder {tmp_path / 'rte'}" in _one_line_error("rte", tmp_path)


def test_missing_split_file(tmp_path):
    write_task(tmp_path, get_task("rte"), {"train": 3})
    assert "no validation split" in _one_line_error("rte", tmp_path)


def test_missing_column(tmp_path):
    rows = synthetic_rows(get_task("rte"), 3)
    del rows[2]["sentence2"]
    write_jsonl(tmp_path / "rte" / "train.jsonl", rows)
    write_jsonl(tmp_path / "rte" / "validation.jsonl", rows[:2])
    assert "row 3 of the train split has no column 'sentence2'" in _one_line_error("rte", tmp_path)


def test_wrong_schema_names_the_needed_columns(tmp_path):
    write_task(tmp_path, get_task("sst2"), {"train": 2, "validation": 2})
    (tmp_path / "sst2").rename(tmp_path / "rte")
    assert "needs sentence1, sentence2, label" in _one_line_error("rte", tmp_path)


def test_bad_json_line(tmp_path):
    path = tmp_path / "rte" / "train.jsonl"
    write_jsonl(path, synthetic_rows(get_task("rte"), 2))
    path.write_text(path.read_text() + "{not json\n")
    write_jsonl(tmp_path / "rte" / "validation.jsonl", synthetic_rows(get_task("rte"), 1))
    assert f"{path}:3: not valid JSON" in _one_line_error("rte", tmp_path)


def test_empty_split(tmp_path):
    write_task(tmp_path, get_task("rte"), {"train": 2})
    (tmp_path / "rte" / "validation.jsonl").write_text("\n")
    assert "validation split is empty" in _one_line_error("rte", tmp_path)

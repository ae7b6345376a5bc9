"""bench/answer_forms.py: each form's paired gain over the single answer, and the rule that decides `--copies` and
`--unlabeled`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import answer_forms  # noqa: E402
from test_ensemble_export import study_db  # noqa: F401,E402  (three finished trials that kept predictions)
from tinymodels import sst2_dir, tiny_model_dir, trial_cache  # noqa: F401,E402  (fixtures)


def row(task: str, seed: int, single: float, ensemble: float, distilled: float, copies: float | None) -> dict:
    found = {"task": task, "seed": seed, "single_test": single, "single_passes": 1, "single_seconds": 10.0,
             "ensemble_test": ensemble, "ensemble_passes": 4, "ensemble_seconds": 40.0,
             "distilled_test": distilled, "distilled_passes": 1, "distilled_seconds": 10.0}
    if copies is not None:
        found.update(distilled_copies_test=copies, distilled_copies_passes=1, distilled_copies_seconds=5.0)
    return found


def forms(table: list[dict]) -> dict[str, dict]:
    return {entry["form"]: entry for entry in table}


def test_gains_are_paired_with_the_single_answer_and_the_distilled_share_is_of_the_ensembles_gain():
    rows = [row("a", 0, 0.80, 0.82, 0.81, None), row("b", 0, 0.70, 0.74, 0.72, None)]
    table = forms(answer_forms.summarise(rows))
    assert table["ensemble"]["gain"] == pytest.approx(3.0)
    assert table["ensemble"]["worst"] == pytest.approx(2.0)
    assert table["ensemble"]["time_vs_single"] == pytest.approx(4.0)
    assert table["distilled"]["share_of_ensemble_gain"] == pytest.approx(0.5)
    assert "distilled_copies" not in table


def six(copies_gain: list[float], tasks: int = 3) -> list[dict]:
    return [row(f"t{i % tasks}", i, 0.8, 0.82, 0.80, 0.80 + gain / 100) for i, gain in enumerate(copies_gain)]


def test_copies_become_the_default_only_by_the_rule_fixed_before_they_ran():
    def decides(rows: list[dict]) -> bool:
        return answer_forms.copies_by_default(answer_forms.summarise(rows))

    assert decides(six([0.6] * 6))
    assert not decides(six([0.6] * 5))  # fewer than six studies
    assert not decides(six([0.6] * 6, tasks=2))  # fewer than three tasks
    assert not decides(six([0.4] * 6))  # under +0.5 on the mean
    assert not decides(six([2.0, 2.0, 2.0, 2.0, 2.0, -1.5]))  # one study loses more than 1.0
    table = forms(answer_forms.summarise(six([2.0, 2.0, 2.0, 2.0, 2.0, -1.5])))
    assert table["distilled_copies"]["worst_over_distilled"] == pytest.approx(-1.5)


def test_a_variant_that_can_no_longer_pass_its_rule_is_settled_and_only_that():
    assert answer_forms.settled_variants(answer_forms.summarise(six([3.0, -1.5]))) == {"distilled_copies"}
    assert not answer_forms.settled_variants(answer_forms.summarise(six([0.0, -1.0])))  # -1.0 still passes
    assert not answer_forms.settled_variants(answer_forms.summarise([row("a", 0, 0.8, 0.82, 0.80, None)]))


def test_unlabeled_texts_pay_by_the_same_rule_on_their_own_rows():
    def pays(gains: list[float], tasks: int = 3) -> bool:
        rows = [{**row(f"t{i % tasks}", i, 0.8, 0.82, 0.80, None), "distilled_unlabeled_test": 0.80 + gain / 100,
                 "distilled_unlabeled_passes": 1, "distilled_unlabeled_seconds": 10.0} for i, gain in enumerate(gains)]
        table = answer_forms.summarise(rows)
        assert not answer_forms.copies_by_default(table)  # the copies did not run: their rule cannot hold
        return answer_forms.pays_over_distilled(table, "distilled_unlabeled")

    assert pays([0.6] * 6)
    assert not pays([0.6] * 6, tasks=2)
    assert not pays([3.0] * 5 + [-1.2])


def test_unlabeled_texts_are_neither_the_searchs_train_nor_dev_nor_test_rows(tmp_path):
    import json

    from autopelt.train import TrialSettings

    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "train.jsonl").write_text("".join(json.dumps({"text": f"row {i}", "label": i % 2}) + "\n"
                                                for i in range(120)))
    (folder / "validation.jsonl").write_text("".join(json.dumps({"text": f"row {i}", "label": i % 2}) + "\n"
                                                     for i in range(100, 130)))  # 20 shared with train
    settings = TrialSettings(task="mine", spec={"methods": []}, data_dir=str(tmp_path), protocol=20, dev_size=30,
                             custom_task={"text_columns": ["text"], "num_labels": 2}, data_seed=3)
    texts = answer_forms.unlabeled_texts(settings, count=1000)
    from autopelt.data.loading import load_task_splits
    from autopelt.data.protocols import make_splits
    from autopelt.train.trial_data import resolve_task

    task = resolve_task(settings)
    loaded = load_task_splits(task, settings.data_dir)
    splits = make_splits(loaded, task, 20, seed=settings.split_seed, dev_size=30)
    used = {r["text"] for r in (*splits.train, *splits.dev, *loaded[task.test_split])}
    assert texts and all(set(t) == {"text"} for t in texts)  # no labels
    assert not {t["text"] for t in texts} & used
    assert len(texts) == len({r["text"] for r in loaded[task.train_split]} - used)
    assert answer_forms.unlabeled_texts(settings, count=5) == answer_forms.unlabeled_texts(settings, count=5)


def test_distilled_members_trains_the_other_configurations_and_keeps_the_best_dev(study_db, tmp_path):
    """One student of the adapter member (the other configuration; the second LoRA is the answer's spec) at the
    (alpha, temperature) `distilled` chose; the form is whichever of the two students has the better dev, its test
    that student's."""
    import json

    from autopelt.ensemble.select import Rule
    from autopelt.export.ensemble import export_ensemble
    from autopelt.models import load_tokenizer, resolve_model
    from autopelt.train import TrialSettings
    from autopelt.train.trial_data import prepare_data, resolve_task

    _, root = study_db
    folders = sorted(root.glob("trial-*"))
    ensemble_dir, chosen = export_ensemble(folders, tmp_path / "ensemble", answer_dir=folders[0],
                                           rule=Rule(max_size=3, bags=6, bag_fraction=0.34))
    assert len({json.dumps(m.result["settings"]["spec"]) for m in chosen.members}) == 2  # LoRA and the adapter
    settings = TrialSettings.from_dict(chosen.single.result["settings"])
    data = prepare_data(settings, load_tokenizer(resolve_model(settings.model)), resolve_task(settings))
    row = answer_forms.distilled(chosen, ensemble_dir, tmp_path / "distilled", data, "distilled", 0)
    found = answer_forms.distilled_members(chosen, tmp_path, data, row)
    assert found["distilled_members_students"] == 2
    assert found["distilled_members_dev"] >= row["distilled_dev"]
    if found["distilled_members_dev"] > row["distilled_dev"]:  # the adapter's student: exported and scored
        assert "pfeiffer" in found["distilled_members_from"]
        metrics = json.loads((tmp_path / "distilled_members" / "export" / "metrics.json").read_text())
        assert found["distilled_members_test"] == metrics["test"][chosen.metric]
    else:
        assert found["distilled_members_test"] == row["distilled_test"]
        assert found["distilled_members_from"] == chosen.single.summary

"""Knowledge distillation of a study's ensemble into one delta (train/distillation.py, ensemble/distill.py): the
loss by its definition, the teacher's targets tied to the rows they were written for, a student at alpha 0 is the
single answer's trial exactly, and `autopelt export --ensemble --distill` end to end (one line and nothing written on
bad input)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from test_ensemble_export import study_db  # noqa: F401  (three finished trials that kept predictions)
from tinymodels import sst2_dir, tiny_model_dir, trial_cache  # noqa: F401  (fixtures)

from autopelt.cli import main
from autopelt.errors import UserError
from autopelt.train import run_trial
from autopelt.train.distillation import attach_targets, cutoff, distillation_loss, save_targets

LORA = {"methods": [{"method": "lora", "rank": 4, "targets": ["query", "value"]}]}
ADAPTER = {"methods": [{"method": "pfeiffer", "bottleneck": 8}]}


def test_at_alpha_0_the_loss_is_the_cross_entropy_and_at_1_its_gradient_is_hintons():
    """d/dz of T^2 KL(p_T || softmax(z/T)) averaged over B rows is T (softmax(z/T) - p_T) / B (Hinton et al. 2.1)."""
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 3, generator=generator, requires_grad=True)
    labels = torch.tensor([0, 2, 1, 1, 0])
    teacher = torch.softmax(torch.randn(5, 3, generator=generator), -1)
    assert distillation_loss(logits, labels, teacher, 0.0, 2.0) == F.cross_entropy(logits, labels)
    distillation_loss(logits, labels, teacher, 1.0, 2.0).backward()
    sharpened = torch.softmax(teacher.log() / 2.0, -1)
    expected = 2.0 * (torch.softmax(logits.detach() / 2.0, -1) - sharpened) / 5
    torch.testing.assert_close(logits.grad, expected, rtol=1e-5, atol=1e-6)


def test_a_regressions_distillation_loss_mixes_the_two_squared_errors():
    values, labels, teacher = torch.tensor([[1.0], [2.0]]), torch.tensor([0.0, 0.0]), torch.tensor([1.0, 4.0])
    assert float(distillation_loss(values, labels, teacher, 0.25, 3.0)) == pytest.approx(0.75 * 2.5 + 0.25 * 2.0)


def test_targets_written_for_other_rows_are_refused_in_one_line(study_db, tmp_path):
    from autopelt.train.trial_data import TrialData

    from autopelt.data.features import Features

    train = Features(ids=np.arange(6, dtype=np.int32), offsets=np.array([0, 2, 4, 6]), token_type_ids=None,
                     labels=np.array([0, 1, 1]), pad_id=0, regression=False)
    data = TrialData(None, train, train, train, {})
    path = save_targets(tmp_path / "teacher.npz", np.full((3, 2), 0.5), np.array([0, 1, 1]))
    attached = attach_targets(data, {"targets": str(path), "alpha": 0.5, "temperature": 1.0})
    assert attached.train.soft_targets.shape == (3, 2) and attached.train.select([2]).soft_targets.shape == (1, 2)
    wrong = save_targets(tmp_path / "other.npz", np.full((3, 2), 0.5), np.array([1, 1, 0]))
    with pytest.raises(UserError, match="written for other train rows"):
        attach_targets(data, {"targets": str(wrong), "alpha": 0.5, "temperature": 1.0})


def _rows(lengths, labels, types=True):
    from autopelt.data.features import Features

    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    ids = np.concatenate([[101, *range(1000 + 10 * i, 1000 + 10 * i + n - 2), 102] for i, n in enumerate(lengths)])
    return Features(ids=ids.astype(np.int32), offsets=offsets,
                    token_type_ids=(ids % 2).astype(np.int8) if types else None, labels=np.asarray(labels), pad_id=0,
                    regression=False)


def test_cutoff_copies_drop_tokens_but_the_special_ones_and_keep_the_labels():
    rows = _rows([40, 3, 25], [0, 1, 2])
    copies = cutoff(rows, 2, {101, 102}, seed=3, rate=0.3)
    assert len(copies) == 6 and copies.labels.tolist() == [0, 1, 2, 0, 1, 2]
    for i in range(6):
        original, copy = rows.row(i % 3), copies.row(i)
        assert copy[0] == 101 and copy[-1] == 102 and set(copy) <= set(original)
        assert list(copy) == [t for t in original if t in set(copy)]  # the order kept: only removals
        types = copies.token_type_ids[copies.offsets[i]:copies.offsets[i + 1]]
        assert (types == copy % 2).all()  # each token's type removed with it
    assert len(copies.row(0)) < 40 and len(copies.row(1)) == 3  # a one-word row keeps its word
    assert copies.row(0).tolist() != copies.row(3).tolist()  # two copies differ
    again = cutoff(rows, 2, {101, 102}, seed=3, rate=0.3)
    assert np.array_equal(again.ids, copies.ids) and not np.array_equal(cutoff(rows, 2, {101, 102}, seed=4).ids,
                                                                        copies.ids)
    assert cutoff(_rows([4], [1], types=False), 1, {101, 102}, rate=1.0).row(0).tolist()[1:-1] == [1000]


def test_targets_with_copies_extend_the_train_rows(tmp_path):
    from autopelt.train.trial_data import TrialData

    rows = _rows([6, 5, 7], [0, 1, 1])
    data = TrialData(None, rows, rows, rows, {})
    copies = cutoff(rows, 2, {101, 102})
    soft = np.random.default_rng(0).dirichlet([1, 1], 9)
    path = save_targets(tmp_path / "teacher.npz", soft, rows.labels, copies)
    train = attach_targets(data, {"targets": str(path), "alpha": 0.5, "temperature": 1.0}).train
    assert len(train) == 9 and train.labels.tolist() == [0, 1, 1] * 3
    assert np.allclose(train.soft_targets, soft) and train.row(4).tolist() == copies.row(1).tolist()
    short = save_targets(tmp_path / "short.npz", soft[:8], rows.labels, copies)
    with pytest.raises(UserError, match="written for other train rows"):
        attach_targets(data, {"targets": str(short), "alpha": 0.5, "temperature": 1.0})


def test_a_student_at_alpha_0_is_the_single_answers_trial_exactly(study_db, tmp_path):
    """Soft targets in the batch change nothing but the loss: at alpha 0 the student is the teacher-free trial."""
    from autopelt.train import TrialSettings

    _, root = study_db
    result = json.loads((root / "trial-0" / "result.json").read_text())
    settings = TrialSettings.from_dict(result["settings"])
    from autopelt.models import load_tokenizer, resolve_model
    from autopelt.train.trial_data import prepare_data, resolve_task

    data = prepare_data(settings, load_tokenizer(resolve_model(settings.model)), resolve_task(settings))
    path = save_targets(tmp_path / "teacher.npz", np.full((len(data.train), 2), 0.5), data.train.labels)
    student = run_trial(settings.replace(out_dir=str(tmp_path / "student"),
                                         distill={"targets": str(path), "alpha": 0.0, "temperature": 2.0}))
    assert student["status"] == "ok", student["reason"]
    assert student["history"] == result["history"] and student["dev"] == result["dev"]
    copies = cutoff(data.train, 2, {0}, seed=1)
    path = save_targets(tmp_path / "copies.npz", np.full((3 * len(data.train), 2), 0.5), data.train.labels, copies)
    taught = run_trial(settings.replace(out_dir=str(tmp_path / "taught"),
                                        distill={"targets": str(path), "alpha": 0.5, "temperature": 2.0}))
    assert taught["status"] == "ok" and taught["steps"] > 2.5 * result["steps"]  # three times the rows an epoch


def test_export_distill_writes_one_delta_scored_beside_the_ensemble(study_db, tmp_path, capsys):
    url, _ = study_db
    out = tmp_path / "distilled"
    assert main(["export", "--study", "tiny", "--storage", url, "--ensemble", "--distill", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    metrics = json.loads((out / "metrics.json").read_text())
    distilled = metrics["distilled"]
    candidates = distilled["candidates"]
    assert len(candidates) == 4 and distilled["dev"] == max(c["dev"] for c in candidates)  # dev chose it
    chosen = next(c for c in candidates if (c["alpha"], c["temperature"]) == (distilled["alpha"],
                                                                               distilled["temperature"]))
    assert chosen["dev"] == distilled["dev"] and metrics["dev"]["accuracy"] == distilled["dev"]
    assert metrics["test"]["accuracy"] is not None and distilled["ensemble"]["test"] is not None
    assert distilled["single"]["test"] is not None and distilled["members"] >= 1
    assert (out / "teacher.npz").is_file() and (out / "delta.safetensors").is_file()
    assert "distilled from an ensemble of" in (out / "README.md").read_text()
    assert f"to {out}" in printed and "--unlabeled FILE" in printed  # the lever measured to keep more of its gain
    assert sorted(p.name for p in tmp_path.iterdir()) == ["distilled"]  # no teacher or students left beside it
    assert main(["predict", "--delta", str(out), "--text", "a good film"]) == 0


def test_export_distill_with_copies_teaches_the_student_on_them(study_db, tmp_path):
    url, _ = study_db
    out = tmp_path / "distilled"
    assert main(["export", "--study", "tiny", "--storage", url, "--ensemble", "--distill", "--copies", "2",
                 "--out", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["distilled"]["copies"] == 2
    with np.load(out / "teacher.npz") as stored:
        rows = len(stored["train_labels"])
        assert stored["train"].shape[0] == 3 * rows and len(stored["copies_offsets"]) == 2 * rows + 1


def test_export_distill_with_unlabeled_texts_labels_them_by_the_teacher(study_db, tmp_path, capsys):
    url, _ = study_db
    texts = tmp_path / "texts.jsonl"
    texts.write_text("\n".join(json.dumps({"sentence": s, "label": 1}) for s in  # a label there is ignored
                                ("a dull and long film", "warm, funny and wise", "nothing works", "a small gem")))
    out = tmp_path / "distilled"
    assert main(["export", "--study", "tiny", "--storage", url, "--ensemble", "--distill", "--unlabeled", str(texts),
                 "--out", str(out)]) == 0
    assert "--unlabeled FILE" not in capsys.readouterr().out  # given: no hint
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["distilled"]["unlabeled"] == 4 and "4 unlabelled texts" in (out / "README.md").read_text()
    with np.load(out / "teacher.npz") as stored:
        rows = len(stored["train_labels"])
        soft, labels = stored["train"], stored["copies_labels"]
        assert soft.shape[0] == rows + 4 and len(stored["copies_offsets"]) == 5
        assert labels.tolist() == soft[rows:].argmax(-1).tolist()  # the teacher's answer is each text's label


def test_unlabeled_texts_without_the_tasks_columns_are_one_line_and_nothing_is_written(study_db, tmp_path, capsys):
    url, _ = study_db
    out = tmp_path / "distilled"
    bad = {"columns": '{"sentence": "fine"}\n\n{"text": "no sentence column"}\n',
           "not_text": '{"sentence": 3}\n', "blank": '{"sentence": "fine"}\n{"sentence": "  "}\n',
           "list": '["a"]\n', "not_json": '{"sentence": "fine"}\nnot json\n', "empty": "\n\n"}
    said = {"columns": "--unlabeled row 2 lacks 'sentence'", "not_text": "row 1 lacks 'sentence' as a text",
            "blank": "row 2 is blank", "list": "row 1 is not a JSON object", "not_json": "line 2: not JSON",
            "empty": "--unlabeled holds no rows"}
    for name, text in bad.items():
        (tmp_path / f"{name}.jsonl").write_text(text)
        assert main(["export", "--study", "tiny", "--storage", url, "--ensemble", "--distill", "--unlabeled",
                     str(tmp_path / f"{name}.jsonl"), "--out", str(out)]) == 2
        assert said[name] in capsys.readouterr().err, name
    (tmp_path / "latin1.jsonl").write_bytes('{"sentence": "caf\u00e9"}\n'.encode("latin-1"))
    assert main(["export", "--study", "tiny", "--storage", url, "--ensemble", "--distill", "--unlabeled",
                 str(tmp_path / "latin1.jsonl"), "--out", str(out)]) == 2
    assert "not UTF-8" in capsys.readouterr().err
    assert main(["export", "--study", "tiny", "--storage", url, "--ensemble", "--unlabeled",
                 str(tmp_path / "blank.jsonl"), "--out", str(out)]) == 2
    assert "add --ensemble --distill" in capsys.readouterr().err
    assert main(["export", "--study", "tiny", "--storage", url, "--ensemble", "--distill", "--unlabeled",
                 str(tmp_path / "missing.jsonl"), "--out", str(out)]) == 2
    assert "cannot read --unlabeled" in capsys.readouterr().err
    assert not out.exists() and not any(p.name.startswith(".") for p in tmp_path.iterdir())


def test_unlabeled_texts_that_are_dev_or_test_rows_are_left_out_and_long_ones_cut_as_train_rows(study_db, tmp_path):
    from autopelt.ensemble.distill import teacher_targets
    from autopelt.export.ensemble import export_ensemble
    from autopelt.train import TrialSettings
    from autopelt.train.trial_data import prepare_data, resolve_task
    from autopelt.models import load_tokenizer, resolve_model
    from autopelt.study.record import trial_dirs
    from autopelt.study.storage import load_study

    url, _ = study_db
    ensemble_dir, chosen = export_ensemble(trial_dirs(load_study(url, "tiny", url)), tmp_path / "ensemble")
    settings = TrialSettings.from_dict(chosen.single.result["settings"]).replace(max_length=4096)  # > the model's
    tokenizer = load_tokenizer(resolve_model(settings.model))
    data = prepare_data(settings, tokenizer, resolve_task(settings))
    dev_text = tokenizer.decode(data.dev.row(0), skip_special_tokens=True)
    texts = [{"sentence": dev_text}, {"sentence": "a brand new text about films"}, {"sentence": "long " * 4000}]
    said: list[str] = []
    path = teacher_targets(ensemble_dir, settings, tmp_path / "teacher.npz", unlabeled=texts, say=said.append)
    assert said and said[0].startswith("distilling: 1 of the 3 unlabelled texts are dev or test rows")
    with np.load(path) as stored:
        offsets = stored["copies_offsets"]
        assert len(offsets) == 3 and stored["train"].shape[0] == len(data.train) + 2
        assert np.diff(offsets).max() == tokenizer.model_max_length < 4096  # cut as the train rows are
    with pytest.raises(UserError, match="every --unlabeled text is one of"):
        teacher_targets(ensemble_dir, settings, tmp_path / "again.npz", unlabeled=texts[:1])


def test_distill_without_ensemble_or_into_a_full_folder_is_one_line_and_writes_nothing(study_db, tmp_path, capsys):
    url, _ = study_db
    assert main(["export", "--study", "tiny", "--storage", url, "--distill", "--out", str(tmp_path / "a")]) == 2
    assert "add --ensemble" in capsys.readouterr().err and not (tmp_path / "a").exists()
    assert main(["export", "--study", "tiny", "--storage", url, "--ensemble", "--copies", "2", "--out",
                 str(tmp_path / "a")]) == 2
    assert "add --ensemble --distill" in capsys.readouterr().err and not (tmp_path / "a").exists()
    assert main(["export", "--study", "tiny", "--storage", url, "--ensemble", "--distill", "--copies", "-1",
                 "--out", str(tmp_path / "a")]) == 2
    assert "--copies must be" in capsys.readouterr().err and not (tmp_path / "a").exists()
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    assert main(["export", "--study", "tiny", "--storage", url, "--ensemble", "--distill", "--out", str(full)]) == 2
    assert "not empty" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"] and (full / "keep.txt").read_text() == "mine"
    shutil.rmtree(full)

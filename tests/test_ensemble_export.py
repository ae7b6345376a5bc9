"""An ensemble of a tiny study's trials: export -> predict round trip through the CLI and autopelt.load, the soup's
ΔW, and the bad-input cases (one line, exit 2, nothing written)."""

from __future__ import annotations

import json
import shutil

import optuna
import pytest
import torch
from tinymodels import sst2_dir, tiny_model_dir, trial_cache  # noqa: F401  (fixtures)

from autopelt import delta
from autopelt.cli import main
from autopelt.ensemble.study import DEFAULT_RULE
from autopelt.errors import UserError
from autopelt.train import run_trial

LORA = {"methods": [{"method": "lora", "rank": 4, "targets": ["query", "value"]}]}
ADAPTER = {"methods": [{"method": "pfeiffer", "bottleneck": 8}]}
ROWS = [{"sentence": "the movie was good"}, {"sentence": "a bad long night"}, {"sentence": "good and bad"}]


@pytest.fixture(scope="module")
def study_db(tmp_path_factory, tiny_model_dir, trial_cache, sst2_dir):
    """Three finished trials that kept their predictions (LoRA at seeds 0 and 1, an adapter) and a pruned one."""
    from tinymodels import trial_settings

    root = tmp_path_factory.mktemp("study")
    url = f"sqlite:///{root / 'study.db'}"
    study = optuna.create_study(study_name="tiny", storage=url, direction="maximize")
    for number, (spec, seed) in enumerate([(LORA, 0), (LORA, 1), (ADAPTER, 0)]):
        out = root / f"trial-{number}"
        result = run_trial(trial_settings(tiny_model_dir, sst2_dir, trial_cache, spec=spec, seed=seed, data_seed=0,
                                          out_dir=str(out), keep_predictions=True))
        assert result["status"] == "ok", result["reason"]
        study.add_trial(optuna.trial.create_trial(
            value=result["dev_metric"], user_attrs={"result_dir": str(out), "full_fidelity": True,
                                                    "params_pct": result["params"]["stored_pct"],
                                                    "summary": result["summary"]}))
    study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.PRUNED, user_attrs={"fidelity": 1}))
    return url, root


@pytest.fixture(scope="module")
def exported(study_db, tmp_path_factory):
    """An ensemble of several members: the tiny dev set (6 rows) ties every greedy step, so bags of one candidate
    each spread the weight (the CLI's default rule is tested below)."""
    from autopelt.ensemble.select import Rule
    from autopelt.export.ensemble import export_ensemble

    _, root = study_db
    out = tmp_path_factory.mktemp("export") / "ensemble"
    export_ensemble(sorted(root.glob("trial-*")), out, rule=Rule(max_size=3, bags=6, bag_fraction=0.34))
    return out


def test_cli_export_writes_the_default_rules_ensemble(study_db, tmp_path, capsys):
    url, _ = study_db
    out = tmp_path / "ens"
    assert main(["export", "--study", "tiny", "--storage", url, "--ensemble", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    manifest = json.loads((out / "ensemble.json").read_text())
    assert manifest["rule"]["max_size"] == DEFAULT_RULE.max_size and f"ensemble of {len(manifest['members'])} trials" in printed
    assert "the single answer's" in printed and f"predict --delta {out}" in printed
    assert "scoring the ensemble's" in printed and manifest["test"] is not None  # after the choice, in the manifest
    assert f"test accuracy {manifest['test']:.4f}" in printed and manifest["single"]["test"] is not None
    card = (out / "README.md").read_text()
    assert f"- test accuracy: ensemble {manifest['test']:.4f}, single answer {manifest['single']['test']:.4f}" in card


def _members_average(folder, model_dir, rows):
    """The manifest's weighted average of each member loaded alone (the reference)."""
    from transformers import AutoTokenizer

    manifest = json.loads((folder / "ensemble.json").read_text())
    batch = AutoTokenizer.from_pretrained(str(model_dir))([r["sentence"] for r in rows], padding=True,
                                                          return_tensors="pt")
    total = 0
    for member in manifest["members"]:
        from autopelt.models import load_model

        model = delta.load_delta(load_model(str(model_dir), 2, None), folder / member["folder"]).eval()
        with torch.no_grad():
            total = total + member["weight"] * model(**batch).logits.softmax(-1)
    return total, batch


def test_export_writes_members_weights_manifest_and_card(exported, study_db, capsys):
    manifest = json.loads((exported / "ensemble.json").read_text())
    weights = [m["weight"] for m in manifest["members"]]
    assert sum(weights) == pytest.approx(1.0) and all(w > 0 for w in weights)
    assert manifest["inference"]["forward_passes"] == len(manifest["members"])
    assert len(weights) >= 2, manifest  # the round trips below must average more than one member
    assert manifest["num_labels"] == 2 and manifest["single"]["dev"] <= manifest["dev"] + 1e-9
    for member in manifest["members"]:
        assert (exported / member["folder"] / "delta.safetensors").is_file()
        is_lora = "lora" in json.loads((exported / member["folder"] / "delta.json").read_text())["spec"]["methods"][0]["method"]
        assert (member["peft"] == "peft/") == is_lora == (exported / member["folder"] / "peft").is_dir()
    card = (exported / "README.md").read_text()
    assert f"{len(weights)} forward passes an input" in card and "peft folders hold members, not the ensemble" in card


def test_predict_through_the_cli_is_the_members_weighted_average(exported, tiny_model_dir, tmp_path, capsys):
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    capsys.readouterr()
    assert main(["predict", "--delta", str(exported), "--model", str(tiny_model_dir),
                 "--input", str(tmp_path / "in.jsonl")]) == 0
    captured = capsys.readouterr()
    printed = [json.loads(line) for line in captured.out.splitlines()]
    expected, _ = _members_average(exported, tiny_model_dir, ROWS)
    got = torch.tensor([p["probabilities"] for p in printed])
    torch.testing.assert_close(got, expected, atol=2e-6, rtol=1e-5)
    assert [p["label"] for p in printed] == expected.argmax(-1).tolist()
    assert "forward passes an input, one backbone load" in captured.err


def test_autopelt_load_gives_the_same_ensemble(exported, tiny_model_dir):
    import autopelt

    model = autopelt.load(str(tiny_model_dir), exported)
    expected, batch = _members_average(exported, tiny_model_dir, ROWS)
    torch.testing.assert_close(model(**batch).logits.softmax(-1), expected, atol=2e-6, rtol=1e-5)
    assert model.forward_passes == len(json.loads((exported / "ensemble.json").read_text())["members"])
    with pytest.raises(UserError, match="is an ensemble"):
        autopelt.load(str(tiny_model_dir), exported, merge=True)


@pytest.mark.parametrize("damage", ["missing", "corrupt", "labels", "model"])
def test_a_damaged_ensemble_is_one_line_and_exit_2(exported, tiny_model_dir, tmp_path, capsys, damage):
    folder = tmp_path / "ensemble"
    shutil.copytree(exported, folder)
    member = folder / json.loads((folder / "ensemble.json").read_text())["members"][-1]["folder"]
    if damage == "missing":
        shutil.rmtree(member)
    elif damage == "corrupt":
        (member / "delta.safetensors").write_bytes(b"not a safetensors file")
    else:
        header = json.loads((member / "delta.json").read_text())
        header.update({"num_labels": 3} if damage == "labels" else {"model_type": "roberta"})
        (member / "delta.json").write_text(json.dumps(header))
    capsys.readouterr()
    assert main(["predict", "--delta", str(folder), "--model", str(tiny_model_dir), "--text", "good"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1 and "autopelt: error:" in captured.err


def test_export_refuses_a_member_without_weights_and_writes_nothing(study_db, tmp_path, capsys):
    url, root = study_db
    moved = root / "trial-0" / "delta.moved"
    (root / "trial-0" / "delta").rename(moved)
    try:
        out = tmp_path / "ens"
        assert main(["export", "--study", "tiny", "--storage", url, "--ensemble", "--out", str(out)]) == 2
        assert not out.exists() and not list(tmp_path.glob(".ens*"))
        assert capsys.readouterr().err.count("\n") == 1
    finally:
        moved.rename(root / "trial-0" / "delta")


@pytest.mark.parametrize("rslora", [False, True])  # the stacked rank's scale: alpha/r', or alpha/sqrt(r')
def test_the_soup_is_the_weighted_average_delta_w(tiny_model_dir, tmp_path, rslora):
    from autopelt.delta.io import save_delta
    from autopelt.delta.modules.lora import LoRALinear
    from autopelt.ensemble.soup import soup_folders
    from autopelt.models import load_model

    spec = {"methods": [{"method": "lora", "rank": 2, "targets": ["query", "value"], "rslora": rslora},
                        {"method": "bitfit"}]}
    folders, updates = [], []
    for seed in range(3):
        model = delta.apply_delta(load_model(str(tiny_model_dir), 2, None), spec, seed=seed)
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, LoRALinear):
                    module.lora_B.weight.normal_(generator=torch.Generator().manual_seed(seed + 10))
        folders.append(save_delta(model, spec, tmp_path / f"m{seed}", metadata={"base_model": str(tiny_model_dir)}))
        updates.append({n: m.delta_weight() for n, m in model.named_modules() if isinstance(m, LoRALinear)})
    weights = [0.5, 0.25, 0.25]
    soup = delta.load_delta(load_model(str(tiny_model_dir), 2, None), soup_folders(folders, weights, tmp_path / "s"))
    lora = {n: m for n, m in soup.named_modules() if isinstance(m, LoRALinear)}
    assert lora and all(m.lora_A.weight.shape[0] == 6 for m in lora.values())  # rank 3 × 2: exact, not truncated
    for name, module in lora.items():
        expected = sum(w * u[name] for w, u in zip(weights, updates))
        torch.testing.assert_close(module.delta_weight(), expected, atol=1e-6, rtol=1e-5)


def test_no_soup_of_different_structures(tmp_path):
    from autopelt.ensemble.soup import why_not_soup

    assert "differ in structure" in why_not_soup([LORA, ADAPTER])
    assert "only LoRA" in why_not_soup([ADAPTER, ADAPTER])
    assert why_not_soup([LORA, LORA]) is None


def test_the_searchs_ensemble_is_chosen_once_and_the_summary_prints_that_one(study_db):
    """run_search chooses the study's ensemble (of_study) and carries it in SearchOutcome.ensemble; the summary is a
    printer of it, and `export --ensemble` selects the same members from the same folders."""
    from types import SimpleNamespace

    from autopelt.ensemble.study import of_study, study_ensemble
    from autopelt.search.summary import ensemble_lines
    from autopelt.study.record import trial_dirs

    url, root = study_db
    study = optuna.load_study(study_name="tiny", storage=url)
    assert [d.name for d in trial_dirs(study)] == ["trial-0", "trial-1", "trial-2"]  # the pruned one has no folder
    chosen = of_study(study)
    again = study_ensemble(trial_dirs(study))
    assert [m.folder for m in chosen.members] == [m.folder for m in again.members] and chosen.weights == again.weights
    plan = SimpleNamespace(study_name="tiny")
    assert len(chosen.members) == 1 and ensemble_lines(chosen, plan) == []  # one member: the single answer
    assert ensemble_lines(None, plan) == []  # no trial kept predictions (a generation study)
    from autopelt.ensemble.select import Rule

    several = study_ensemble(trial_dirs(study), rule=Rule(max_size=3, bags=6, bag_fraction=0.34))
    assert len(several.members) > 1 and ensemble_lines(several, plan)[: len(several.lines())] == several.lines()


def test_the_ensembles_test_metric_is_its_members_test_predictions_averaged(study_db, tmp_path):
    """with_test: the members' test predictions (from predictions.npz, or one forward pass from the saved delta,
    which gives what the trial itself predicted) averaged with the selection's weights and scored like dev."""
    import numpy as np

    from autopelt.ensemble.select import Rule, accuracy, combine
    from autopelt.ensemble.study import study_ensemble, with_test
    from autopelt.train.predictions import load, save

    _, root = study_db
    folders = _copies(root, tmp_path)  # one loses its test predictions, to be computed again
    kept = load(folders[0])
    assert "test" in kept  # the fixture's trials scored test as they trained
    save(folders[0], {name: array for name, array in kept.items() if not name.startswith("test")})
    chosen = study_ensemble(folders, rule=Rule(max_size=3, bags=6, bag_fraction=0.34))
    said = []
    scored = with_test(chosen, said.append)
    assert said == [f"scoring the ensemble's {len(chosen.members)} members on the test split …"]
    again = load(folders[0])
    np.testing.assert_allclose(again["test"].astype(np.float32), kept["test"].astype(np.float32), atol=2e-3)
    assert np.array_equal(again["test_labels"], kept["test_labels"]) and "dev" in again  # dev kept beside it
    tests = [load(m.folder)["test"] for m in chosen.members]
    assert scored.test == pytest.approx(accuracy(combine(tests, chosen.weights), kept["test_labels"]))
    assert scored.single_test == pytest.approx(accuracy(load(chosen.single.folder)["test"], kept["test_labels"]))
    assert f"test accuracy {scored.test:.4f} vs the single answer's {scored.single_test:.4f}" in scored.lines()[0]
    assert scored.to_dict()["test"] == scored.test and chosen.test is None  # computed after, never before


def _copies(root, tmp_path):
    """Copies of the study's trial folders (their result.json pointing at the copied delta)."""
    folders = []
    for source in sorted(root.glob("trial-*")):
        folder = tmp_path / source.name
        shutil.copytree(source, folder)
        result = json.loads((folder / "result.json").read_text())
        result["delta_dir"] = str(folder / "delta")
        (folder / "result.json").write_text(json.dumps(result))
        folders.append(folder)
    return folders


def test_members_test_predictions_are_scored_on_one_backbone_load(study_db, tmp_path, monkeypatch):
    """Three members (two LoRA seeds, an adapter) without kept test predictions: one base model read, and each
    member's predictions those of the member scored alone (its own load) and those it made as it trained."""
    import numpy as np

    import autopelt.train.saved as saved
    from autopelt.train.predictions import load, save

    _, root = study_db
    shared, alone = _copies(root, tmp_path / "shared"), _copies(root, tmp_path / "alone")
    trained = [load(folder) for folder in shared]
    for folder in shared + alone:
        save(folder, {name: array for name, array in load(folder).items() if not name.startswith("test")})
    loads = []
    real_load = saved.load_model
    monkeypatch.setattr(saved, "load_model", lambda *args, **kwargs: loads.append(args) or real_load(*args, **kwargs))
    together = saved.test_predictions_of(shared)
    assert len(loads) == 1
    separately = [saved.test_predictions(folder) for folder in alone]
    assert len(loads) == 1 + len(alone)
    for one, other, kept in zip(together, separately, trained):
        np.testing.assert_allclose(one["test"].astype(np.float32), other["test"].astype(np.float32), atol=1e-3)
        np.testing.assert_allclose(one["test"].astype(np.float32), kept["test"].astype(np.float32), atol=2e-3)
        assert np.array_equal(one["test_labels"], kept["test_labels"])
    assert saved.test_predictions_of(shared)[0]["test"].tobytes() == together[0]["test"].tobytes()
    assert len(loads) == 1 + len(alone)  # kept in predictions.npz: read, not computed again

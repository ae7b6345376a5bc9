"""export -> peft / predict round trips on a tiny model, and the commands' one-line errors."""

from __future__ import annotations

import json

import optuna
import pytest
import torch
from tinymodels import make_settings, sst2_dir, tiny_model_dir, trial_cache  # noqa: F401  (fixtures)

from autopelt import delta
from autopelt.cli import main
from autopelt.export.predict import load_delta_model, predict
from autopelt.train import run_trial

LORA_BITFIT = {"methods": [{"method": "lora", "rank": 4, "targets": ["query", "value", "output"]},  # peft: lora_only
                           {"method": "bitfit", "targets": ["query", "value", "output"], "pooler": False}]}


@pytest.fixture(scope="module")
def study_db(tmp_path_factory, tiny_model_dir, trial_cache, sst2_dir):
    """A study whose trials point at real trial outputs: a LoRA+BitFit answer, an adapter answer, a pruned trial."""
    from tinymodels import trial_settings

    root = tmp_path_factory.mktemp("study")
    url = f"sqlite:///{root / 'study.db'}"
    study = optuna.create_study(study_name="tiny", storage=url, direction="maximize")
    for number, spec in enumerate([LORA_BITFIT, {"methods": [{"method": "pfeiffer", "bottleneck": 8}]}]):
        out = root / f"trial-{number}"
        result = run_trial(trial_settings(tiny_model_dir, sst2_dir, trial_cache, spec=spec, out_dir=str(out)))
        assert result["status"] == "ok", result["reason"]
        study.add_trial(optuna.trial.create_trial(
            value=result["dev_metric"] - 0.01 * number,  # trial 0 is the best
            user_attrs={"result_dir": str(out), "full_fidelity": True, "params_pct": result["params"]["stored_pct"],
                        "summary": result["summary"]}))
    study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.PRUNED, user_attrs={"fidelity": 1}))
    return url


def test_export_loads_in_peft_with_the_same_logits(study_db, tmp_path, tiny_model_dir):
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    out = tmp_path / "best"
    assert main(["export", "--study", "tiny", "--storage", study_db, "--out", str(out)]) == 0
    assert {p.name for p in out.iterdir()} >= {"delta.json", "delta.safetensors", "training.json", "metrics.json",
                                                "README.md", "peft"}
    assert json.loads((out / "metrics.json").read_text())["trial"] == 0
    assert json.loads((out / "metrics.json").read_text())["peft"] == "peft/"
    ours, _ = load_delta_model(out, str(tiny_model_dir))
    base = AutoModelForSequenceClassification.from_pretrained(str(tiny_model_dir), num_labels=2)
    theirs = PeftModel.from_pretrained(base, str(out / "peft")).eval()
    batch = AutoTokenizer.from_pretrained(str(tiny_model_dir))(
        ["a good story", "it was bad and long"], padding=True, return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(theirs(**batch).logits, ours(**batch).logits, rtol=1e-4, atol=1e-5)


def test_export_then_predict_gives_the_trained_models_predictions(study_db, tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "adapter"
    assert main(["export", "--study", "tiny", "--storage", study_db, "--trial", "1", "--out", str(out)]) == 0
    assert not (out / "peft").exists()  # an adapter has no peft form, and the export says so
    reason = json.loads((out / "metrics.json").read_text())["peft"]
    assert "no bottleneck adapters" in reason and "\n" not in reason
    assert f"No peft folder: {reason}." in (out / "README.md").read_text()
    trained = delta.load_delta(_tiny_base(tiny_model_dir), json.loads((out / "training.json").read_text())["out_dir"]
                               + "/delta").eval()
    rows = [{"sentence": "the movie was good"}, {"sentence": "a bad long night"}]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    capsys.readouterr()
    assert main(["predict", "--delta", str(out), "--model", str(tiny_model_dir), "--input", str(tmp_path / "in.jsonl")]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    from transformers import AutoTokenizer

    batch = AutoTokenizer.from_pretrained(str(tiny_model_dir))([r["sentence"] for r in rows], padding=True,
                                                                return_tensors="pt")
    with torch.no_grad():
        expected = trained(**batch).logits.softmax(-1)
    assert [p["label"] for p in printed] == expected.argmax(-1).tolist()
    torch.testing.assert_close(torch.tensor([p["probabilities"] for p in printed]), expected, atol=1e-5, rtol=0)
    model, header = load_delta_model(out, str(tiny_model_dir))
    again = predict(model, AutoTokenizer.from_pretrained(str(tiny_model_dir)), header, rows)
    assert [p["label"] for p in again] == [p["label"] for p in printed]


def _tiny_base(folder):
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(0)
    return AutoModelForSequenceClassification.from_pretrained(str(folder), num_labels=2)


def test_pareto_export_writes_one_folder_per_front_trial(study_db, tmp_path):
    assert main(["export", "--study", "tiny", "--storage", study_db, "--pareto", "--out", str(tmp_path / "p")]) == 0
    assert sorted(p.name for p in (tmp_path / "p").iterdir())[0] == "trial-0"


@pytest.mark.parametrize("argv, words", [
    (["export", "--study", "nope", "--out", "{tmp}/x"], "no study 'nope'"),
    (["export", "--study", "tiny", "--trial", "2", "--out", "{tmp}/x"], "trial 2 (pruned) has no saved delta"),
    (["export", "--study", "tiny", "--trial", "9", "--out", "{tmp}/x"], "has no trial 9"),
    (["predict", "--delta", "{tmp}", "--text", "hi"], "not an autopelt delta folder"),
])
def test_bad_inputs_are_one_line_errors_with_exit_code_2(argv, words, study_db, tmp_path, capsys):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    if argv[0] == "export":
        argv += ["--storage", study_db]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("autopelt: error:") and words in err and "\n" not in err
    assert not (tmp_path / "x").exists()  # nothing half-written


def test_reseed_reruns_the_config_and_records_mean_and_std(study_db, tmp_path):
    out = tmp_path / "reseeded"
    assert main(["export", "--study", "tiny", "--storage", study_db, "--out", str(out), "--reseed", "2"]) == 0
    reseed = json.loads((out / "metrics.json").read_text())["reseed"]
    assert reseed["seeds"] == 2 and [run["seed"] for run in reseed["runs"]] == [0, 1]
    values = [run["test"]["accuracy"] for run in reseed["runs"]]
    summary = reseed["summary"]["test_accuracy"]
    assert summary["mean"] == pytest.approx(sum(values) / 2)
    assert summary["std"] == pytest.approx(abs(values[0] - values[1]) / 2 ** 0.5)
    assert "± " in (out / "README.md").read_text()
    assert not (out / "seeds").exists()  # the re-runs' weights are not kept, only their numbers


def test_exporting_a_trial_trained_without_test_scores_it_from_its_delta(tmp_path, tiny_model_dir, trial_cache,
                                                                           sst2_dir):
    """A search trial trains without test scores; its export scores them from the saved delta, as they would have
    been scored after training, and keeps them in the trial's result.json; the reseeded runs score their own."""
    from support.studies import study_of
    from tinymodels import trial_settings

    def trained(name: str, score_test: bool) -> dict:
        settings = trial_settings(tiny_model_dir, sst2_dir, trial_cache, out_dir=str(tmp_path / name),
                                  score_test=score_test)
        result = run_trial(settings)
        assert result["status"] == "ok", result["reason"]
        return result

    scored, unscored = trained("scored", True), trained("unscored", False)
    assert unscored["test"] is None
    url = f"sqlite:///{tmp_path / 'study.db'}"
    study_of(url, "unscored", unscored, tmp_path / "unscored")
    out = tmp_path / "export"
    assert main(["export", "--study", "unscored", "--storage", url, "--out", str(out), "--reseed", "1"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["test"] == pytest.approx(scored["test"]) and metrics["reseed"]["runs"][0]["test"]
    assert json.loads((tmp_path / "unscored" / "result.json").read_text())["test"] == metrics["test"]

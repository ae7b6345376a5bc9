"""A model is read as it was trained to be read: mean pooling for a sentence-transformers checkpoint (its
modules.json and Pooling config say so), the first token otherwise; `autopelt train` and the study's baselines
take that unless told otherwise."""

from __future__ import annotations

import json
import shutil

import pytest
from tinymodels import sst2_dir, tiny_model_dir  # noqa: F401  (fixtures)

from autopelt import cli, delta
from autopelt.delta.presets import PRESETS
from autopelt.models import default_model, own_pooling

MODULES = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
           {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
MODES = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens")


def sentence_transformer(folder, mode: str = "mean_tokens", *, also: str | None = None):
    """`folder` made a sentence-transformers checkpoint whose Pooling module uses `mode` (and `also`)."""
    (folder / "1_Pooling").mkdir(parents=True, exist_ok=True)
    (folder / "modules.json").write_text(json.dumps(MODULES))
    config = {"word_embedding_dimension": 32, **{f"pooling_mode_{m}": m in (mode, also) for m in MODES}}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(config))
    return folder


def test_a_sentence_transformers_checkpoint_pooled_by_its_mean_is_read_by_the_mean(tmp_path):
    assert own_pooling(str(sentence_transformer(tmp_path / "st"))) == "mean"
    assert own_pooling(default_model()) == "mean"  # all-MiniLM-L6-v2, as the package ships it


@pytest.mark.parametrize("mode, also", [("cls_token", None), ("max_tokens", None), ("mean_tokens", "cls_token")])
def test_any_other_pooling_is_read_through_the_first_token(tmp_path, mode, also):
    assert own_pooling(str(sentence_transformer(tmp_path, mode, also=also))) == "cls"


def test_a_plain_or_unreadable_model_folder_or_an_uncached_hub_id_is_read_through_the_first_token(tmp_path):
    assert own_pooling(str(tmp_path)) == "cls"  # no modules.json
    (tmp_path / "modules.json").write_text("not json")
    assert own_pooling(str(tmp_path)) == "cls"
    (tmp_path / "modules.json").write_text(json.dumps(MODULES))  # its Pooling folder missing
    assert own_pooling(str(tmp_path)) == "cls"
    for config in ("[]", "null", '"mean"'):  # a Pooling config that is not an object
        (tmp_path / "1_Pooling").mkdir(exist_ok=True)
        (tmp_path / "1_Pooling" / "config.json").write_text(config)
        assert own_pooling(str(tmp_path)) == "cls"


def test_an_uncached_hub_id_is_read_through_the_first_token_while_the_hub_is_out_of_reach(monkeypatch):
    from autopelt import hub

    monkeypatch.setattr(hub, "unreachable", lambda datasets=False: "HF_HUB_OFFLINE is set")
    assert own_pooling("no-such-org/no-such-model") == "cls"


@pytest.fixture
def st_model_dir(tiny_model_dir, tmp_path):
    return sentence_transformer(shutil.copytree(tiny_model_dir, tmp_path / "tiny-st"))


def train(model, data, out, capsys, *flags):
    argv = ["train", "--task", "sst2", "--model", str(model), "--data-dir", str(data), "--epochs", "1",
            "--batch-size", "16", "--lr", "0.01", "--max-length", "32", "--threads", "1", "--out", str(out), *flags]
    code = cli.main(argv)
    out_text, _ = capsys.readouterr()
    assert code == 0, out_text
    return json.loads((out / "result.json").read_text())["spec"], out_text


def test_train_reads_a_sentence_transformer_by_its_mean_unless_told(st_model_dir, tiny_model_dir, sst2_dir, tmp_path,
                                                                     capsys):
    spec, out = train(st_model_dir, sst2_dir, tmp_path / "a", capsys, "--preset", "lora")
    assert spec == delta.parse_spec({**PRESETS["lora"], "pooling": "mean"}).to_dict()
    assert "sst2 · lora r8, mean pooling · seed 0" in out.splitlines()
    saved = json.loads((tmp_path / "a" / "delta" / "delta.json").read_text())["spec"]
    assert saved["pooling"] == "mean"
    spec, _ = train(st_model_dir, sst2_dir, tmp_path / "b", capsys, "--preset", "lora", "--pooling", "cls")
    assert "pooling" not in spec
    spec, _ = train(tiny_model_dir, sst2_dir, tmp_path / "c", capsys, "--preset", "lora")  # a plain BERT folder
    assert "pooling" not in spec


def test_train_reads_a_method_as_the_model_was_trained_and_a_spec_file_as_written(st_model_dir, sst2_dir, tmp_path,
                                                                                  capsys):
    spec, _ = train(st_model_dir, sst2_dir, tmp_path / "m", capsys, "--method", "bitfit")
    assert spec["pooling"] == "mean"
    stored = tmp_path / "stored.json"  # a cls delta's stored spec leaves its pooling out: it trains the same again
    stored.write_text(json.dumps(spec | {"pooling": "cls"}))
    stored.write_text(json.dumps(delta.parse_spec(stored).to_dict()))
    assert "pooling" not in json.loads(stored.read_text())
    spec, _ = train(st_model_dir, sst2_dir, tmp_path / "a", capsys, "--delta", str(stored))
    assert "pooling" not in spec
    mean = tmp_path / "mean.json"
    mean.write_text(json.dumps({**PRESETS["bitfit"], "pooling": "mean"}))
    spec, _ = train(st_model_dir, sst2_dir, tmp_path / "b", capsys, "--delta", str(mean))
    assert spec["pooling"] == "mean"


def test_the_api_reads_a_presets_name_as_train_does_and_a_spec_as_written(st_model_dir, sst2_dir):
    from autopelt import api
    from autopelt.models import load_model

    common = {"model": str(st_model_dir), "data_dir": str(sst2_dir), "epochs": 1, "batch_size": 16,
              "learning_rate": 0.01, "max_length": 32, "threads": 1, "progress": False}
    assert api.train_delta("sst2", "lora", **common)["spec"]["pooling"] == "mean"
    assert "pooling" not in api.train_delta("sst2", {"methods": [{"method": "bitfit"}]}, **common)["spec"]
    assert "pooling" not in api.train_delta("sst2", delta.parse_spec(PRESETS["bitfit"]), **common)["spec"]
    assert api.apply(load_model(str(st_model_dir), 2), "lora").autopelt_delta["spec"]["pooling"] == "mean"
    assert "pooling" not in api.apply(load_model(str(st_model_dir), 2), PRESETS["lora"]).autopelt_delta["spec"]


def test_a_studys_baselines_read_a_plain_bert_through_the_first_token(tiny_model_dir, tmp_path):
    from optuna.trial import TrialState
    from test_search_controller import fakes, make

    study, control = make(tmp_path, baselines=True, budget=12, finalists=0, model=str(tiny_model_dir))
    fakes.run_serially(control)
    baselines = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("baseline")]
    assert len(baselines) == 6 and all(t.state == TrialState.COMPLETE for t in baselines)
    assert all("pooling" not in t.user_attrs["spec"] for t in baselines)


def test_the_baselines_read_as_the_spaces_deltas_where_they_never_read_the_mean(tmp_path):
    from autopelt.search.space import load_space
    from test_search_controller import prepare, search_options

    default = (load_space("default").path).read_text()
    assert "  pooling: {choice: [cls, mean]}" in default
    pinned = tmp_path / "cls.yaml"
    pinned.write_text(default.replace("  pooling: {choice: [cls, mean]}", "  pooling: cls"))
    assert load_space(str(pinned)).poolings() == ("cls",)
    assert prepare(search_options(tmp_path, space=str(pinned), baselines=True)).pooling == "cls"
    assert prepare(search_options(tmp_path, space="default", baselines=True)).pooling == "mean"
    assert prepare(search_options(tmp_path, baselines=True)).pooling == "cls"  # no head: its deltas read cls
    assert load_space("lora").poolings() is None
    assert prepare(search_options(tmp_path, space="lora", baselines=True)).pooling == "cls"


def test_a_study_made_before_its_baselines_pooling_was_recorded_keeps_them_on_the_first_token(tmp_path):
    from test_search_controller import Controller, fakes, open_study, prepare, search_options

    fakes.script(tmp_path / "out")
    plan = prepare(search_options(tmp_path, baselines=True, budget=12, finalists=0, space="default"))
    assert plan.pooling == "mean"
    study = open_study(plan)
    assert study.user_attrs["baseline_pooling"] == "mean"
    study.set_user_attr("baseline_pooling", None)  # as an older study holds nothing there
    control = Controller(study, plan)
    control.start()
    fakes.run_serially(control)
    baselines = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("baseline")]
    assert len(baselines) == 6 and all("pooling" not in t.user_attrs["spec"] for t in baselines)
    drawn = [t for t in baselines if t.user_attrs.get("baseline_drawn")]  # queued with the space's cls parameter
    assert drawn and all(t.params.get("pooling") == "cls" for t in drawn)


def test_a_hub_ids_pooling_is_fetched_while_the_hub_is_in_reach_and_never_when_it_is_not(tmp_path, monkeypatch):
    import huggingface_hub

    from autopelt import hub

    sentence_transformer(tmp_path)
    fetched = []

    def download(repo_id, filename, **kwargs):
        fetched.append((repo_id, filename))
        return str(tmp_path / filename)

    monkeypatch.setattr(huggingface_hub, "try_to_load_from_cache", lambda repo_id, filename, **kwargs: None)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", download)
    monkeypatch.setattr(hub, "unreachable", lambda datasets=False: None)
    assert own_pooling("some-org/a-sentence-model") == "mean"
    assert fetched == [("some-org/a-sentence-model", "modules.json"),
                       ("some-org/a-sentence-model", "1_Pooling/config.json")]
    monkeypatch.setattr(hub, "unreachable", lambda datasets=False: "HF_HUB_OFFLINE is set")
    fetched.clear()
    assert own_pooling("some-org/a-sentence-model") == "cls" and fetched == []

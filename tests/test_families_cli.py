"""Every declared family through the command line, as a user brings it: a tiny random checkpoint of the family
with a real tokenizer beside it, trained by `autopelt train` with LoRA (and, in the slow suite, with every method the
family takes, and refused one line for the ones it does not), and searched by a 3-trial `autopelt search`."""

from __future__ import annotations

import json

import pytest
from familymodels import DECODERS, ENCODERS, save_family_folder
from tinymodels import sst2_dir  # noqa: F401  (fixture)

from autopelt import cli
from autopelt.delta.families import ARCHITECTURES
from autopelt.delta.inject import why_not
from autopelt.delta.presets import PRESETS
from autopelt.delta.registry import innermost
from autopelt.delta.spec import parse_spec

FAMILIES = ENCODERS + DECODERS + ("bart",)
METHODS = ("lora", "dora", "vera", "ia3", "houlsby", "adapter", "compacter++", "prefix", "prompt", "bitfit", "adamix",
           "unipelt_apl")


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory, minilm_path):
    """family -> a saved tiny checkpoint of it (made on first use)."""
    made = {}

    def folder(family: str):
        if family not in made:
            made[family] = save_family_folder(family, tmp_path_factory.mktemp(family), minilm_path)
        return made[family]

    return folder


def train(folder, data_dir, out, *flags) -> int:
    return cli.main(["train", "--model", str(folder), "--data-dir", str(data_dir), "--task", "sst2", "--k", "16",
                     "--epochs", "1", "--batch-size", "8", "--lr", "0.01", "--max-length", "24", "--threads", "1",
                     "--out", str(out), *flags])


def refusal(family: str, preset: str) -> str | None:
    arch = ARCHITECTURES[family]
    return next((r for r in (why_not(innermost(m), arch) for m in parse_spec(PRESETS[preset]).methods) if r), None)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_trains_with_lora_through_the_command_line(family, family_dirs, sst2_dir, tmp_path, capsys):  # noqa: F811
    assert train(family_dirs(family), sst2_dir, tmp_path, "--method", "lora", "--rank", "4") == 0, capsys.readouterr()
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["status"] == "ok" and result["params"]["trainable"] > 0
    assert (tmp_path / "delta" / "delta.safetensors").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_every_method_a_family_takes_trains_and_the_others_are_refused_in_one_line(family, family_dirs, sst2_dir,  # noqa: F811
                                                                                  tmp_path, capsys):
    for preset in METHODS:
        out = tmp_path / preset
        code = train(family_dirs(family), sst2_dir, out, "--preset", preset)
        printed = capsys.readouterr()
        reason = refusal(family, preset)
        if reason is None:
            assert code == 0, (preset, printed.out[-2000:], printed.err[-2000:])
            assert json.loads((out / "result.json").read_text())["status"] == "ok"
        else:
            assert code == 2, preset
            lines = [line for line in printed.err.splitlines() if reason in line]
            assert len(lines) == 1 and not (out / "result.json").exists(), (preset, printed.err)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_a_three_trial_search_runs_on_every_family(family, family_dirs, sst2_dir, tmp_path, monkeypatch, capsys):  # noqa: F811
    """The default space, its portfolio and baseline as the family takes them: what it cannot take is said."""
    monkeypatch.chdir(tmp_path)
    code = cli.main(["search", "--model", str(family_dirs(family)), "--data-dir", str(sst2_dir), "--task", "sst2",
                     "--k", "24", "--epochs", "1", "--budget", "3", "--study-name", f"fam-{family}"])
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    assert "study fam-" in out and "best: #" in out and "3 complete" in out
    assert ("baseline unipelt_apl left out" in out) == (refusal(family, "unipelt_apl") is not None)

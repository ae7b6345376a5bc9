"""Deltas saved by older autopelts load and give the logits they gave then: format 1 (before the reference forms),
and format 2 before LoRA had rslora and dora, and prefix shift_positions (their defaults are the old forms)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import tiny_batch, tiny_model

from autopelt import delta
from autopelt.errors import UserError

DATA = Path(__file__).resolve().parent / "data"  # written by data/make_v1_deltas.py with commit 891b8c1
SAVED = ["delta_v1_unipelt_bitfit", "delta_v1_adamix_pfeiffer"]
SAVED_V2 = ["delta_v2_unipelt_bitfit", "delta_v2_lora_houlsby_prompt"]  # data/make_v2_deltas.py, commit b759325


def saved_logits(name: str) -> torch.Tensor:
    return torch.tensor(json.loads((DATA / name / "logits.json").read_text()))


@pytest.mark.parametrize("name", SAVED + SAVED_V2)
def test_an_old_delta_gives_the_logits_it_was_saved_with(name):
    model = delta.load_delta(tiny_model("bert"), DATA / name).eval()
    with torch.no_grad():
        torch.testing.assert_close(model(**tiny_batch()).logits, saved_logits(name), rtol=1e-5, atol=1e-5)


def test_format_1_reads_as_the_old_forms():
    header = delta.read_delta_header(DATA / "delta_v1_unipelt_bitfit")
    adapter, prefix, lora, bitfit = delta.parse_spec(header["spec"]).methods
    assert (adapter.placement, prefix.split_gate, bitfit.pooler) == ("ffn", True, False)
    (adamix,) = delta.parse_spec(delta.read_delta_header(DATA / "delta_v1_adamix_pfeiffer")["trained_spec"]).methods
    assert (adamix.expert_init, adamix.delta.placement, adamix.delta.activation) == ("independent", "ffn", "relu")


@pytest.mark.parametrize("name", SAVED)
def test_the_same_files_read_as_format_2_do_not_load(name, tmp_path):
    """What the format marker protects: in today's forms the saved tensors belong to other modules (Pfeiffer's
    adapter wraps the LayerNorm, one prefix gate, a pooler bias), and loading says so."""
    shutil.copytree(DATA / name, tmp_path / name)
    path = tmp_path / name / "delta.json"
    path.write_text(path.read_text().replace("autopelt-delta/1", "autopelt-delta/2"))
    with pytest.raises(UserError, match="does not match its spec"):
        delta.load_delta(tiny_model("bert"), tmp_path / name)


@pytest.mark.parametrize("entry, upgraded", [
    ({"method": "pfeiffer", "bottleneck": 8}, {"method": "adapter", "placement": "ffn", "bottleneck": 8}),
    ({"method": "compacter++"}, {"method": "adapter", "placement": "ffn", "projection": "compacter"}),
    ({"method": "adapter"}, {"method": "adapter", "placement": "houlsby", "activation": "relu"}),
    ({"method": "prefix", "gate": True}, {"method": "prefix", "gate": True, "split_gate": True}),
    ({"method": "bitfit", "targets": ["query"]}, {"method": "bitfit", "targets": ["query"], "pooler": False}),
    ({"method": "adamix"}, {"method": "adamix", "expert_init": "independent", "delta": {
        "method": "adapter", "placement": "houlsby", "bottleneck": 16, "activation": "relu"}}),
    ({"method": "lora", "rank": 4}, {"method": "lora", "rank": 4}),
])
def test_format_1_entries_in_todays_fields(entry, upgraded):
    from autopelt.delta.legacy import upgrade_v1

    got = upgrade_v1({"methods": [entry]})["methods"][0]
    assert {k: got[k] for k in upgraded} == upgraded
    assert delta.parse_spec({"methods": [got]})  # and today's parser takes it

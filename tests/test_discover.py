"""A model type declared nowhere is read by its structure: the sites it finds on every declared family are the
declared ones (so a wrong guess cannot train silently: declaring the family later keeps the sites), the methods on
linear sites train on it with the behaviour the declared families show, and the others are refused in one line."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import tiny_batch
from familymodels import DECODERS, ENCODERS, family_config
from tinymodels import sst2_dir  # noqa: F401  (fixture)

from autopelt import cli, delta
from autopelt.delta.discover import _config_json, _discover
from autopelt.delta.families import declared
from autopelt.delta.families import architecture_of
from autopelt.errors import UserError

READ_BY_STRUCTURE = [f for f in ENCODERS + DECODERS if f != "albert"]  # ALBERT's one shared layer needs declaring


def read(config):
    return _discover(_config_json(config), type(config))


@pytest.mark.parametrize("family", READ_BY_STRUCTURE)
def test_every_declared_family_read_by_structure_gives_its_declared_sites_and_head(family):
    config = family_config(family)
    found, known = read(config), declared(config)
    stack = known.stacks[0]
    assert found.backbone == known.backbone and found.stacks[0].layers == stack.layers
    assert found.stacks[0].linears == {site: stack.linears[site] for site in found.stacks[0].linears}
    assert set(found.stacks[0].linears) == set(stack.linears)  # every declared site is found, none is guessed
    assert found.head_parts == known.head_parts and found.causal == known.causal
    assert found.shapes(config) == known.shapes(config)
    assert found.head_params(config, 3) == known.head_params(config, 3)


def _opt_config(num_labels: int = 2):
    from transformers import OPTConfig

    return OPTConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, ffn_dim=64, num_attention_heads=4,
                     word_embed_proj_dim=32, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
                     eos_token_id=2, dropout=0.0, attention_dropout=0.0, num_labels=num_labels)


def _neox_config(num_labels: int = 2):
    from transformers import GPTNeoXConfig

    return GPTNeoXConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64, max_position_embeddings=64, pad_token_id=0, bos_token_id=1,
                         eos_token_id=2, hidden_dropout=0.0, attention_dropout=0.0, num_labels=num_labels)


def _camembert_config(num_labels: int = 2):
    from transformers import CamembertConfig

    return CamembertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
                           attention_probs_dropout_prob=0.0, pad_token_id=1, num_labels=num_labels)


UNDECLARED = {"opt": _opt_config, "gpt_neox": _neox_config, "camembert": _camembert_config}
LINEAR_ONLY = {
    "lora": {"methods": [{"method": "lora", "rank": 4}]},
    "dora_every_site": {"methods": [{"method": "lora", "rank": 2, "dora": True, "targets": [
        "query", "key", "value", "attention_output", "intermediate", "output"]}]},
    "ia3": {"methods": [{"method": "ia3"}]},
    "vera": {"methods": [{"method": "vera", "rank": 8}]},
    "bitfit": {"methods": [{"method": "bitfit", "targets": ["query", "output"]}]},
    "lora_gated+ia3": {"methods": [{"method": "lora", "rank": 4, "gate": True}, {"method": "ia3"}]},
}


def undeclared_model(model_type: str, seed: int = 0):
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(seed)
    return AutoModelForSequenceClassification.from_config(UNDECLARED[model_type]()).eval()


def test_the_undeclared_types_used_here_are_still_undeclared():
    from autopelt.delta.families import ARCHITECTURES

    assert not set(UNDECLARED) & set(ARCHITECTURES)  # else these tests would test a declaration


@pytest.mark.parametrize("model_type", UNDECLARED)
@pytest.mark.parametrize("name", LINEAR_ONLY)
def test_methods_on_linear_sites_train_an_undeclared_model_and_count_and_reload_exactly(model_type, name, tmp_path):
    spec = LINEAR_ONLY[name]
    model = delta.apply_delta(undeclared_model(model_type), spec)
    count = delta.count_parameters(spec, model.config)
    assert count.trainable == sum(p.numel() for p in model.parameters() if p.requires_grad)
    batch = tiny_batch(seq_len=9)
    with torch.no_grad():
        torch.testing.assert_close(model(**batch).logits, undeclared_model(model_type)(**batch).logits, rtol=0,
                                   atol=1e-6)  # every one of these starts as the identity
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimiser = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    model.train()
    model(**batch, labels=torch.tensor([0, 1, 1])).loss.backward()
    optimiser.step()
    model.eval()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    head = tuple(part + "." for part in architecture_of(model.config).head_parts)
    assert any(not n.startswith(head) for n in changed) and all(
        model.get_parameter(n).requires_grad for n in changed)
    delta.save_delta(model, spec, tmp_path)
    fresh = delta.load_delta(undeclared_model(model_type), tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(fresh(**batch).logits, model(**batch).logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model_type", UNDECLARED)
@pytest.mark.parametrize("method", [{"method": "houlsby"}, {"method": "prefix"}, {"method": "prompt"}])
def test_methods_that_need_a_declared_sublayer_are_refused_in_one_line(model_type, method):
    with pytest.raises(UserError, match=f"cannot apply to {model_type}: it needs to know where a sublayer") as error:
        delta.count_parameters({"methods": [method]}, UNDECLARED[model_type]())
    assert "\n" not in str(error.value) and "autopelt/delta/families.py" in str(error.value)


def test_what_was_found_is_said_in_one_line_once(capsys):
    from autopelt.delta import discover

    discover._SAID.discard("opt")
    architecture_of(_opt_config())
    architecture_of(_opt_config(num_labels=5))
    lines = [line for line in capsys.readouterr().err.splitlines() if "declared nowhere" in line]
    assert lines == ["autopelt: model type 'opt' is declared nowhere; read by structure: 2 layers at "
                     "model.decoder.layers, sites key=self_attn.k_proj, value=self_attn.v_proj, query=self_attn.q_proj, "
                     "attention_output=self_attn.out_proj, intermediate=fc1, output=fc2, head score; LoRA, (IA)3, "
                     "VeRA, BitFit can run, adapters, prefix and prompt need it declared"]


def test_an_undeclared_encoder_decoder_is_refused_in_one_line():
    from transformers import PegasusConfig

    config = PegasusConfig(vocab_size=100, d_model=32, encoder_layers=1, decoder_layers=1)
    with pytest.raises(UserError, match="'pegasus' is an encoder-decoder autopelt does not know"):
        architecture_of(config)


def test_an_undeclared_model_trains_through_the_command_line_with_lora_and_is_refused_prefix(
        tmp_path, sst2_dir, minilm_path, capsys):  # noqa: F811
    from transformers import AutoTokenizer, CamembertModel

    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    config = _camembert_config()
    config.vocab_size, config.pad_token_id = len(tokenizer), tokenizer.pad_token_id
    torch.manual_seed(0)
    folder = tmp_path / "camembert"
    CamembertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    common = ["train", "--model", str(folder), "--data-dir", str(sst2_dir), "--task", "sst2", "--epochs", "1",
              "--batch-size", "16", "--lr", "0.01", "--max-length", "32", "--threads", "1"]
    assert cli.main([*common, "--method", "lora", "--rank", "4", "--out", str(tmp_path / "lora")]) == 0
    result = json.loads((tmp_path / "lora" / "result.json").read_text())
    assert result["status"] == "ok" and result["params"]["trainable"] > 0
    capsys.readouterr()
    assert cli.main([*common, "--method", "prefix", "--out", str(tmp_path / "prefix")]) == 2
    err = capsys.readouterr().err
    assert "prefix cannot apply to camembert: it needs to know where a sublayer" in err
    assert not (tmp_path / "prefix" / "result.json").exists()

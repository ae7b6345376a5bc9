"""Parity with peft 0.21 on tiny Llama, GPT-2 and T5 language models: the same weights in both give the same logits,
and an exported peft folder loads with PeftModel.from_pretrained to the same logits."""

from __future__ import annotations

import pytest
import torch
from conftest import moved
from decodermodels import DECODER_FAMILIES, decoder_batch, is_t5, tiny_decoder
from test_delta_peft import _ours

from autopelt import delta
from autopelt.delta.inject import MERGEABLE
from autopelt.delta.peft_export import export_peft, peft_reason

peft = pytest.importorskip("peft")

ENTRIES = {
    "lora": {"method": "lora", "rank": 4, "alpha": 16},
    "rslora": {"method": "lora", "rank": 4, "alpha": 16, "rslora": True, "targets": ["key", "output"]},
    "dora": {"method": "lora", "rank": 4, "alpha": 8, "dora": True, "targets": ["query", "value", "intermediate"]},
    "ia3": {"method": "ia3"},  # keys, values and the FFN's inner activation
    "vera": {"method": "vera", "rank": 16, "d_initial": 0.5, "projection_seed": 7,
             "targets": ["query", "intermediate", "output"]},
    "prefix": {"method": "prefix", "length": 3, "reparam_hidden": 0, "shift_positions": True},
    "prompt": {"method": "prompt", "length": 4},
}
PAIRS = [(name, family) for family in DECODER_FAMILIES for name in ENTRIES]  # T5's prefix: in peft's form


def trained(entry, family):
    return moved(delta.apply_delta(tiny_decoder(family, lm=True), {"methods": [entry]}))


def wrapped_sites(model) -> list[str]:
    """Our adapted linears by name: the same modules are given to peft."""
    return [name for name, m in model.named_modules() if isinstance(m, MERGEABLE)]


def peft_config(name, ours, family):
    entry, sites = ENTRIES[name], wrapped_sites(ours)
    task = peft.TaskType.SEQ_2_SEQ_LM if is_t5(family) else peft.TaskType.CAUSAL_LM
    if name in ("lora", "rslora", "dora"):
        return peft.LoraConfig(r=4, lora_alpha=entry["alpha"], use_rslora=name == "rslora", use_dora=name == "dora",
                               target_modules=sites, task_type=task)
    if name == "ia3":
        ffn = {"llama": "mlp.down_proj", "gpt2": "mlp.c_proj", "t5": "DenseReluDense.wo",
               "t5-gated": "DenseReluDense.wo"}[family]
        return peft.IA3Config(target_modules=sites, feedforward_modules=[s for s in sites if s.endswith(ffn)],
                              task_type=task)
    if name == "vera":
        return peft.VeraConfig(r=16, d_initial=0.5, projection_prng_key=7, target_modules=sites, task_type=task)
    if name == "prefix":
        return peft.PrefixTuningConfig(num_virtual_tokens=3, task_type=task)
    return peft.PromptTuningConfig(num_virtual_tokens=4, task_type=task, num_transformer_submodules=1)


def copy_into(reference, ours) -> int:
    """Our tensors into peft's model by name; the number copied."""
    state = {n.replace(".base_layer.", "."): p for n, p in ours.named_parameters()}
    copied = 0
    with torch.no_grad():
        for name, p in reference.named_parameters():
            if name == "prompt_encoder.default.embedding.weight":
                prefix = next((v for n, v in state.items() if n.endswith("prefix_encoder.prefix")), None)
                if prefix is not None:  # (layers, 2, L, W) -> (L, layers·2·W): per token, each layer's k then v
                    p.copy_(prefix.permute(2, 0, 1, 3).reshape(p.shape))
                else:
                    p.copy_(next(v for n, v in state.items() if n.endswith("soft_prompt.embedding")))
                copied += 1
            elif p.requires_grad:
                p.copy_(state[_ours(name)].reshape(p.shape))
                copied += 1
    return copied


def real_logits(model, batch):
    """Logits at the real tokens (a prompt's own positions dropped): what both models must agree on."""
    out = model(**batch).logits
    if "decoder_input_ids" in batch:
        return out
    out = out[:, -batch["input_ids"].shape[1]:]
    return out[batch["attention_mask"].bool()]


@pytest.mark.parametrize("name, family", PAIRS)
def test_our_forward_equals_peft_given_the_same_weights(name, family):
    ours = trained(ENTRIES[name], family)
    reference = peft.get_peft_model(tiny_decoder(family, lm=True), peft_config(name, ours, family)).eval()
    copied = copy_into(reference, ours)
    assert copied == sum(1 for p in ours.parameters() if p.requires_grad) > 0
    batch = decoder_batch(family)
    torch.testing.assert_close(real_logits(reference, batch), real_logits(ours, batch), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name, family", PAIRS)
def test_export_loads_in_peft_with_the_same_logits(name, family, tmp_path):
    from peft import PeftModel

    model = trained(ENTRIES[name], family)
    batch = decoder_batch(family)
    expected = real_logits(model, batch)
    export_peft(model, {"methods": [ENTRIES[name]]}, tmp_path)
    loaded = PeftModel.from_pretrained(tiny_decoder(family, lm=True), str(tmp_path)).eval()
    torch.testing.assert_close(real_logits(loaded, batch), expected, rtol=1e-5, atol=1e-5)


def test_a_decoder_prompt_has_a_peft_form_and_an_encoder_prompt_does_not():
    spec = {"methods": [ENTRIES["prompt"]]}
    assert peft_reason(spec, "llama") is None and peft_reason(spec, "gpt2") is None and peft_reason(spec, "t5") is None
    assert "before the first token" in peft_reason(spec, "bert")


def test_only_a_t5_prefix_in_peft_form_has_one_because_peft_reaches_only_the_decoders_self_attention():
    spec = {"methods": [{"method": "prefix", "length": 3}]}
    assert "reaches only the decoder's self-attention" in peft_reason(spec, "t5")
    assert "reaches only the decoder's self-attention" in peft_reason(spec, "mt5")
    assert peft_reason({"methods": [ENTRIES["prefix"]]}, "t5") is None


def test_a_t5_prefix_in_peft_form_reads_the_rows_peft_reads_on_a_deeper_decoder():
    """peft 0.21 gives decoder layer i its row 2i mod N (the odd rows fed the cross-attention half it drops): on four
    layers, rows 0, 2, 0, 2. Same logits given the same rows, and the odd rows train nothing in either."""
    from transformers import AutoModelForSeq2SeqLM

    from decodermodels import tiny_decoder_config

    config = tiny_decoder_config("t5")
    config.num_layers = config.num_decoder_layers = 4

    def fresh():
        torch.manual_seed(0)
        return AutoModelForSeq2SeqLM.from_config(config).eval()

    ours = moved(delta.apply_delta(fresh(), {"methods": [ENTRIES["prefix"]]}))
    reference = peft.get_peft_model(fresh(), peft.PrefixTuningConfig(
        num_virtual_tokens=3, task_type=peft.TaskType.SEQ_2_SEQ_LM)).eval()
    assert copy_into(reference, ours) == 1
    batch = decoder_batch("t5")
    torch.testing.assert_close(real_logits(reference, batch), real_logits(ours, batch), rtol=1e-5, atol=1e-5)
    ours.train()
    ours(**batch, labels=batch["decoder_input_ids"]).loss.backward()
    grad = ours.prefix_encoder.prefix.grad  # (rows, 2, L, H)
    assert grad[[0, 2]].abs().sum() > 0 and grad[[1, 3]].abs().sum() == 0


def test_a_t5_prefix_in_peft_form_exports_where_d_model_is_not_heads_times_d_kv_and_depths_differ(tmp_path):
    """As Flan-T5-small (d_model 512, 6 heads x 64) and a decoder deeper than the encoder: the folder says the
    decoder's depth and the keys' width, and loads to the same logits."""
    from peft import PeftModel
    from transformers import AutoModelForSeq2SeqLM, T5Config

    config = T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=3, num_heads=3,
                      dropout_rate=0.0, pad_token_id=0, eos_token_id=2, decoder_start_token_id=0,
                      feed_forward_proj="gated-gelu")

    def fresh():
        torch.manual_seed(0)
        return AutoModelForSeq2SeqLM.from_config(config).eval()

    ours = moved(delta.apply_delta(fresh(), {"methods": [ENTRIES["prefix"]]}))
    batch = decoder_batch("t5")
    expected = real_logits(ours, batch)
    export_peft(ours, {"methods": [ENTRIES["prefix"]]}, tmp_path)
    loaded = PeftModel.from_pretrained(fresh(), str(tmp_path)).eval()
    torch.testing.assert_close(real_logits(loaded, batch), expected, rtol=1e-5, atol=1e-5)

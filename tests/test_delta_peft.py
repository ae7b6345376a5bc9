"""Parity with peft: our LoRA, rsLoRA, DoRA, (IA)³, VeRA and prefix equal peft's given the same weights, and
exports load in peft to the same logits; a delta peft cannot hold is refused with its reason."""

from __future__ import annotations

import pytest
import torch
from conftest import moved, tiny_batch, tiny_model

from autopelt import delta
from autopelt.delta.peft_export import export_peft, peft_expressible, peft_reason
from autopelt.errors import UserError

peft = pytest.importorskip("peft")

EXPORTABLE = {
    "lora": {"methods": [{"method": "lora", "rank": 4, "alpha": 8}]},
    "lora_sites_layers": {"methods": [{"method": "lora", "rank": 2, "layers": [1],
                                       "targets": ["key", "attention_output", "intermediate", "output"]}]},
    "lora+bitfit": {"methods": [{"method": "lora", "rank": 4}, {"method": "bitfit"}]},  # bias="all"
    "lora+bitfit_lora_only": {"methods": [{"method": "lora", "rank": 4, "targets": ["value", "output"]},
                                          {"method": "bitfit", "targets": ["value", "output"], "pooler": False}]},
    "adamix_lora": {"methods": [{"method": "adamix", "experts": 3, "delta": {"method": "lora", "rank": 4}}]},
    "rslora": {"methods": [{"method": "lora", "rank": 4, "alpha": 8, "rslora": True}]},
    "dora_sites_layers": {"methods": [{"method": "lora", "rank": 2, "dora": True, "rslora": True, "layers": [0],
                                       "targets": ["query", "intermediate", "output"]}]},
    "dora+bitfit": {"methods": [{"method": "lora", "rank": 4, "dora": True}, {"method": "bitfit"}]},
    "ia3": {"methods": [{"method": "ia3"}]},
    "ia3_outputs_only_some_layers": {"methods": [{"method": "ia3", "layers": [1],
                                                  "targets": ["query", "attention_output", "intermediate"]}]},
    "vera_every_shape": {"methods": [{"method": "vera", "rank": 16, "projection_seed": 2,
                                      "targets": ["query", "intermediate", "output"]}]},
    "vera+bitfit": {"methods": [{"method": "vera", "rank": 16}, {"method": "bitfit"}]},  # bias="all"
    "vera+bitfit_vera_only": {"methods": [{"method": "vera", "rank": 16, "layers": [1]},
                                          {"method": "bitfit", "targets": ["query", "value"], "layers": [1],
                                           "pooler": False}]},
    "prefix": {"methods": [{"method": "prefix", "length": 3, "reparam_hidden": 8, "shift_positions": True}]},
}
PROMPT_LEARNING = ("prefix",)  # peft has no merge_and_unload for these


def trained(spec, family):
    return moved(delta.apply_delta(tiny_model(family), spec))


@pytest.mark.parametrize("family", ["bert", "roberta"])
@pytest.mark.parametrize("name", EXPORTABLE)
def test_export_loads_in_peft_with_the_same_logits(name, family, tmp_path):
    from peft import PeftModel

    model = trained(EXPORTABLE[name], family)
    batch = tiny_batch()
    expected = model(**batch).logits
    export_peft(model, EXPORTABLE[name], tmp_path)
    loaded = PeftModel.from_pretrained(tiny_model(family), str(tmp_path)).eval()
    torch.testing.assert_close(loaded(**batch).logits, expected, rtol=1e-5, atol=1e-5)
    if name not in PROMPT_LEARNING and not (name.startswith(("ia3", "vera")) and family == "roberta"):
        # (peft 0.21's IA3 and VeRA merge_and_unload fail on RoBERTa's head: "RobertaClassificationHead object has no
        # attribute 'weight'")
        merged = loaded.merge_and_unload()
        torch.testing.assert_close(merged(**batch).logits, expected, rtol=1e-4, atol=1e-5)


def test_a_vera_export_holds_the_seed_not_the_matrices(tmp_path):
    import json

    from safetensors.torch import load_file

    spec = EXPORTABLE["vera_every_shape"]
    export_peft(trained(spec, "bert"), spec, tmp_path)
    config = json.loads((tmp_path / "adapter_config.json").read_text())
    assert (config["projection_prng_key"], config["save_projection"], config["r"]) == (2, False, 16)
    saved = load_file(str(tmp_path / "adapter_model.safetensors"))
    assert not any("vera_A" in k or "vera_B" in k for k in saved)
    assert sum(v.numel() for k, v in saved.items() if "vera_lambda" in k) == 2 * 3 * 16 + 2 * (32 + 64 + 32)


@pytest.mark.parametrize("family", ["bert", "roberta"])
@pytest.mark.parametrize("name", [n for n in EXPORTABLE if n not in PROMPT_LEARNING])
def test_the_exported_config_trains_only_what_the_delta_trained(name, family, tmp_path):
    from peft import PeftModel

    model = trained(EXPORTABLE[name], family)
    export_peft(model, EXPORTABLE[name], tmp_path)
    loaded = PeftModel.from_pretrained(tiny_model(family), str(tmp_path), is_trainable=True)
    ours = {n.replace(".base_layer.", ".") for n, p in model.named_parameters() if p.requires_grad}
    assert {_ours(n) for n, p in loaded.named_parameters() if p.requires_grad} == ours


@pytest.mark.parametrize("name", EXPORTABLE)
def test_peft_stores_as_many_numbers_as_the_analytic_count(name, tmp_path):
    """The folder holds the delta's inference form and the head (a prefix as its matrices, no MLP), nothing else."""
    from safetensors.torch import load_file

    spec = EXPORTABLE[name]
    export_peft(trained(spec, "bert"), spec, tmp_path)
    saved = load_file(str(tmp_path / "adapter_model.safetensors"))
    # with bias="all" peft saves the head's bias three times (classifier., .modules_to_save., .original_module.)
    distinct = {k.replace(".modules_to_save.", ".").replace(".original_module.", "."): v for k, v in saved.items()}
    assert sum(v.numel() for v in distinct.values()) == delta.count_parameters(spec, tiny_model("bert").config).stored


# The same weights in both: peft built from its own config (written here, not by the exporter), our tensors
# copied in by name.
PARITY = {
    "lora": ({"method": "lora", "rank": 4, "alpha": 16, "targets": ["query", "value"]},
             lambda: peft.LoraConfig(r=4, lora_alpha=16, target_modules=["query", "value"])),
    "rslora": ({"method": "lora", "rank": 4, "alpha": 16, "rslora": True, "targets": ["key", "output"]},
               lambda: peft.LoraConfig(r=4, lora_alpha=16, use_rslora=True, target_modules=["key", "output.dense"],
                                       exclude_modules=r".*attention\.output\.dense")),
    "dora": ({"method": "lora", "rank": 4, "alpha": 8, "dora": True, "targets": ["query", "value", "intermediate"]},
             lambda: peft.LoraConfig(r=4, lora_alpha=8, use_dora=True,
                                     target_modules=["query", "value", "intermediate.dense"])),
    "ia3": ({"method": "ia3"},  # keys, values and the FFN's inner activation, as the paper
            lambda: peft.IA3Config(target_modules=r".*\.(key|value|[0-9]+\.output\.dense)",
                                   feedforward_modules=r".*\.[0-9]+\.output\.dense")),
    "vera": ({"method": "vera", "rank": 16, "d_initial": 0.5, "projection_seed": 7,
              "targets": ["query", "intermediate", "output"]},
             lambda: peft.VeraConfig(r=16, d_initial=0.5, projection_prng_key=7,
                                     target_modules=r".*\.(query|intermediate\.dense|[0-9]+\.output\.dense)")),
    "prefix": ({"method": "prefix", "length": 3, "reparam_hidden": 0, "shift_positions": True},
               lambda: peft.PrefixTuningConfig(num_virtual_tokens=3, task_type=peft.TaskType.SEQ_CLS)),
}
OUR_NAMES = {"lora_magnitude_vector": "magnitude", "ia3_l": "scale", "vera_lambda_b": "lambda_b",
             "vera_lambda_d": "lambda_d"}


def _ours(peft_name: str) -> str:
    """Our name of one of peft's tensors: its adapter name and wrappers dropped, its vector names ours."""
    name = peft_name.removeprefix("base_model.").removeprefix("model.").replace(".base_layer.", ".")
    name = name.replace(".modules_to_save.default.", ".").replace(".original_module.", ".")
    name = name.replace("lora_magnitude_vector.default.weight", "lora_magnitude_vector")
    name = name.replace(".default.", ".").removesuffix(".default")
    parent, _, leaf = name.rpartition(".")
    return f"{parent}.{OUR_NAMES.get(leaf, leaf)}"


def copy_into(reference, ours) -> int:
    """Our trained tensors into peft's model; the number of delta tensors copied."""
    theirs = dict(reference.named_parameters())
    state = {n.replace(".base_layer.", "."): p for n, p in ours.named_parameters()}
    prefix = next((p for n, p in ours.named_parameters() if n.endswith("prefix_encoder.prefix")), None)
    copied = 0
    with torch.no_grad():
        for name, p in theirs.items():
            if name == "prompt_encoder.default.embedding.weight":  # (L, layers·2·H): per token, each layer's k, v
                p.copy_(prefix.permute(2, 0, 1, 3).reshape(p.shape))
                copied += 1
            elif p.requires_grad:
                p.copy_(state[_ours(name)].reshape(p.shape))
                copied += not _ours(name).startswith("classifier")
    return copied


@pytest.mark.parametrize("family", ["bert", "roberta"])
@pytest.mark.parametrize("name", PARITY)
def test_our_forward_equals_peft_given_the_same_weights(name, family):
    entry, config = PARITY[name]
    ours = trained({"methods": [entry]}, family)
    config = config()
    config.task_type = peft.TaskType.SEQ_CLS
    reference = peft.get_peft_model(tiny_model(family), config).eval()
    copied = copy_into(reference, ours)
    delta_tensors = sum(1 for n, p in ours.named_parameters() if p.requires_grad and not n.startswith("classifier"))
    assert copied == delta_tensors > 0
    batch = tiny_batch()
    torch.testing.assert_close(reference(**batch).logits, ours(**batch).logits, rtol=1e-5, atol=1e-5)


def test_vera_draws_the_frozen_matrices_peft_draws():
    from autopelt.delta.modules.vera import SharedProjections

    entry, config = PARITY["vera"]
    ours = delta.apply_delta(tiny_model(), {"methods": [entry]})
    reference = peft.get_peft_model(tiny_model(), config())
    shared = next(m for m in ours.modules() if isinstance(m, SharedProjections))
    vera = reference.base_model
    assert torch.equal(shared.A, vera.vera_A["default"]) and torch.equal(shared.B, vera.vera_B["default"])


def test_an_unshifted_prefix_is_not_peft_prefix_tuning():
    """Why an unshifted prefix is refused: with the same matrices, peft's positions differ and so do the logits."""
    entry, config = PARITY["prefix"]
    ours = trained({"methods": [{**entry, "shift_positions": False}]}, "bert")
    reference = peft.get_peft_model(tiny_model("bert"), config()).eval()
    copy_into(reference, ours)
    batch = tiny_batch()
    assert not torch.allclose(reference(**batch).logits, ours(**batch).logits, atol=1e-3)


@pytest.mark.parametrize("spec, reason", [
    ({"methods": [{"method": "lora", "gate": True}]}, "no UniPELT gate"),
    ({"methods": [{"method": "vera", "gate": True}]}, "no UniPELT gate"),
    ({"methods": [{"method": "lora"}, {"method": "pfeiffer"}]}, "combines 2"),
    ({"methods": [{"method": "lora"}, {"method": "ia3"}]}, "combines 2"),
    ({"methods": [{"method": "pfeiffer"}]}, "no bottleneck adapters"),
    ({"methods": [{"method": "adamix"}]}, "no bottleneck adapters"),
    ({"methods": [{"method": "prompt"}]}, "before the first token"),
    ({"methods": [{"method": "prefix"}]}, "shift_positions: true"),
    ({"methods": [{"method": "prefix", "shift_positions": True, "layers": [1]}]}, "every layer"),
    ({"methods": [{"method": "prefix", "shift_positions": True, "gate": True}]}, "no UniPELT gate"),
    ({"methods": [{"method": "bitfit"}]}, "no BitFit of its own"),
    ({"methods": [{"method": "ia3"}, {"method": "bitfit"}]}, "peft's ia3 trains no biases"),
    ({"methods": [{"method": "lora"}, {"method": "bitfit", "targets": ["value"]}]}, "peft trains every bias"),
    ({"methods": [{"method": "lora"}, {"method": "bitfit", "pooler": False}]}, "peft trains every bias"),
    ({"methods": [{"method": "vera"}, {"method": "bitfit", "targets": ["query", "value"], "layers": [1],
                                       "pooler": False}]}, "those of the vera layers"),
])
def test_deltas_without_a_peft_form_are_refused_with_the_reason(spec, reason, tmp_path):
    assert not peft_expressible(spec)
    assert reason in peft_reason(spec)
    model = delta.apply_delta(tiny_model(), spec)
    with pytest.raises(UserError, match="no peft form") as error:
        export_peft(model, spec, tmp_path)
    assert "\n" not in str(error.value) and reason in str(error.value)
    assert not any(tmp_path.iterdir())

"""A spec's `pooling`: the head reads the mean of the last layer's token states over real tokens, on BERT and
RoBERTa; the spec, the saved delta, peft export, `train --pooling` and the search space carry it."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import assert_padding_changes_nothing, tiny_batch, tiny_model

from autopelt import delta
from autopelt.errors import UserError

LORA = {"methods": [{"method": "lora", "rank": 4}]}
MEAN = {**LORA, "pooling": "mean"}


def head_input(model, family: str) -> list[torch.Tensor]:
    """What the head reads of each pass: BERT's pooled vector (before dropout), RoBERTa's first-token state."""
    seen = []
    if family == "bert":
        model.dropout.register_forward_hook(lambda module, args, out: seen.append(args[0]))
    else:
        model.classifier.dense.register_forward_hook(lambda module, args, out: seen.append(args[0]))
    return seen


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_the_head_reads_the_mean_of_the_real_tokens(family):
    model = delta.apply_delta(tiny_model(family), MEAN).eval()
    seen = head_input(model, family)
    batch = tiny_batch(batch_size=3, seq_len=9, padded=True)
    states = model.base_model(**batch).last_hidden_state
    model(**batch)
    mask = batch["attention_mask"].unsqueeze(-1).float()
    torch.testing.assert_close(seen[-1], (states * mask).sum(1) / mask.sum(1))
    assert not torch.allclose(seen[-1][-1], states[-1].mean(0))  # the padded row's padding is left out


@pytest.mark.parametrize("spec", [MEAN, {"methods": [{"method": "prompt", "length": 4},
                                                     {"method": "adapter", "bottleneck": 8, "gate": True}],
                                         "pooling": "mean"}])
@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_padding_does_not_change_a_mean_pooled_result(family, spec):
    model = delta.apply_delta(tiny_model(family), spec)
    for param in model.parameters():  # deltas that start at zero must not hide a wrong mask
        if param.requires_grad:
            torch.nn.init.normal_(param, std=0.1)
    model.eval()
    assert_padding_changes_nothing(model)


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_mean_pooling_changes_what_the_head_reads_and_adds_no_parameter(family):
    batch = tiny_batch()
    cls, mean = delta.apply_delta(tiny_model(family), LORA), delta.apply_delta(tiny_model(family), MEAN)
    trainable = lambda m: {n: p.shape for n, p in m.named_parameters() if p.requires_grad}  # noqa: E731
    assert trainable(cls) == trainable(mean)
    assert delta.count_parameters(MEAN, mean.config, 2) == delta.count_parameters(LORA, cls.config, 2)
    assert not torch.allclose(cls.eval()(**batch).logits, mean.eval()(**batch).logits)


def test_bitfit_does_not_train_or_store_the_pooler_that_mean_pooling_skips(tmp_path):
    """BitFit trains BERT's pooler bias by default; under mean pooling the pooler is skipped, so its bias would
    take no gradient and be stored unchanged: it is left frozen, out of the delta and out of the count."""
    plain = {"methods": [{"method": "bitfit"}]}
    spec = {**plain, "pooling": "mean"}
    cls, mean = delta.apply_delta(tiny_model("bert"), plain), delta.apply_delta(tiny_model("bert"), spec)
    trained = lambda m: {n for n, p in m.named_parameters() if p.requires_grad}  # noqa: E731
    assert trained(cls) - trained(mean) == {"bert.pooler.dense.bias"}
    stored = delta.save_delta(mean, spec, tmp_path)
    assert "bert.pooler.dense.bias" not in delta.delta_state(delta.load_delta(tiny_model("bert"), stored))
    counted = delta.count_parameters(spec, mean.config)
    assert counted.stored == sum(p.numel() for n, p in mean.named_parameters() if n in trained(mean))
    assert counted.stored == delta.count_parameters(plain, cls.config).stored - cls.config.hidden_size


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_a_saved_mean_pooled_delta_loads_with_its_pooling(family, tmp_path):
    model = delta.apply_delta(tiny_model(family), MEAN)
    torch.nn.init.normal_(model.classifier.out_proj.weight if family == "roberta" else model.classifier.weight)
    batch = tiny_batch()
    expected = model.eval()(**batch).logits
    delta.save_delta(model, MEAN, tmp_path)
    assert json.loads((tmp_path / "delta.json").read_text())["spec"]["pooling"] == "mean"
    fresh = delta.load_delta(tiny_model(family), tmp_path)
    torch.testing.assert_close(fresh.eval()(**batch).logits, expected, rtol=1e-5, atol=1e-5)


def test_the_spec_leaves_the_default_pooling_out_and_names_the_mean():
    assert delta.parse_spec(LORA).pooling == "cls" and "pooling" not in delta.parse_spec(LORA).to_dict()
    assert delta.parse_spec({**LORA, "pooling": "cls"}).to_dict() == delta.parse_spec(LORA).to_dict()
    spec = delta.parse_spec(json.dumps(MEAN))
    assert spec.to_dict() == {**delta.parse_spec(LORA).to_dict(), "pooling": "mean"}
    assert spec.summary() == "lora r4, mean pooling"
    with pytest.raises(UserError, match="pooling must be one of cls, mean, not 'max'"):
        delta.parse_spec({**LORA, "pooling": "max"})
    with pytest.raises(UserError, match="no other top-level field"):
        delta.parse_spec({**LORA, "head": "mean"})


def test_peft_export_refuses_mean_pooling_in_one_line():
    from autopelt.delta.peft_export import peft_reason

    assert peft_reason(LORA) is None
    reason = peft_reason(MEAN)
    assert reason.startswith("this delta (lora r4, mean pooling) has no peft form: a peft folder holds no pooling")
    assert "\n" not in reason


def test_the_default_space_draws_the_pooling_and_replays_a_baseline_with_the_models_own():
    import optuna

    from autopelt.delta.presets import PRESETS
    from autopelt.search.space import load_space

    space = load_space("default")
    assert space.params_for(PRESETS["lora"], 6)["pooling"] == "cls"
    assert space.params_for({**PRESETS["lora"], "pooling": "mean"}, 6)["pooling"] == "mean"
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    drawn = {space.sample(study.ask(), 6)[0].get("pooling", "cls") for _ in range(20)}
    assert drawn == {"cls", "mean"}
    assert load_space("lora").params_for({**PRESETS["lora"], "pooling": "mean"}, 6) is None  # it draws no pooling


def test_a_space_file_checks_its_head_section(tmp_path):
    from autopelt.search.space import load_space

    text = "methods: {lora: {rank: 8}}\ntrain: {learning_rate: 1e-3}\n"
    plain = tmp_path / "plain.yaml"
    plain.write_text(text)
    with_head = tmp_path / "head.yaml"
    with_head.write_text(text + "head: {pooling: {choice: [cls, mean]}}\n")
    assert "pooling" in load_space(with_head).param_names and "pooling" not in load_space(plain).param_names
    assert load_space(with_head).fingerprint != load_space(plain).fingerprint
    bad = tmp_path / "bad.yaml"
    bad.write_text(text + "head: {pooling: max}\n")
    with pytest.raises(UserError, match=r"head\.pooling: 'max' is invalid"):
        load_space(bad)

"""The generation loss without vocabulary-sized fp32 tensors: the LM head runs at the target positions alone (where
the family's logits are its head on the last states), the cross-entropy in blocks of LOSS_ROWS rows, recomputed
in the backward pass; the loss and its gradients equal those of the model's whole logits. And a tokenizer without
an end-of-sequence token is refused before any trial, in one line."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from decodermodels import is_t5, tiny_decoder
from generationdata import make_tiny_lm_folder, word_tokenizer, write_e2e_like

from autopelt import cli, delta
from autopelt.train import generate
from autopelt.train.generate import IGNORE, dev_loss, lm_loss

DELTAS = {"lora": {"methods": [{"method": "lora", "rank": 4}]},
          "prompt": {"methods": [{"method": "prompt", "length": 2}]},
          "prefix": {"methods": [{"method": "prefix", "length": 2, "reparam_hidden": 8}]}}


def _batch(family: str, seed: int = 0) -> dict:
    """Three rows, the last right-padded; a decoder's first 3 tokens are its prompt (no labels), T5's labels are
    the decoder's targets, padded."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 100, (3, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[2, 6:] = 0
    ids[2, 6:] = 0
    if is_t5(family):
        labels = torch.randint(3, 100, (3, 5), generator=g)
        labels[1, 3:] = IGNORE
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}
    labels = ids.clone()
    labels[:, :3] = IGNORE
    labels[mask == 0] = IGNORE
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def _whole_logits_loss(model, batch) -> torch.Tensor:
    """The loss as it was computed before: the model's own (B, T, V) logits, cast to fp32 whole."""
    labels = batch["labels"]
    if model.config.is_encoder_decoder:
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels).logits
    else:
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        logits, labels = logits[:, -labels.shape[1]:][:, :-1], labels[:, 1:]
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE)


def _model(family: str, method: str):
    from familymodels import family_model

    base = tiny_decoder(family, lm=True) if family in ("llama", "gpt2", "t5") else family_model(family, lm=True)
    model = delta.apply_delta(base, DELTAS[method], seed=0).eval()
    with torch.no_grad():  # a delta that starts at zero (LoRA's B) would leave the comparison blind to it
        for param in (p for p in model.parameters() if p.requires_grad):
            param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(1)) * 0.05)
    return model


@pytest.mark.parametrize("family, method", [(family, method) for family in ("llama", "gpt2", "t5") for method in DELTAS]
                         + [(family, "lora") for family in ("gemma", "gemma2", "gemma3_text", "phi3", "olmo2")])
def test_the_loss_and_its_gradients_equal_those_of_the_whole_logits(family, method, monkeypatch):
    """Gemma 2 and 3 soft-cap their logits: their loss reads the model's own, the others' the head's."""
    monkeypatch.setattr(generate, "LOSS_ROWS", 4)  # several blocks, the last one short
    model, batch = _model(family, method), _batch(family)
    trainable = [p for p in model.parameters() if p.requires_grad]

    expected = _whole_logits_loss(model, batch)
    expected_grads = torch.autograd.grad(expected, trainable)
    loss, targets = lm_loss(model, batch)
    grads = torch.autograd.grad(loss, trainable)

    labels = batch["labels"] if is_t5(family) else batch["labels"][:, 1:]
    assert targets == int((labels != IGNORE).sum()) > 8
    assert float(loss.detach()) == pytest.approx(float(expected.detach()), rel=1e-6, abs=1e-6)
    for grad, want in zip(grads, expected_grads):
        assert torch.allclose(grad, want, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("family", ["llama", "gpt2", "phi3"])
def test_the_head_sees_only_target_positions_and_no_block_is_wider_than_loss_rows(family, monkeypatch):
    monkeypatch.setattr(generate, "LOSS_ROWS", 4)
    model, batch = _model(family, "prompt"), _batch(family)
    rows, losses = [], []
    model.get_output_embeddings().register_forward_hook(lambda m, args, out: rows.append(tuple(args[0].shape)))
    real = F.cross_entropy
    monkeypatch.setattr(F, "cross_entropy",
                        lambda logits, *args, **kwargs: losses.append(logits.shape) or real(logits, *args, **kwargs))
    with torch.no_grad():
        _, targets = lm_loss(model, batch)
    assert sum(shape[0] for shape in rows) == targets and all(len(shape) == 2 and shape[0] <= 4 for shape in rows)
    assert all(shape[0] <= 4 for shape in losses) and sum(shape[0] for shape in losses) == targets


def test_the_dev_loss_is_the_mean_over_every_target_token():
    model = _model("llama", "lora")
    batch = _batch("llama")
    examples = [{"input_ids": [int(t) for t, m in zip(ids, mask) if m], "labels": [int(t) for t, m in zip(lab, mask)
                                                                                   if m]}
                for ids, mask, lab in zip(batch["input_ids"], batch["attention_mask"], batch["labels"])]
    with torch.no_grad():
        expected = float(_whole_logits_loss(model, batch))
    assert dev_loss(model, examples, 0, 2, torch.device("cpu"), None) == pytest.approx(expected, rel=1e-5)


def test_bf16_loss_follows_the_fp32_loss():
    from autopelt.dtypes import settle_dtypes
    from autopelt.train import device as devices

    model, batch = _model("llama", "lora"), _batch("llama")
    with torch.no_grad():
        fp32 = float(lm_loss(model, batch)[0])
        settle_dtypes(model, torch.bfloat16)
        with devices.autocast(torch.device("cpu"), torch.bfloat16):
            bf16 = lm_loss(model, batch)[0]
    assert bf16.dtype == torch.float32 and float(bf16) == pytest.approx(fp32, rel=0.02)


def test_a_tokenizer_without_an_end_of_sequence_token_is_one_line_exit_2_and_nothing_written(tmp_path, capsys):
    folder = make_tiny_lm_folder(tmp_path / "lm")
    tokenizer = word_tokenizer()
    tokenizer.eos_token = None
    tokenizer.save_pretrained(folder)
    from autopelt.models import load_tokenizer

    assert load_tokenizer(str(folder)).eos_token_id is None
    data = write_e2e_like(tmp_path / "gen")
    args = ["train", "--task", "e2e", "--input-column", "mr", "--target-column", "ref", "--model", str(folder),
            "--data-dir", str(data), "--out", str(tmp_path / "out"), "--method", "lora", "--lr", "0.01"]
    capsys.readouterr()  # what saving the model printed
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "has no end-of-sequence token" in err and "eos_token" in err
    assert not (tmp_path / "out").exists()


def test_a_search_with_a_tokenizer_without_an_end_of_sequence_token_is_refused_before_its_study(tmp_path, capsys):
    folder = make_tiny_lm_folder(tmp_path / "lm")
    tokenizer = word_tokenizer()
    tokenizer.eos_token = None
    tokenizer.save_pretrained(folder)
    data = write_e2e_like(tmp_path / "gen")
    args = ["search", "--task", "e2e", "--input-column", "mr", "--target-column", "ref", "--model", str(folder),
            "--data-dir", str(data), "--storage", f"sqlite:///{tmp_path / 'study.db'}", "--budget", "2",
            "--out", str(tmp_path / "study")]
    capsys.readouterr()
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "has no end-of-sequence token" in err
    assert not (tmp_path / "study.db").exists() and not (tmp_path / "study").exists()

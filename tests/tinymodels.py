"""A tiny random BERT model folder with the real MiniLM tokenizer, and tiny GLUE-schema task files.

Trials load a model by folder, so the trial tests need one on disk: a random BERT encoder checkpoint
(hidden 32, 2 layers, 4 heads) with all-MiniLM-L6-v2's tokenizer beside it, so real text tokenises and a
trial's forward takes milliseconds. The synthetic rows say their label in a word ("good" -> 1), so a trial
on them can show learning in a few steps.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

# Words whose presence decides the label of the synthetic rows: a model learns the task in a few steps.
POSITIVE, NEGATIVE = "good", "bad"
FILLER = ("the", "movie", "was", "a", "story", "about", "people", "and", "it", "felt", "quite", "really",
          "long", "short", "day", "night", "film", "plot", "music", "actors")


def make_tiny_model_folder(folder: Path, tokenizer_path: str, seed: int = 0, head_labels: int | None = None) -> Path:
    """Save a random tiny BERT (vocabulary of the given tokenizer) and that tokenizer into `folder`.

    Like all-MiniLM-L6-v2 the checkpoint is the encoder alone; `head_labels` saves a fine-tuned-style
    BertForSequenceClassification with a classification head of that many labels instead.
    """
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification, BertModel

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    config = BertConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=512, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, num_labels=head_labels or 2,
    )
    torch.manual_seed(seed)
    model = BertForSequenceClassification(config) if head_labels else BertModel(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def sentence(rng: random.Random, label_word: str | None, words: int = 6) -> str:
    picked = [rng.choice(FILLER) for _ in range(words)]
    if label_word is not None:
        picked.insert(rng.randrange(len(picked) + 1), label_word)
    return " ".join(picked)


def _row(task: str, label: int, rng: random.Random) -> dict:
    """One row in the GLUE schema of `task`; the text says its label (through `good`/`bad`) for 2-class tasks."""
    word = POSITIVE if label == 1 else NEGATIVE
    if task in ("cola", "sst2"):
        return {"sentence": sentence(rng, word), "label": label}
    if task in ("mrpc", "rte", "wnli"):
        return {"sentence1": sentence(rng, None), "sentence2": sentence(rng, word), "label": label}
    if task == "qqp":
        return {"question1": sentence(rng, None), "question2": sentence(rng, word), "label": label}
    if task == "qnli":
        return {"question": sentence(rng, None), "sentence": sentence(rng, word), "label": label}
    if task == "mnli":
        word = ("good", "so", "bad")[label]
        return {"premise": sentence(rng, None), "hypothesis": sentence(rng, word), "label": label}
    if task == "stsb":
        score = round(5.0 * label / 3, 3)  # label 0..3 -> score 0..5, said by how many times "good" appears
        text = " ".join([sentence(rng, None, 3)] + [POSITIVE] * label)
        return {"sentence1": sentence(rng, None), "sentence2": text, "label": score}
    raise ValueError(task)


CLASSES = {"mnli": 3, "stsb": 4}  # label values drawn; every other task is binary
SPLITS = {"mnli": ("train", "validation_matched", "validation_mismatched")}


def write_task(data_dir: Path, task: str, sizes: dict[str, int], seed: int = 0) -> Path:
    """Write `<data_dir>/<task>/<split>.jsonl` with balanced labels; `sizes` maps split -> rows."""
    rng = random.Random(f"{task}-{seed}")
    folder = data_dir / task
    folder.mkdir(parents=True, exist_ok=True)
    for split, count in sizes.items():
        rows = [_row(task, i % CLASSES.get(task, 2), rng) for i in range(count)]
        for index, row in enumerate(rows):
            row["idx"] = index
        rng.shuffle(rows)
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return data_dir


def write_glue_like(data_dir: Path, task: str, train: int = 64, test: int = 32, seed: int = 0) -> Path:
    """Every split `task` reads (MNLI's matched and mismatched validation sets included)."""
    dataset = "mnli" if task == "mnli-mm" else task
    splits = SPLITS.get(dataset, ("train", "validation"))
    sizes = {split: (train if split == "train" else test) for split in splits}
    return write_task(data_dir, dataset, sizes, seed)


# Trial settings and fixtures shared by the trial tests (imported into each test module).

TINY_LORA = {"methods": [{"method": "lora", "rank": 4}]}


def trial_settings(model_dir, data_dir, cache_dir, **overrides):
    """Quick settings on the tiny model: LoRA r4, 2 epochs of batch 16 at a learning rate the tiny model learns at."""
    from autopelt.train import TrialSettings

    values = dict(task="sst2", spec=TINY_LORA, model=str(model_dir), data_dir=str(data_dir), cache_dir=str(cache_dir),
                  epochs=2, batch_size=16, learning_rate=1e-2, max_length=32, eval_batch_size=64,
                  threads=1)  # tiny matrices: more threads only contend on a shared machine
    values.update(overrides)
    return TrialSettings(**values)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, minilm_path) -> Path:
    return make_tiny_model_folder(tmp_path_factory.mktemp("tiny-bert"), minilm_path)


@pytest.fixture(scope="session")
def trial_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("token-cache")


@pytest.fixture(scope="session")
def sst2_dir(tmp_path_factory) -> Path:
    """Synthetic SST-2: 64 train rows (full protocol: 58 train, 6 dev), 32 validation rows."""
    return write_glue_like(tmp_path_factory.mktemp("data"), "sst2", train=64, test=32)


@pytest.fixture
def make_settings(tiny_model_dir, trial_cache, sst2_dir):
    def make(**overrides):
        overrides.setdefault("data_dir", sst2_dir)
        return trial_settings(tiny_model_dir, overrides.pop("data_dir"), trial_cache, **overrides)

    return make

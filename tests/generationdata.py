"""A tiny E2E-like generation task (inputs with several references) and tiny random decoders that read it: a
word-level tokenizer built from the task's own words (no download) beside a random Llama or GPT-2."""

from __future__ import annotations

import json
import random
from pathlib import Path

NAMES = ("Alimentum", "Aromi", "Bibimbap", "Cotto", "Giraffe", "Zizzi", "Wildwood", "Strada")
FOODS = ("Italian", "French", "Chinese", "English", "Indian")


def e2e_like_rows(seed: int = 0) -> dict[str, list[dict]]:
    """Train: 16 inputs x 3 references; validation: 8 inputs x 2 references (name[X], food[Y] -> text)."""
    rng = random.Random(seed)

    def rows(pairs, refs):
        out = []
        for name, food in pairs:
            texts = [f"{name} serves {food} food .", f"{name} is a {food} place .", f"You can eat {food} at {name} ."]
            out += [{"mr": f"name[{name}], food[{food}]", "ref": text} for text in texts[:refs]]
        rng.shuffle(out)
        return out

    pairs = [(n, f) for n in NAMES for f in FOODS]
    rng.shuffle(pairs)
    return {"train": rows(pairs[:16], 3), "validation": rows(pairs[16:24], 2)}


def write_e2e_like(data_dir: Path, name: str = "e2e") -> Path:
    folder = data_dir / name
    folder.mkdir(parents=True, exist_ok=True)
    for split, rows in e2e_like_rows().items():
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return data_dir


def word_tokenizer():
    """A word-level fast tokenizer over every word of the task, with <pad> <s> </s> <unk>."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {w for rows in e2e_like_rows().values() for r in rows for w in (r["mr"] + " " + r["ref"] + " Text :")
             .replace("[", " [ ").replace("]", " ] ").replace(",", " , ").split()}
    vocab = {t: i for i, t in enumerate(["<pad>", "<s>", "</s>", "<unk>", *sorted(words)])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")


def make_tiny_lm_folder(folder: Path, family: str = "llama", seed: int = 0) -> Path:
    """A random tiny language model of `family` (llama, gpt2, t5, t5-gated; its head: the LM head) with the word
    tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, GPT2Config, LlamaConfig, T5Config

    tokenizer = word_tokenizer()
    ids = dict(vocab_size=len(tokenizer), pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if family.startswith("t5"):
        config = T5Config(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
                          dropout_rate=0.0, decoder_start_token_id=0,
                          feed_forward_proj="gated-gelu" if family == "t5-gated" else "relu", **ids)
    elif family == "llama":
        config = LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                             intermediate_size=64, max_position_embeddings=128, **ids)
    else:
        config = GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=128, resid_pdrop=0.0, embd_pdrop=0.0,
                            attn_pdrop=0.0, **ids)
    torch.manual_seed(seed)
    (AutoModelForSeq2SeqLM if family.startswith("t5") else AutoModelForCausalLM).from_config(config).save_pretrained(
        folder)
    tokenizer.save_pretrained(folder)
    return folder

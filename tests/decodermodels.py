"""Tiny random-weight Llama (grouped-query attention), GPT-2 and T5 (v1.0's ReLU FFN, and v1.1's gated one as
Flan-T5 has it) models, built from configs (no download)."""

from __future__ import annotations

import torch

DECODER_FAMILIES = ("llama", "gpt2", "t5", "t5-gated")


def is_t5(family: str) -> bool:
    return family.startswith("t5")


def tiny_decoder_config(family: str, num_labels: int = 2):
    from transformers import GPT2Config, LlamaConfig, T5Config

    if family == "llama":  # 4 query heads over 2 key/value heads
        return LlamaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64, pad_token_id=0,
                           bos_token_id=1, eos_token_id=2, num_labels=num_labels, tie_word_embeddings=True)
    if family == "gpt2":
        return GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64, pad_token_id=0,
                          bos_token_id=1, eos_token_id=2, num_labels=num_labels, resid_pdrop=0.0, embd_pdrop=0.0,
                          attn_pdrop=0.0)
    if is_t5(family):
        return T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
                        dropout_rate=0.0, pad_token_id=0, eos_token_id=2, decoder_start_token_id=0,
                        feed_forward_proj="gated-gelu" if family == "t5-gated" else "relu")
    raise ValueError(family)


def tiny_decoder(family: str, lm: bool = False, seed: int = 0):
    """A sequence classifier (Llama, GPT-2) or, with `lm` or for T5, the language model."""
    from autopelt.delta.sites import model_class

    config = tiny_decoder_config(family)
    torch.manual_seed(seed)
    return model_class(config, lm or is_t5(family)).from_config(config).eval()


def decoder_batch(family: str, batch_size: int = 3, seq_len: int = 7, seed: int = 0, padded: bool = True):
    """conftest.tiny_batch; T5 gets decoder ids too, drawn after the input ids from the same generator."""
    from conftest import tiny_batch

    g = torch.Generator().manual_seed(seed)
    batch = tiny_batch(batch_size, seq_len, padded=padded, generator=g)
    if is_t5(family):
        batch["decoder_input_ids"] = torch.randint(3, 100, (batch_size, 4), generator=g)
    return batch


def row_alone(batch: dict, row: int) -> dict:
    """One row of a right-padded batch, without its padding."""
    length = int(batch["attention_mask"][row].sum())
    alone = {k: v[row:row + 1, :length] for k, v in batch.items() if k != "decoder_input_ids"}
    if "decoder_input_ids" in batch:
        alone["decoder_input_ids"] = batch["decoder_input_ids"][row:row + 1]
    return alone

"""Tiny random models of every declared family (2 layers, hidden 32, 4 heads; vocabulary of 100, pad 0, bos 1, eos 2),
built from transformers' config classes: no download, a forward in milliseconds. BERT and RoBERTa come from
conftest, Llama, GPT-2 and T5 from decodermodels; this module adds the rest."""

from __future__ import annotations

import torch

ENCODERS = ("bert", "roberta", "electra", "deberta-v2", "mpnet", "distilbert", "albert", "modernbert")
DECODERS = ("llama", "gemma", "gemma2", "gemma3_text", "phi3", "olmo2", "gpt2")
NEW_ENCODERS = ENCODERS[2:]
NEW_DECODERS = DECODERS[1:-1]
_IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
_NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
_SMALL = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
              max_position_embeddings=64)


def family_config(family: str, num_labels: int = 2):
    """The tiny config of `family` (a model type)."""
    import transformers as t

    from conftest import tiny_config
    from decodermodels import tiny_decoder_config

    if family in ("bert", "roberta"):
        return tiny_config(family, num_labels)
    if family in ("llama", "gpt2", "t5"):
        return tiny_decoder_config(family, num_labels)
    labels = dict(num_labels=num_labels)
    if family == "electra":  # embeddings narrower than the layers, as electra-small's
        return t.ElectraConfig(**_SMALL, embedding_size=16, **_NO_DROPOUT, **_IDS, **labels)
    if family == "deberta-v2":  # DeBERTa-v3's settings: relative positions only, shared attention keys
        return t.DebertaV2Config(**_SMALL, **_NO_DROPOUT, **_IDS, **labels, relative_attention=True,
                                 pos_att_type=["p2c", "c2p"], position_biased_input=False, position_buckets=16,
                                 norm_rel_ebd="layer_norm", share_att_key=True, type_vocab_size=0)
    if family == "mpnet":
        return t.MPNetConfig(**_SMALL, **_NO_DROPOUT, **_IDS, **labels)
    if family == "distilbert":
        return t.DistilBertConfig(vocab_size=100, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                                  max_position_embeddings=64, dropout=0.0, attention_dropout=0.0,
                                  seq_classif_dropout=0.0, pad_token_id=0, **labels)
    if family == "albert":
        return t.AlbertConfig(**_SMALL, embedding_size=16, inner_group_num=2, **_NO_DROPOUT, classifier_dropout_prob=0.0, **_IDS,
                              **labels)
    if family == "modernbert":
        return t.ModernBertConfig(**_SMALL, **_IDS, cls_token_id=1, sep_token_id=2, global_attn_every_n_layers=2,
                                  local_attention=8, **labels)
    if family == "bart":
        return t.BartConfig(vocab_size=100, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                            decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                            max_position_embeddings=64, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                            classifier_dropout=0.0, decoder_start_token_id=2, **_IDS, **labels)
    decoder = dict(**_SMALL, num_key_value_heads=2, **_IDS, **labels)
    if family == "gemma":
        return t.GemmaConfig(**decoder, head_dim=8)
    if family == "gemma2":
        return t.Gemma2Config(**decoder, head_dim=8, sliding_window=4, query_pre_attn_scalar=8)
    if family == "gemma3_text":
        return t.Gemma3TextConfig(**decoder, head_dim=8, sliding_window=4, query_pre_attn_scalar=8,
                                  layer_types=["sliding_attention", "full_attention"])
    if family == "phi3":
        return t.Phi3Config(**decoder, resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0)
    if family == "olmo2":
        return t.Olmo2Config(**decoder)
    raise ValueError(family)


def family_model(family: str, num_labels: int = 2, seed: int = 0, lm: bool = False):
    """A tiny sequence classifier of `family` (with `lm`, a decoder's language model), in eval mode."""
    from autopelt.delta.sites import model_class

    config = family_config(family, num_labels)
    torch.manual_seed(seed)
    return model_class(config, lm).from_config(config).eval()


def save_family_folder(family: str, folder, tokenizer_path: str, seed: int = 0):
    """A tiny `family` checkpoint with a real tokenizer beside it (its vocabulary as large as the tokenizer's), for
    trials through the command line: the encoder alone for an encoder, the causal LM for a decoder."""
    from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    config = family_config(family)
    config.vocab_size = len(tokenizer)
    for name in ("pad_token_id", "bos_token_id", "eos_token_id", "cls_token_id", "sep_token_id"):
        if getattr(config, name, None) is not None:
            setattr(config, name, getattr(tokenizer, name.removesuffix("_id"), None) and getattr(tokenizer, name))
    if family == "bart":  # its classifier reads the last </s>: the tokenizer must end every row with one
        tokenizer.eos_token = tokenizer.sep_token
        config.eos_token_id = config.decoder_start_token_id = tokenizer.sep_token_id
        config.bos_token_id = tokenizer.cls_token_id
    if family in ("deberta-v2", "mpnet", "distilbert", "modernbert"):
        tokenizer.model_input_names = ["input_ids", "attention_mask"]  # as their own tokenizers: no token types
    torch.manual_seed(seed)
    model = (AutoModelForCausalLM if family in DECODERS else AutoModel).from_config(config)
    if family == "bart":
        from transformers import BartForConditionalGeneration

        model = BartForConditionalGeneration(config)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder

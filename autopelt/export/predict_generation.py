"""`autopelt predict` on a generation delta: greedy text for each input, batched (left padding, KV cache)."""

from __future__ import annotations

from autopelt.errors import UserError


def is_generation_delta(delta_dir) -> bool:
    from autopelt import delta

    return "generation" in delta.read_delta_header(delta_dir)


def load_generation_model(delta_dir, model_name: str | None = None):
    """(the language model in eval mode with the delta loaded and merged where it merges, the delta's header)."""
    from autopelt import delta
    from autopelt.models import load_language_model, resolve_model

    header = delta.read_delta_header(delta_dir)
    name = resolve_model(model_name or header.get("base_model"))
    model = load_language_model(name)
    delta.load_delta(model, delta_dir)
    delta.merge(model)
    return model.eval(), {**header, "base_model": name}


def generate_for_rows(model, tokenizer, header: dict, rows: list[dict], max_new_tokens: int,
                      batch_size: int = 32) -> list[dict]:
    """One {"text": ...} per row, each row holding the task's input column."""
    import torch

    from autopelt.data.generation import PROMPT
    from autopelt.train.generate import generate

    column = header["generation"]["input_column"]
    for number, row in enumerate(rows, 1):
        if not isinstance(row.get(column), str):
            raise UserError(f"input row {number} lacks the text column {column!r}")
    prompts = [header["generation"].get("prompt", PROMPT).format(input=row[column]) for row in rows]
    texts = generate(model, tokenizer, prompts, batch_size, max_new_tokens, torch.device("cpu"))
    return [{"text": text} for text in texts]

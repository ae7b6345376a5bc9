"""Run an exported delta: load base model + delta, merge what merges, predict labels or scores."""

from __future__ import annotations

import json
from pathlib import Path

from autopelt.errors import UserError


def load_delta_model(delta_dir, model_name: str | None = None):
    """(model in eval mode with the delta loaded and LoRA merged, the delta's header)."""
    from autopelt import delta
    from autopelt.models import load_model, resolve_model

    header = delta.read_delta_header(delta_dir)
    name = resolve_model(model_name or header.get("base_model"))
    model = load_model(name, header["num_labels"], header.get("problem_type"))
    delta.load_delta(model, delta_dir)
    delta.merge(model)  # LoRA folded into the weights; AdaMix is stored merged already
    return model.eval(), {**header, "base_model": name}


def text_columns(header: dict) -> tuple[str, ...]:
    from autopelt.data import get_task

    if header.get("text_columns"):  # saved with the delta (deltas of older versions lack them)
        return tuple(header["text_columns"])
    task = header.get("task")
    return get_task(task).text_columns if task else ("sentence",)


def predict(model, tokenizer, header: dict, rows: list[dict], batch_size: int = 64) -> list[dict]:
    """One prediction per row: label id and name with probabilities, or a score for regression."""
    import torch

    columns = text_columns(header)
    for number, row in enumerate(rows, 1):
        lacking = [c for c in columns if row.get(c) is None]
        if lacking:
            raise UserError(f"input row {number} lacks {lacking[0]!r}; every row needs {', '.join(columns)}")
    names = _label_names(header)
    out = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        texts = [[str(row[c]) for row in chunk] for c in columns]  # one list per column: (texts[, pairs])
        encoded = tokenizer(*texts, truncation=True, max_length=128, padding=True, return_tensors="pt")
        with torch.no_grad():
            logits = model(**encoded).logits.float()
        out.extend(_rows(logits, names))
    return out


def _rows(logits, names) -> list[dict]:
    if logits.shape[-1] == 1:
        return [{"score": float(v)} for v in logits[:, 0]]
    probabilities = logits.softmax(-1)
    return [{"label": int(p.argmax()), "label_name": names[int(p.argmax())] if names else None,
             "probabilities": [round(float(x), 6) for x in p]} for p in probabilities]


def _label_names(header: dict) -> list[str] | None:
    from autopelt.data import get_task

    if "label_names" in header:
        return list(header["label_names"]) or None
    task = header.get("task")
    names = list(get_task(task).label_names) if task else []
    return names or None


def read_rows(path, flag: str = "--input") -> list[dict]:
    """The JSON objects of a JSONL file, one a line (blank lines skipped); `flag` names the option in errors."""
    rows = []
    try:
        with Path(path).open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError:
                        raise UserError(f"{flag} {path}, line {number}: not JSON; write one JSON object a line") \
                            from None
    except OSError as error:
        raise UserError(f"cannot read {flag} {path}: {error.strerror}") from None
    except UnicodeDecodeError:
        raise UserError(f"cannot read {flag} {path}: not UTF-8 text; save it as UTF-8") from None
    return rows

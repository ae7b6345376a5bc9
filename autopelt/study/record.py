"""What a trial's record in the study holds: the user attributes of docs/design.md, built from plain data."""

from __future__ import annotations

import math
from typing import Any


def planned_attrs(spec: dict, summary: str, count, max_fidelity: int, result_dir: str, hparams: dict) -> dict:
    """Known before training: the delta, its size, where its outputs go."""
    return {
        "spec": spec,
        "summary": summary,
        "methods": [entry["method"] for entry in spec["methods"]],
        **size_attrs(count),
        "hparams": hparams,
        "max_fidelity": max_fidelity,
        "result_dir": result_dir,
    }


def size_attrs(count) -> dict:
    return {
        "params_stored": int(count.stored),
        "params_trainable": int(count.trainable),
        "params_pct": 100.0 * count.stored / count.base,
    }


def result_attrs(result: dict, fidelity: int, max_fidelity: int) -> dict:
    """Known after training, from the trial result JSON (docs/design.md)."""
    attrs = {
        "dev": result.get("dev") or {},
        "test": result.get("test") or {},
        "fidelity": int(result.get("epochs_run") or fidelity),
        "max_fidelity": max_fidelity,
        "full_fidelity": True,
    }
    for key in ("gates", "extra_tests"):
        if result.get(key):
            attrs[key] = result[key]
    for key in ("train_seconds", "examples_per_second", "peak_memory_mb", "best_epoch"):
        if isinstance(result.get(key), (int, float)):
            attrs[key] = result[key]
    return attrs


def failure_reason(result: dict) -> str | None:
    """Why a finished trial counts as failed, or None when its dev metric is usable."""
    if result.get("status") != "ok":
        return str(result.get("reason") or "the trial failed without a reason")
    value = result.get("dev_metric")
    if not is_finite(value):
        return f"dev metric is {value!r} (not a finite number)"
    return None


def is_finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def objective_values(result: dict, params_pct: float, multi_objective: bool) -> list[float]:
    """(dev metric) or (dev metric, stored params %): the study's objectives, in its directions' order."""
    values = [float(result["dev_metric"])]
    return values + [float(params_pct)] if multi_objective else values

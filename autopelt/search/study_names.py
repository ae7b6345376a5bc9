"""A study's name: the same task, model, space file and protocol give the same study, so that running a command
again resumes it (search/resume.py)."""

from __future__ import annotations

from pathlib import Path


def study_name_for(task: str, model: str, space, k: int | None, multi_objective: bool) -> str:
    """`rte-all-MiniLM-L6-v2-default-1a2b3c4d`: same task, model, space file and protocol -> same study."""
    from autopelt.models import model_name

    parts = [task, model_short(model_name(model)), space.name, str(space.fingerprint)[:8]]
    if k:
        parts.append(f"k{k}")
    if multi_objective:
        parts.append("pareto")
    return "-".join(parts)


_GENERIC = {"model", "models", "snapshot", "snapshots", "main", "checkpoint", "final"}


def model_short(model: str) -> str:
    """A model's readable name: a hub id's last part, or a folder's name above generic ones like `model`."""
    path = Path(str(model).rstrip("/"))
    while path.name.lower() in _GENERIC and path.parent != path:
        path = path.parent
    return path.name or str(model)

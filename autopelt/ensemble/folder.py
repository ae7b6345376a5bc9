"""An ensemble folder: what `autopelt export --ensemble` writes and `autopelt predict` / `autopelt.load` read.

    ensemble.json        the manifest: format, base model, task, label set, members (folder, weight, trial,
                         summary, dev), the ensemble's and the single answer's dev, whether the ensemble answers
                         under the margin rule, and its inference cost (forward passes an input)
    member-<i>/          each member's delta (delta.json, delta.safetensors), and its peft/ folder where peft
                         can hold that delta: peft holds members, not the ensemble (it has no weighted average)
    README.md            the model card

Every member must be readable and agree with the manifest on the base model's type and the label set; any
disagreement is one UserError before anything is loaded.
"""

from __future__ import annotations

import json
from pathlib import Path

from autopelt.errors import UserError

MANIFEST = "ensemble.json"
FORMAT = "autopelt-ensemble/1"


def is_ensemble(path) -> bool:
    """Whether `path` is an ensemble folder (it holds ensemble.json)."""
    return (Path(path) / MANIFEST).is_file()


def write_ensemble(staging: Path, members: list[dict], info: dict) -> dict:
    """Write the manifest of the members already copied into `staging` (each {"folder", "weight", …}); returns it.
    `info`: base_model, task, num_labels, label_names, text_columns, problem_type, model_type, dev, single, …"""
    manifest = {"format": FORMAT, **info, "members": members,
                "inference": {"forward_passes": len(members), "backbone_loads": 1}}
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str))
    return manifest


def read_manifest(path) -> dict:
    """The manifest of an ensemble folder, every member checked (module docstring).

    Raises:
        UserError: no or an unreadable manifest, a missing or corrupt member, members of another base model type
            or label set than the manifest's, weights that are not positive.
    """
    from autopelt.delta.io import WEIGHTS_FILE, read_delta_header

    folder = Path(path)
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise UserError(f"cannot read {folder / MANIFEST} ({error}); export the ensemble again") from None
    if manifest.get("format") != FORMAT or not manifest.get("members"):
        raise UserError(f"{folder / MANIFEST} is not an autopelt ensemble (format {manifest.get('format')!r}, "
                        f"expected {FORMAT} with members)")
    for member in manifest["members"]:
        member_dir = folder / str(member.get("folder"))
        if not (member_dir / WEIGHTS_FILE).is_file():
            raise UserError(f"ensemble member {member_dir} is missing (no {WEIGHTS_FILE}); export the ensemble again")
        header = read_delta_header(member_dir)
        _check_weights_file(member_dir / WEIGHTS_FILE)
        for key, what in (("model_type", "model type"), ("num_labels", "number of labels")):
            if header.get(key) != manifest.get(key):
                raise UserError(f"ensemble member {member_dir} has {what} {header.get(key)!r}, the ensemble "
                                f"{manifest.get(key)!r}: members must share one base model and label set")
        if header.get("label_names") and manifest.get("label_names") and \
                list(header["label_names"]) != list(manifest["label_names"]):
            raise UserError(f"ensemble member {member_dir} has labels {header['label_names']}, the ensemble "
                            f"{manifest['label_names']}: members must share one label set")
        if header.get("base_model") and manifest.get("base_model") and header["base_model"] != manifest["base_model"]:
            raise UserError(f"ensemble member {member_dir} was trained on {header['base_model']}, the ensemble on "
                            f"{manifest['base_model']}: members must share one base model")
        if not isinstance(member.get("weight"), (int, float)) or member["weight"] <= 0:
            raise UserError(f"ensemble member {member_dir} has weight {member.get('weight')!r}; weights are positive")
    return manifest


def _check_weights_file(path: Path) -> None:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            handle.keys()
    except Exception as error:  # safetensors raises several types for a bad file
        raise UserError(f"cannot read ensemble member weights {path}: {error}") from None

"""Export a study's ensemble as one folder (autopelt/ensemble/folder.py), and run one with `autopelt predict`.

The ensemble is selected from the study's finished trials' dev predictions (autopelt/ensemble/study.py). The
folder is built beside `out` and moved into place: a failure (a member without weights, members that disagree on
the base model or the label set) leaves nothing written.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from autopelt.errors import UserError


def export_ensemble(trial_dirs: list, out_dir, max_members: int | None = None, study_name: str = "",
                    rule=None, answer_dir=None, say=lambda line: None) -> tuple:
    """Select the ensemble of `trial_dirs` and write it to the new folder `out_dir`; returns (folder, StudyEnsemble).
    `rule`: the selection's select.Rule (default: study.DEFAULT_RULE); `answer_dir`: the study's answer's folder,
    which the ensemble is set beside (study_ensemble). Once chosen, its test metric and the single answer's are
    computed (study.with_test; `say` gets its one line) and written to the manifest and the model card.

    Raises:
        UserError: `out_dir` exists and is not empty, no trial has dev predictions, a member has no saved delta,
            or the members disagree on the base model or the label set.
    """
    from autopelt.delta import read_delta_header
    from autopelt.ensemble.folder import write_ensemble
    from autopelt.ensemble.study import DEFAULT_RULE, study_ensemble, with_test

    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise UserError(f"--out {out} exists and is not empty; choose a new folder")
    chosen = study_ensemble(trial_dirs, rule=rule or DEFAULT_RULE, max_members=max_members, answer_dir=answer_dir)
    headers = []
    for member in chosen.members:
        if not (member.folder / "delta" / "delta.safetensors").is_file():
            raise UserError(f"ensemble member {member.folder} has no saved delta weights; export completed trials")
        headers.append(read_delta_header(member.folder / "delta"))
    for header, member in zip(headers[1:], chosen.members[1:]):
        for key in ("model_type", "num_labels", "base_model", "label_names"):
            if header.get(key) != headers[0].get(key):
                raise UserError(f"ensemble member {member.folder} differs in {key} ({header.get(key)!r} vs "
                                f"{headers[0].get(key)!r}); an ensemble shares one base model and label set")
    chosen = with_test(chosen, say)  # after every choice: no member or weight depends on it
    staging = out.with_name(f".{out.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        members = []
        for number, (member, weight) in enumerate(zip(chosen.members, chosen.weights)):
            folder = staging / f"member-{number}"
            folder.mkdir()
            for name in ("delta.json", "delta.safetensors"):
                shutil.copy2(member.folder / "delta" / name, folder / name)
            members.append({"folder": folder.name, "weight": weight, "trial_dir": str(member.folder),
                            "summary": member.summary, "dev": member.dev, "peft": _peft(folder, member.result)})
        keys = ("task", "text_columns", "label_names", "base_model", "num_labels", "problem_type", "model_type")
        info = {key: headers[0].get(key) for key in keys}
        manifest = write_ensemble(staging, members, {**info, "study": study_name, **_selection(chosen)})
        (staging / "README.md").write_text(model_card(manifest))
        if out.exists():
            out.rmdir()
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out, chosen


def _selection(chosen) -> dict:
    return {"metric": chosen.metric, "dev": chosen.dev, "test": chosen.test, "answers": chosen.answers,
            "margin": chosen.margin, "rule": chosen.rule.to_dict(),
            "single": {"trial_dir": str(chosen.single.folder), "summary": chosen.single.summary,
                       "dev": chosen.single_dev, "test": chosen.single_test}}


def _peft(folder: Path, result: dict) -> str:
    """'peft/' when the member's peft folder was written, else why not."""
    from autopelt.export.export import _maybe_peft

    return _maybe_peft(folder, result) or "peft/"


def model_card(manifest: dict) -> str:
    """The README of an ensemble folder."""
    members = manifest["members"]
    single = manifest["single"]
    verdict = ("it answers under the margin rule" if manifest["answers"] else
               "under the margin rule the single answer stays the study's answer; this folder holds the ensemble "
               "anyway")
    lines = [f"# autopelt ensemble of {len(members)} deltas on {manifest.get('task')}", "",
             f"- base model: `{manifest.get('base_model')}`",
             "- selection: greedy forward selection with replacement on dev predictions (Caruana et al. 2004)",
             f"- dev {manifest['metric']}: ensemble {manifest['dev']:.4f}, single answer {single['dev']:.4f} "
             f"({single['summary']}), on the dev rows that chose the members; {verdict}",
             *([f"- test {manifest['metric']}: ensemble {manifest['test']:.4f}, single answer {single['test']:.4f} "
                "(computed once the members were chosen; no choice read it)"]
               if manifest.get("test") is not None and single.get("test") is not None else []),
             f"- inference cost: **{len(members)} forward passes an input** on one backbone load "
             "(a soup of same-structure LoRA members would cost 1)", "",
             "| member | weight | dev | what | peft |", "|---|---|---|---|---|"]
    lines += [f"| {m['folder']} | {m['weight']:.3f} | {m['dev']:.4f} | {m['summary']} | {m['peft']} |"
              for m in members]
    lines += ["", "Run it:", "", "```", "autopelt predict --delta . --text \"…\"", "```", "",
              "The peft folders hold members, not the ensemble: peft has no weighted average of adapters' outputs."]
    return "\n".join(lines) + "\n"

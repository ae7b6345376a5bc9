"""Export a study's answer: the delta (spec + safetensors), its training settings, metrics and a model card,
plus a peft adapter folder when the delta has a peft form; optionally re-run with several seeds.

Layout of an export folder (what `autopelt predict --delta DIR` reads):
    delta.json, delta.safetensors   the delta in inference form (autopelt's own format)
    training.json                   the trial's settings (task, model, protocol, learning rate, seed …)
    metrics.json                    dev/test metrics, parameter counts, and the re-seeded mean ± std
    README.md                       a short model card
    peft/                           a peft adapter folder, when the delta has a peft form (LoRA, rsLoRA, DoRA,
                                    IA3, VeRA or a shifted prefix; + BitFit beside LoRA/VeRA, + head); else the
                                    model card and metrics.json say why not
"""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

from autopelt.errors import UserError
from autopelt.study import answers
from autopelt.study.record import TrialRecord, read_all


def pick_trials(study, trial_number: int | None, pareto: bool) -> list[TrialRecord]:
    """The trials to export: one by number, the Pareto front (by trial number), or the best trial."""
    trials = read_all(study)
    if trial_number is not None:
        chosen = [t for t in trials if t.number == trial_number]
        if not chosen:
            raise UserError(f"study {study.study_name!r} has no trial {trial_number} (it has 0..{len(trials) - 1})")
        return chosen
    maximize = answers.maximizes(study)
    best = answers.best(trials, maximize)
    if best is None:
        raise UserError(f"study {study.study_name!r} has no completed full-fidelity trial to export yet")
    if pareto:
        return sorted(answers.pareto_front(trials, maximize), key=lambda t: t.number)
    return [best]


def trial_outputs(trial: TrialRecord) -> tuple[dict, Path]:
    """The trial's result.json and its delta folder; UserError when the trial kept no weights."""
    result_dir = trial.result_dir
    delta_dir = Path(result_dir or "") / "delta"
    if not result_dir or not (delta_dir / "delta.safetensors").is_file():
        state = trial.state.name.lower()
        raise UserError(f"trial {trial.number} ({state}) has no saved delta weights"
                        + (f" in {result_dir}" if result_dir else "") + "; export a completed trial")
    try:
        result = json.loads((Path(result_dir) / "result.json").read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise UserError(f"trial {trial.number}: cannot read {result_dir}/result.json ({error})") from None
    return result, delta_dir


def export_trial(trial: TrialRecord, out_dir: Path, reseed: int = 0, study_name: str = "",
                 floors: dict | None = None, ensemble: dict | None = None) -> Path:
    """Write one trial's export folder (export_result). `floors`: the study's one-class floors
    (autopelt/study/floors.py), kept in metrics.json and shown in the model card; `ensemble`: the study's ensemble
    beside this answer (`ensemble_beside`), likewise."""
    trial_outputs(trial)  # a one-line error before anything is scored or written
    about = {"study": study_name, "trial": trial.number, "baseline": trial.baseline,
             **({"floors": floors} if floors else {}), **({"ensemble": ensemble} if ensemble else {})}
    return export_result(trial.result_dir, out_dir, about, reseed)


def ensemble_beside(study, say=lambda line: None) -> dict | None:
    """The study's ensemble of two or more members (autopelt/ensemble/study.py `brief`), beside its single
    answer, with both test metrics (`with_test`: kept predictions read, the others scored on one backbone load;
    where that fails, test None and `test_not_scored` says why); None without one."""
    from autopelt.ensemble.study import of_study, with_test

    chosen = of_study(study)
    if chosen is None or len(chosen.members) < 2:
        return None
    try:
        return with_test(chosen, say).brief()
    except UserError as error:
        return {**chosen.brief(), "test_not_scored": str(error)}


def export_result(result_dir, out_dir: Path, about: dict, reseed: int = 0) -> Path:
    """Write the export folder of the finished trial in `result_dir` (atomically: built beside `out_dir`, then
    moved into place). A trial trained without its test scores (a search trial) is scored first, from its saved
    delta. `about`: what metrics.json says beside the trial's own metrics (its study and trial number, floors, what
    it was distilled from)."""
    result = json.loads((Path(result_dir) / "result.json").read_text())
    delta_dir = Path(result_dir) / "delta"
    if not result.get("test") and result.get("status") == "ok":
        from autopelt.study.answer_scores import score_result_dir

        result["test"], result["extra_tests"] = score_result_dir(result_dir)
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise UserError(f"--out {out_dir} exists and is not empty; choose a new folder")
    staging = out_dir.with_name(f".{out_dir.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        for name in ("delta.json", "delta.safetensors"):
            shutil.copy2(delta_dir / name, staging / name)
        _portable_base_model(staging / "delta.json")
        metrics = {**about, **_metrics(result)}
        if reseed:
            metrics["reseed"] = reseeded(result["settings"], reseed, staging / "seeds")
        _write_json(staging / "training.json", {**result["settings"], "score_test": True})
        no_peft = _maybe_peft(staging, result)
        _write_json(staging / "metrics.json", {**metrics, "peft": no_peft or "peft/"})
        (staging / "README.md").write_text(model_card(result, metrics, no_peft))
        if out_dir.exists():
            out_dir.rmdir()
        staging.rename(out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir


def _portable_base_model(header_file: Path) -> None:
    """The exported delta names its base model by a name that loads elsewhere (models.portable_name), not a folder
    inside this machine's virtualenv."""
    from autopelt.models import portable_name

    header = json.loads(header_file.read_text())
    if header.get("base_model"):
        header["base_model"] = portable_name(header["base_model"])
        header_file.write_text(json.dumps(header, indent=2, default=str))


def reseeded(settings: dict, seeds: int, work_dir: Path) -> dict:
    """Re-run a trial's settings with seeds 0..n-1 (new K-shot samples too, as the papers do): mean ± std."""
    from autopelt.train import TrialSettings, run_trial

    runs = []
    for seed in range(seeds):
        changed = {**settings, "seed": seed, "data_seed": seed, "out_dir": str(work_dir / f"seed-{seed}"),
                   "score_test": True}
        result = run_trial(TrialSettings.from_dict(changed))
        if result["status"] != "ok":
            raise UserError(f"re-run with seed {seed} failed: {result['reason']}")
        runs.append({"seed": seed, "dev": result["dev"], "test": result["test"]})
    summary = {}
    for split in ("dev", "test"):
        for metric in runs[0][split]:
            values = [run[split][metric] for run in runs]
            summary[f"{split}_{metric}"] = {"mean": statistics.fmean(values),
                                            "std": statistics.stdev(values) if len(values) > 1 else 0.0}
    shutil.rmtree(work_dir, ignore_errors=True)  # the runs' weights: only their numbers are kept
    return {"seeds": seeds, "runs": runs, "summary": summary}


def _metrics(result: dict) -> dict:
    metrics = {"task": result.get("task"), "metric": result.get("metric"), "dev": result.get("dev"),
               "test": result.get("test"), "params": result.get("params"), "protocol": result.get("protocol"),
               "gates": result.get("gates")}
    base = quantized_base(result)
    return {**metrics, "quantized_base": base} if base else metrics


def quantized_base(result: dict) -> str | None:
    """How the base was stored while the delta trained, where it was quantised (autopelt/quantize.py); else None."""
    if (result.get("settings") or {}).get("quantize") != "4bit":
        return None
    return "4-bit NF4, double quantisation, bf16 compute (QLoRA)"


def _maybe_peft(folder: Path, result: dict) -> str | None:
    """Write folder/peft when the delta has a peft form and peft is installed; else the one-line reason why not."""
    from autopelt.delta import read_delta_header
    from autopelt.delta.peft_export import peft_reason

    header = read_delta_header(folder)  # a delta saved by an older autopelt, in today's fields
    reason = peft_reason(header["spec"], header.get("model_type"))
    if reason:
        return reason
    try:
        import peft  # noqa: F401
    except ImportError:
        return "peft is not installed (pip install peft, then export again)"
    from autopelt.delta.peft_export import export_peft
    from autopelt.export.predict import load_delta_model
    from autopelt.export.predict_generation import load_generation_model

    load = load_generation_model if "generation" in header else load_delta_model  # a language model: no head
    model, _ = load(folder, result.get("model"))
    try:
        export_peft(model, header["spec"], folder / "peft", base_model_name=result.get("model"))
    except UserError as error:  # refused before peft writes anything
        return str(error)
    return None


def model_card(result: dict, metrics: dict, no_peft: str | None) -> str:
    """The README of an export; `no_peft` is why there is no peft folder (None when there is one)."""
    from autopelt.models import model_name

    params = result.get("params") or {}
    lines = [
        f"# autopelt delta: {result.get('summary', '')}",
        "",
        f"- task: **{result.get('task')}** ({(result.get('protocol') or {}).get('name')} protocol)",
        f"- base model: **{model_name(str(result.get('model')))}** (`{result.get('model')}`)",
        f"- stored parameters: {params.get('stored', 0):,} ({params.get('stored_pct', 0):.3f}% of the base model)",
        f"- dev: {_fmt(result.get('dev'))}; test (never used for selection): {_fmt(result.get('test'))}",
    ]
    if quantized_base(result):
        lines.append(f"- **trained on a 4-bit quantised base** ({quantized_base(result)}): load the base the same "
                     f"way to score as above; in full precision its outputs differ slightly")
    floors = metrics.get("floors")
    if floors and floors.get("dev") is not None:
        lines.append(f"- one-class floor (what learning nothing scores): dev {floors['dev']:.4f}"
                     + (f", test {floors['test']:.4f}" if floors.get("test") is not None else ""))
        note = nothing_learned_note(floors, result)
        if note:
            lines.append(f"- **{note}**")
    if "ensemble" in metrics:
        lines.append(ensemble_line(metrics["ensemble"]))
    if "distilled" in metrics:
        lines.append(distilled_line(metrics["distilled"], (metrics.get("test") or {}).get(metrics.get("metric"))))
    if "reseed" in metrics:
        summary = metrics["reseed"]["summary"]
        lines.append(f"- over {metrics['reseed']['seeds']} seeds: "
                     + ", ".join(f"{k} {v['mean']:.4f} ± {v['std']:.4f}" for k, v in summary.items()))
    lines += ["", "Run it:", "", "```", "autopelt predict --delta . --text \"…\"", "```"]
    if no_peft is None:
        lines += ["", "Or with peft:", "", "```python",
                  "from peft import PeftModel",
                  "model = PeftModel.from_pretrained(base_model, \"peft\")", "```"]
    else:
        lines += ["", f"No peft folder: {no_peft}."]
    return "\n".join(lines) + "\n"


def ensemble_line(ensemble: dict) -> str:
    """The model card's line on the study's ensemble beside this delta (`ensemble_beside`)."""
    verdict = "it answers the study instead of this delta" if ensemble["answers"] else "this delta stays the answer"
    test = (f"; test {ensemble['test']:.4f} vs {ensemble['single_test']:.4f}"
            if ensemble.get("test") is not None and ensemble.get("single_test") is not None else
            "; its test is not scored")
    return (f"- the study's ensemble of {ensemble['members']} deltas ({ensemble['forward_passes']} forward passes "
            f"an input): dev {ensemble['metric']} {ensemble['dev']:.4f} vs this delta's {ensemble['single_dev']:.4f} "
            f"on {ensemble['dev_rows']}{test}; {verdict} (`autopelt export --ensemble` writes it)")


def distilled_line(distilled: dict, test: float | None) -> str:
    """The model card's line on a delta distilled from an ensemble (autopelt/ensemble/distill.py); `test` is the
    distilled delta's own test metric."""
    ensemble, single = distilled["ensemble"].get("test"), distilled["single"].get("test")
    tests = [(name, value) for name, value in (("this delta", test), ("the ensemble", ensemble),
                                               ("the single answer", single)) if value is not None]
    return (f"- distilled from an ensemble of {distilled['members']} deltas (knowledge distillation, alpha "
            f"{distilled['alpha']:g}, temperature {distilled['temperature']:g}, chosen by dev among "
            f"{len(distilled['candidates'])}{_taught(distilled)}): one forward pass an input instead of "
            f"{distilled['members']}"
            + (f"; test {distilled['metric']}: " + ", ".join(f"{n} {v:.4f}" for n, v in tests) if tests else ""))


def _taught(distilled: dict) -> str:
    """What the teacher labelled beyond the train rows, as the model card says it."""
    parts = [f"{distilled['copies']} cut-off copies of each train row" if distilled.get("copies") else "",
             f"{distilled['unlabeled']:,} unlabelled texts" if distilled.get("unlabeled") else ""]
    parts = [p for p in parts if p]
    return f"; the teacher also labelled {' and '.join(parts)}" if parts else ""


def nothing_learned_note(floors: dict | None, result: dict) -> str | None:
    """The nothing-learned line when the trial's dev metric is within noise of the dev floor; else None."""
    from autopelt.study.floors import Floors, nothing_learned

    metric = result.get("metric") or ""
    dev = (result.get("dev") or {}).get(metric)
    return nothing_learned(Floors.from_dict(floors), [] if dev is None else [dev], metric or "metric")


def _fmt(values) -> str:
    return ", ".join(f"{k} {v:.4f}" for k, v in (values or {}).items()) or "–"


def _write_json(path: Path, data) -> None:
    path.write_text(json.dumps(data, indent=2, default=str))

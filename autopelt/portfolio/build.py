"""Build a portfolio file from a user's own finished studies (the meta-dataset's pipeline is lab/metalearning/)."""

from __future__ import annotations

import hashlib
import json

from autopelt.errors import UserError
from autopelt.portfolio import select
from autopelt.portfolio.config import Config, rate_text
from autopelt.portfolio.portfolio import CALIBRATION_BASELINE, to_file


def from_studies(storage: str, studies: list[str] | None, size: int, out: str) -> dict:
    """One task per finished study: the configurations (delta, rate, batch, backbone dropout) every study trained
    to full fidelity, chosen greedily on their dev metric; its calibration (portfolio.py) from the studies whose LoRA
    baseline swept its rate (every study, or none: a partial one would skew the reference)."""
    import optuna

    from autopelt.study.info import read_study
    from autopelt.study.record import read_all

    names = studies or [s.study_name for s in optuna.get_all_study_summaries(storage)]
    if len(names) < 2:
        raise UserError(f"{storage} holds {len(names)} study; a portfolio learns from two or more (one per task)")
    scores, found, models, calibration = {}, {}, set(), {}
    for name in names:
        try:
            study = optuna.load_study(study_name=name, storage=storage)
        except KeyError:
            raise UserError(f"no study {name!r} in {storage}") from None
        models.add(read_study(study).model)
        row = {}
        for trial in read_all(study):
            if trial.baseline == CALIBRATION_BASELINE and trial.is_answer and trial.learning_rate \
                    and trial.lr_choice.get("how") == "sweep":
                calibration[name] = trial.learning_rate
            if not trial.full_fidelity or not trial.values or trial.spec is None or not trial.learning_rate:
                continue
            config = _config(trial)
            row[config.name] = max(row.get(config.name, float("-inf")), trial.values[0])
            found[config.name] = config
        scores[name] = row
    common = set.intersection(*(set(row) for row in scores.values()))
    if not common:
        raise UserError("no configuration was trained to full fidelity in every study; run the same portfolio "
                        "(autopelt search --portfolio FILE) on each task first")
    scores = {task: {c: v for c, v in row.items() if c in common} for task, row in scores.items()}
    chosen = select.greedy_portfolio(scores, size)
    model = models.pop() if len(models) == 1 else None
    if model is None:
        raise UserError("the studies were run on different models; build one portfolio per model")
    built_from = {"storage": storage.split("@")[-1], "tasks": list(scores), "selection": "greedy, dev metric"}
    return to_file([found[c] for c in chosen], model, built_from, out,
                   calibration=calibration if set(calibration) == set(scores) else None)


def _config(trial) -> Config:
    """The whole recipe a study's trial trained, named by its content."""
    spec, hparams = trial.spec, trial.hparams or {}
    batch = int(hparams.get("batch_size", 32))
    dropout = str(hparams.get("backbone_dropout", "model"))
    key = hashlib.sha1(json.dumps([spec, batch, dropout], sort_keys=True).encode()).hexdigest()[:6]
    name = f"{trial.summary or 'delta'}@{rate_text(trial.learning_rate)}-b{batch}-{key}"
    return Config(name=name, methods=tuple(spec["methods"]), learning_rate=float(trial.learning_rate),
                  batch_size=batch, pooling=spec.get("pooling", "cls"), backbone_dropout=dropout)

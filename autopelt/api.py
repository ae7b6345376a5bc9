"""autopelt from Python: put a delta on a transformers model, save it, load it; train one; search and export.

    import autopelt

    model = autopelt.apply(model, "lora")          # any AutoModelForSequenceClassification (BERT, RoBERTa)
    ...                                             # train it: your loop, or transformers.Trainer
    autopelt.save(model, "my-delta/")               # delta.json + delta.safetensors
    model = autopelt.load("bert-base-uncased", "my-delta/")   # a fresh base + the delta, ready to predict

    outcome = autopelt.search_delta(task="rte", budget=10)    # the study and its best trial
    autopelt.export_delta(outcome, "best/")
    model = autopelt.load(None, "best/")            # None: the base model the delta was trained on

`apply`/`load`/`save` mirror peft's `get_peft_model`/`PeftModel.from_pretrained`/`save_pretrained`, with one
difference: the model stays the transformers model it was (no wrapper), changed in place. The delta it
carries is remembered on it, so `save` needs no spec. Nothing here imports torch until a function runs.
(`train_delta`/`search_delta`/`export_delta` are not `train`/`search`/`export`: those names are autopelt's
subpackages.)
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Callable

from autopelt.errors import UserError

ATTACHED = "autopelt_delta"  # the attribute on a model that records its delta: {"spec": dict, "metadata": dict}
SAVE_METADATA = ("task", "text_columns", "label_names", "base_model")  # what `autopelt predict` reads beside the spec


class TrialFailed(RuntimeError):
    """`train_delta` ran, but the trial failed (the loss became NaN, out of memory, …); `.result` holds the rest."""

    def __init__(self, result: dict):
        super().__init__(result.get("reason") or "the trial failed")
        self.result = result


# -- a delta on a model -----------------------------------------------------------------------------------


def apply(model, spec, *, seed: int = 0):
    """Add the delta `spec` to `model` in place and return it: every base weight frozen, the delta and the task
    head trainable. `spec`: a preset name ("lora", "unipelt_apl", … see `autopelt methods`), read as the model
    was trained to be read (mean pooling for a sentence-transformers checkpoint: models.own_pooling of
    `model.name_or_path`), or, taken as written, a dict {"methods": [...]}, a JSON string, or a path to a JSON
    file. `seed` draws the delta's initial weights."""
    from autopelt import delta
    from autopelt.delta.presets import PRESETS
    from autopelt.models import read_as_trained

    _check_model(model)
    if getattr(model, ATTACHED, None) is not None:
        raise UserError("this model already carries an autopelt delta; apply a delta to a fresh base model")
    if isinstance(spec, str) and spec in PRESETS:
        name = getattr(model, "name_or_path", None)
        spec = read_as_trained(PRESETS[spec], name) if name else PRESETS[spec]
    parsed = delta.parse_spec(spec)
    delta.apply_delta(model, parsed, seed=seed)
    setattr(model, ATTACHED, {"spec": parsed.to_dict(), "metadata": {}})
    return model


def load(model, path, *, is_trainable: bool = False, merge: bool = False):
    """A model with the saved delta at `path` (an `autopelt export` folder, or a trial's `delta/` folder).

    `model`: a fresh base model (as `from_pretrained` gives it, with a head of the delta's number of labels), a
    hub id or folder to load it from, or None for the base model the delta was trained on. Returned in eval mode
    with every weight frozen; `is_trainable=True` leaves the delta and the head trainable, to train on (a saved
    delta is its inference form: a prefix without its reparameterisation MLP, an AdaMix mixture merged).
    `merge=True` folds LoRA into the base weights, as `autopelt predict` does (inference only)."""
    from autopelt import delta
    from autopelt.models import load_model, resolve_model

    header = delta.read_delta_header(path)
    if model is None or isinstance(model, (str, os.PathLike)):
        name = resolve_model(str(model) if model is not None else header.get("base_model"))
        model = load_model(name, header["num_labels"], header.get("problem_type"))
    else:
        _check_model(model)
        _check_fits_header(model, header, path)
        if getattr(model, ATTACHED, None) is not None:
            raise UserError("this model already carries an autopelt delta; load a delta onto a fresh base model")
    delta.load_delta(model, path)
    metadata = {key: header[key] for key in SAVE_METADATA if header.get(key) is not None}
    setattr(model, ATTACHED, {"spec": header["spec"], "metadata": metadata})
    if merge:
        delta.merge(model)
    if not is_trainable or merge:
        model.requires_grad_(False)
        model.eval()
    return model


def save(model, path, **metadata) -> Path:
    """Write the delta `model` carries to `path` (delta.json + delta.safetensors, each written whole or not at
    all) and return the folder. `metadata` may name what `autopelt predict` needs of the task: `task`,
    `text_columns`, `label_names`, and `base_model` (default: the model's own name or folder)."""
    from autopelt import delta

    attached = getattr(model, ATTACHED, None)
    if attached is None:
        raise UserError("this model carries no autopelt delta; use autopelt.apply(model, spec) or autopelt.load first")
    unknown = sorted(set(metadata) - set(SAVE_METADATA))
    if unknown:
        raise UserError(f"unknown save metadata {unknown[0]!r}; known: {', '.join(SAVE_METADATA)}")
    if any(getattr(module, "merged", False) for module in model.modules()):
        raise UserError("this model's delta is merged into its weights (load(..., merge=True)); save before merging")
    from autopelt.models import portable_name

    base = portable_name(model.config._name_or_path) if getattr(model.config, "_name_or_path", "") else None
    values = {"base_model": base, **attached["metadata"], **metadata}
    return delta.save_delta(model, attached["spec"], path, metadata={k: v for k, v in values.items() if v is not None})


def _check_model(model) -> None:
    from autopelt.delta.sites import architecture_of

    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "get_submodule"):
        raise UserError(f"expected a transformers model, not {type(model).__name__}")
    head = architecture_of(config).head
    if not hasattr(model, head):
        raise UserError(f"{type(model).__name__} has no task head ({head!r}); load the base model with "
                        "AutoModelForSequenceClassification.from_pretrained(..., num_labels=N)")


def _check_fits_header(model, header: dict, path) -> None:
    if header.get("model_type") and header["model_type"] != model.config.model_type:
        raise UserError(f"the delta in {path} is for a {header['model_type']} model, not {model.config.model_type}")
    if header["num_labels"] != model.config.num_labels:
        raise UserError(f"the delta in {path} has a head of {header['num_labels']} labels and this model one of "
                        f"{model.config.num_labels}; load the base with num_labels={header['num_labels']}")


# -- one trial, a search, an export -------------------------------------------------------------------------


def train_delta(task: str, spec, *, k: int | None = None, progress: bool = True, **settings) -> dict:
    """Train and evaluate one delta on a task, as `autopelt train` does; the result (docs/design.md: dev and test
    metrics, parameters, timings, and `delta_dir` when `out_dir` is given; `load(None, result["delta_dir"])`).

    `spec` as for `apply`: a preset's name reads the sequence as the model was trained to be read (mean pooling
    for a sentence-transformers checkpoint, as `autopelt train --preset`), any other spec as written. Without
    `learning_rate` the trial chooses one by a short sweep of rates (as `autopelt train` does without --lr). `k`:
    the low-resource protocol (K training examples). `settings`: any `autopelt.train.TrialSettings` field
    (`model`, `data_dir`, `epochs`, `learning_rate`, `batch_size`, `seed`, `out_dir`, …). `progress` prints a
    line per epoch (a bar on a terminal). Raises UserError for bad input, TrialFailed when training fails."""
    from autopelt import delta
    from autopelt.delta.presets import PRESETS
    from autopelt.train import TrialSettings
    from autopelt.models import read_as_trained
    from autopelt.train.command import check_inputs, with_progress

    if isinstance(spec, str) and spec in PRESETS:  # as `autopelt train --preset` reads it
        spec = read_as_trained(PRESETS[spec], settings.get("model"))
    parsed = delta.parse_spec(spec)
    if k is not None:
        settings["protocol"] = k
    trial = TrialSettings.from_dict({"task": task, "spec": parsed.to_dict(), **settings})
    check_inputs(trial)
    from autopelt.train import run_trial

    result = with_progress(trial, run_trial) if progress else run_trial(trial)
    if result["status"] != "ok":
        raise TrialFailed(result)
    return result


def search_delta(task: str, *, budget: str | int = 20, echo: Callable[[str], None] | None = print, **options):
    """Search for the best delta of a task, as `autopelt search` does (run again to resume), and return its
    outcome: `.study` (the Optuna study), `.best` (the best trial's record, autopelt/study/record.py, or None),
    `.pareto`, ….

    `options`: any `autopelt search` flag by its Python name (`model`, `data_dir`, `space`, `storage`, `k`,
    `epochs`, `max_params`, `multi_objective`, `baselines`, `workers`, `out`, …; see
    `autopelt.search.run.SearchOptions`). `echo` gets the live lines (None: quiet)."""
    import optuna

    from autopelt.search.run import SearchOptions, run_search

    known = {f.name for f in dataclasses.fields(SearchOptions)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise UserError(f"unknown search option {unknown[0]!r}; known: {', '.join(sorted(known - {'task'}))}")
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the live lines say what happens
    try:
        return run_search(SearchOptions(task=task, budget=budget, **options), echo=echo or (lambda line: None))
    finally:
        optuna.logging.set_verbosity(verbosity)


def export_delta(study, path, *, trial: int | None = None, pareto: bool = False, reseed: int = 0,
                 storage: str | None = None) -> Path:
    """Export a study's best delta (or trial number `trial`, or with `pareto` every trial on the Pareto front,
    one sub-folder each) to the new folder `path`, as `autopelt export` does; the folder for `load`.

    `study`: what `search_delta` returned, an Optuna study, or a study's name in `storage` (default: the
    `autopelt search` default, sqlite:///autopelt.db, or $AUTOPELT_STORAGE)."""
    from autopelt.export.export import export_trial, pick_trials, trial_outputs

    study = _study_of(study, storage)
    chosen = pick_trials(study, trial, pareto)
    for one in chosen:
        trial_outputs(one)  # every chosen trial must have its weights before anything is written
    out = Path(path)
    for one in chosen:
        export_trial(one, out / f"trial-{one.number}" if pareto else out, reseed, study.study_name)
    return out


def _study_of(study, storage: str | None):
    if hasattr(study, "study") and hasattr(study, "plan"):  # a SearchOutcome
        return study.study
    if isinstance(study, str):
        from autopelt.study.storage import DEFAULT_STORAGE, load_study, open_existing

        url = storage or os.environ.get("AUTOPELT_STORAGE", DEFAULT_STORAGE)
        return load_study(open_existing(url), study, url)
    if hasattr(study, "get_trials") and hasattr(study, "study_name"):
        return study
    raise UserError(f"export_delta takes a search outcome, an Optuna study or a study name, not {type(study).__name__}")

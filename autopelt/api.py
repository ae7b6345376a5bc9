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
    """`train_delta` ran, but the trial failed (the loss became NaN, out of memory, …).

    Attributes:
        result: the trial's result dict (status, reason, settings, whatever it measured before it failed).
    """

    def __init__(self, result: dict):
        super().__init__(result.get("reason") or "the trial failed")
        self.result = result


# -- a delta on a model -----------------------------------------------------------------------------------


def apply(model, spec, *, seed: int = 0):
    """Add the delta `spec` to `model` in place and return it: every base weight frozen, the delta and the task
    head trainable (peft's `get_peft_model`, without a wrapper).

    Args:
        model: a transformers model with a task head (`AutoModelForSequenceClassification` of a BERT, RoBERTa,
            XLM-R, Llama-family, GPT-2 or T5 model), carrying no autopelt delta yet.
        spec: a preset name ("lora", "unipelt_apl", … see `autopelt methods`), read as the model was trained to be
            read (mean pooling for a sentence-transformers checkpoint: `models.own_pooling` of
            `model.name_or_path`); or, taken as written, a dict `{"methods": [...]}` (docs/design.md), a JSON
            string, or a path to a JSON file.
        seed: draws the delta's initial weights.

    Returns:
        The same `model`, with the delta injected and recorded on it (`model.autopelt_delta`).

    Raises:
        UserError: `model` is not a transformers model with a task head, already carries a delta, or `spec` is
            not a valid delta spec for it.
    """
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
    """A model with the saved delta at `path` (peft's `PeftModel.from_pretrained`, without a wrapper).

    Args:
        model: a fresh base model (as `from_pretrained` gives it, with a head of the delta's number of labels), a
            hub id or folder to load it from, or None for the base model the delta was trained on.
        path: an `autopelt export` folder, a trial's `delta/` folder, or what `save` wrote. An `autopelt export
            --ensemble` folder gives an `autopelt.ensemble.EnsembleModel` (one backbone load; called like a model,
            its logits the log of the members' averaged probabilities).
        is_trainable: leave the delta and the head trainable, to train on (a saved delta is its inference form: a
            prefix without its reparameterisation MLP, an AdaMix mixture merged). Default: eval mode, every
            weight frozen.
        merge: fold LoRA into the base weights, as `autopelt predict` does (inference only; implies frozen).

    Returns:
        The model with the delta loaded and recorded on it, its metadata (task, text columns, label names) kept
        for `save`.

    Raises:
        UserError: `path` holds no readable autopelt delta; the model's type or head size does not fit the delta;
            the model already carries a delta; the base model cannot be loaded (offline and not cached).
    """
    from autopelt import delta
    from autopelt.ensemble.folder import is_ensemble
    from autopelt.models import load_model, resolve_model

    if is_ensemble(path):  # an `autopelt export --ensemble` folder: an EnsembleModel (autopelt/ensemble/model.py)
        return _load_ensemble(model, path, is_trainable, merge)
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


def _load_ensemble(model, path, is_trainable: bool, merge: bool):
    from autopelt.ensemble.model import EnsembleModel

    if is_trainable or merge:
        raise UserError(f"{path} is an ensemble: load it to predict (no is_trainable, no merge)")
    if model is not None and not isinstance(model, (str, os.PathLike)):
        raise UserError(f"{path} is an ensemble: pass its base model as a hub id or folder (or None), not a model")
    return EnsembleModel(path, model)


def save(model, path, **metadata) -> Path:
    """Write the delta `model` carries to `path` (peft's `save_pretrained`): its spec and weights only, never the
    frozen base.

    Args:
        model: a model that `apply` or `load` gave a delta (not merged).
        path: the folder to write; `delta.json` and `delta.safetensors` are each written whole or not at all.
        **metadata: what `autopelt predict` needs of the task: `task`, `text_columns`, `label_names`, and
            `base_model` (default: the model's own name or folder). Values recorded by `load` are kept unless
            given again.

    Returns:
        The folder written, for `load` or `autopelt predict --delta`.

    Raises:
        UserError: the model carries no delta, its LoRA is merged, or a metadata key is not one of the above.
    """
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
    from autopelt.delta.families import architecture_of

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
    """Train and evaluate one delta on a task, as `autopelt train` does.

    Args:
        task: a GLUE task name (`sst2`, `rte`, …) or your own task's name (with `data_dir` or `custom_task`).
        spec: as for `apply`: a preset's name reads the sequence as the model was trained to be read (as
            `autopelt train --preset`), any other spec as written.
        k: the low-resource protocol, K training examples (None: the full train split).
        progress: print a line per epoch (a bar on a terminal).
        **settings: any `autopelt.train.TrialSettings` field (`model`, `data_dir`, `epochs`, `learning_rate`,
            `batch_size`, `seed`, `out_dir`, …). Without `learning_rate` the trial chooses one by a short sweep
            of rates (as `autopelt train` does without --lr).

    Returns:
        The trial's result dict (docs/design.md): dev and test metrics, parameter counts, timings,
        the learning rate and how it was chosen, and `delta_dir` when `out_dir` is given
        (`load(None, result["delta_dir"])`).

    Raises:
        UserError: bad input (an unknown task or setting, a missing data folder, an unreadable spec), before any
            training.
        TrialFailed: training ran and failed (the loss became NaN, out of memory, …).
    """
    from autopelt import delta
    from autopelt.delta.presets import PRESETS
    from autopelt.train import TrialSettings
    from autopelt.models import read_as_trained
    from autopelt.train.checks import check_inputs
    from autopelt.train.progress import with_progress

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
    """Search for the best delta of a task, as `autopelt search` does; the same call again resumes the study.

    Args:
        task: a GLUE task name or your own task's name (as `autopelt search --task`).
        budget: trials over the whole study (`20`), or a wall time for this run (`"90s"`, `"30m"`, `"2h"`).
        echo: receives each live line the CLI would print (None: quiet).
        **options: any `autopelt search` flag by its Python name (`model`, `data_dir`, `space`, `storage`,
            `study_name`, `k`, `epochs`, `max_params`, `multi_objective`, `baselines`, `workers`, `out`, …; see
            `autopelt.search.run.SearchOptions`).

    Returns:
        The search's outcome: `.study` (the Optuna study), `.best` (the answer trial's record,
        autopelt/study/record.py, or None), `.ensemble` (the ensemble of its finished trials,
        autopelt/ensemble/study.py, or None; `.answers` where it answers instead), `.pareto` (multi-objective
        studies), `.seconds`, ….

    Raises:
        UserError: an unknown option or bad input (no data offline, a bad space), before any trial runs.
        autopelt.search.controller.SearchStopped: the search cannot go on (every trial failing, every delta over
            `max_params`).
    """
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
    """Export a study's answer to a new folder, as `autopelt export` does: the delta, a model card and, when
    peft can hold the delta, a `peft/` folder.

    Args:
        study: what `search_delta` returned, an Optuna study, or a study's name in `storage`.
        path: the folder to write: a new or empty one.
        trial: export this trial number instead of the study's answer.
        pareto: export every trial on the Pareto front, one `trial-N` sub-folder each.
        reseed: train the exported delta again with this many seeds and record mean ± std.
        storage: where a study named by its name lives (default: $AUTOPELT_STORAGE, else the `autopelt search`
            default, sqlite:///autopelt.db).

    Returns:
        `path`, the folder for `load` or `autopelt predict --delta`.

    Raises:
        UserError: no such study or trial, no completed trial to export, a trial without saved weights, or `path`
            exists and is not empty.
    """
    from autopelt.export.export import ensemble_beside, export_trial, pick_trials, trial_outputs

    study = _study_of(study, storage)
    chosen = pick_trials(study, trial, pareto)
    for one in chosen:
        trial_outputs(one)  # every chosen trial must have its weights before anything is written
    out = Path(path)
    beside = ensemble_beside(study) if trial is None and not pareto else None
    for one in chosen:
        export_trial(one, out / f"trial-{one.number}" if pareto else out, reseed, study.study_name, ensemble=beside)
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

"""A finished trial scored again from its saved delta: test scores (what a search trial, trained with
`score_test` off, would have scored) and test predictions (what an ensemble's test metric is computed from), with
the trial's own settings, precision and attention. Several trials of one base model are scored on one backbone
read from disk (`test_predictions_of`): each gets a copy of it with its own delta."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

from autopelt import delta
from autopelt.dtypes import settle_dtypes
from autopelt.errors import UserError
from autopelt.models import load_model, load_tokenizer, resolve_model
from autopelt.train import backbone, device as devices
from autopelt.train.classify import evaluate, forward_split
from autopelt.train.generate import is_generation
from autopelt.train.predictions import from_outputs, load as load_predictions, save as save_predictions
from autopelt.train.settings import TrialSettings
from autopelt.train.trial import RESULT_FILE
from autopelt.train.trial_data import prepare_data, resolve_task


def score_saved(result: dict) -> tuple[dict, dict]:
    """(test, extra_tests) of a finished trial scored from its saved delta (`result["delta_dir"]`) with the
    trial's own settings: what a search trial (TrialSettings.score_test False) would have scored after training.
    Raises UserError when the trial kept no delta."""
    settings = TrialSettings.from_dict(result["settings"])
    if is_generation(settings):
        from autopelt.train.generation_trial import score_saved_generation

        return score_saved_generation(settings, _delta_dir(result, settings)), {}
    model, data, task, device, dtype = _saved_model(result, settings)
    test, _ = evaluate(model, data.test, task, settings, device, dtype)
    extra = {split: evaluate(model, features, task, settings, device, dtype)[0]
             for split, features in data.extra_tests.items()}
    return test, extra


def test_predictions(result_dir) -> dict:
    """{"test", "test_labels"} of a finished classification trial (`test_predictions_of` for one trial)."""
    return test_predictions_of([result_dir])[0]


def test_predictions_of(result_dirs: list) -> list[dict]:
    """{"test", "test_labels"} of each finished classification trial, in `result_dirs`' order: from its
    predictions.npz where it scored test as it trained, else computed once from its saved delta (one forward pass
    over the test split) and kept there beside its dev predictions. The trials computed share one base model load
    a (base model, precision, label set): an ensemble's members are scored on one backbone read, not one each.
    What an ensemble's test metric is computed from, never read by any choice.

    Raises:
        UserError: a trial kept no predictions or no delta.
    """
    kept = [load_predictions(folder) for folder in result_dirs]
    out: list[dict | None] = [_test_of(k) for k in kept]
    bases: dict[tuple, torch.nn.Module] = {}
    for index, folder in enumerate(result_dirs):
        if out[index] is not None:
            continue
        result = json.loads((Path(folder) / RESULT_FILE).read_text())
        settings = TrialSettings.from_dict(result["settings"])
        key = _base_key(result, settings)
        if key not in bases and not settings.quantize:  # a 4-bit base is loaded for each (not deep-copied)
            bases[key] = _base_model(result, settings)
        model, data, task, device, dtype = _saved_model(result, settings, base=bases.get(key))
        outputs = forward_split(model, data.test, settings, device, dtype)
        del model
        out[index] = {"test": from_outputs(outputs, task.regression), "test_labels": data.test.labels}
        save_predictions(folder, {**kept[index], **out[index]})
    return out


def kept_test_predictions(result_dir) -> dict | None:
    """{"test", "test_labels"} where the trial's predictions.npz holds them, else None (nothing is computed).
    Raises UserError when the trial kept no predictions."""
    return _test_of(load_predictions(result_dir))


def _test_of(kept: dict) -> dict | None:
    return {"test": kept["test"], "test_labels": kept["test_labels"]} if "test" in kept and "test_labels" in kept \
        else None


def _delta_dir(result: dict, settings: TrialSettings) -> str:
    delta_dir = result.get("delta_dir")
    if not delta_dir or not (Path(delta_dir) / "delta.json").is_file():
        raise UserError(f"the trial in {settings.out_dir} kept no delta to score; train it again with test scored")
    return delta_dir


def _precision(result: dict, settings: TrialSettings) -> str:
    return result.get("precision") or devices.resolve_precision(settings.precision, devices.pick_device(
        settings.device))


def _base_key(result: dict, settings: TrialSettings) -> tuple:
    """What the base model a trial's delta goes on depends on: its name, the dtype its frozen weights are read in,
    the task's label set (its head's size and problem type)."""
    task = resolve_task(settings)
    return (resolve_model(settings.model), devices.load_dtype(_precision(result, settings)), task.num_labels,
            task.problem_type)


def _base_model(result: dict, settings: TrialSettings) -> torch.nn.Module:
    """The base model as the trial loaded it (its head is replaced by the saved delta's)."""
    task = resolve_task(settings)
    return load_model(resolve_model(settings.model), task.num_labels, task.problem_type, seed=settings.seed,
                      dtype=devices.load_dtype(_precision(result, settings)), quantize=settings.quantize,
                      device=devices.pick_device(settings.device) if settings.quantize else None)


def _saved_model(result: dict, settings: TrialSettings, base: torch.nn.Module | None = None):
    """(model with its saved delta, the trial's data, task, device, autocast dtype), as the trial trained. `base`:
    a loaded base model (`_base_model`) to copy instead of reading one from disk."""
    delta_dir = _delta_dir(result, settings)
    task = resolve_task(settings)
    model_name = resolve_model(settings.model)
    if settings.threads:
        torch.set_num_threads(settings.threads)
    device = devices.pick_device(settings.device)
    data = prepare_data(settings, load_tokenizer(model_name), task)
    dtype = devices.autocast_dtype(_precision(result, settings))
    model = copy.deepcopy(base) if base is not None else _base_model(result, settings)
    if result.get("attention"):
        backbone.set_attention(model, result["attention"])
    delta.load_delta(model, delta_dir, seed=settings.seed)
    model.to(device)
    settle_dtypes(model, dtype)
    return model, data, task, device, dtype

"""Checks a trial's inputs before any training: what would fail every trial is one line (UserError) instead."""

from __future__ import annotations

import os

from autopelt.errors import UserError


def check_inputs(settings):
    """Fail in one line, before any training, on inputs that cannot work: the task, protocol, model folder and its
    tokenizer, and the data as the trial will read it (`autopelt.data.check`). Returns the data's DataCheck (None for
    a generation task)."""
    from autopelt.data import parse_protocol
    from autopelt.data.check import check_task_data
    from autopelt.data.loading import DATA_DIR_ENV, check_hub_data
    from autopelt.models import check_model_folder, load_tokenizer, resolve_model
    from autopelt.train.trial_data import resolve_task

    task = resolve_task(settings)
    parse_protocol(settings.protocol)
    model = resolve_model(settings.model)
    if settings.gradient_checkpointing:
        _check_checkpointing(settings)
    if settings.quantize:
        _check_quantize(settings, model)
    if settings.custom_task and settings.custom_task.get("target_column"):  # a generation task: torch is needed
        from autopelt.train.generate import check_generation_inputs

        check_generation_inputs(settings, task)
        _check_fits(settings, model)
        return None
    if settings.data_dir and not os.path.isdir(settings.data_dir):
        raise UserError(f"--data-dir {settings.data_dir} is not a folder")
    if not (task.files or settings.data_dir or os.environ.get(DATA_DIR_ENV)):
        check_hub_data(task)  # offline: this one line, not a failed trial after seconds of imports
    check_model_folder(model)
    load_tokenizer(model)
    _check_fits(settings, model)
    return check_task_data(task, settings.data_dir, settings.protocol, seed=settings.split_seed,
                           dev_size=settings.dev_size)


def _check_fits(settings, model: str) -> None:
    """The delta fits the model's family (a method its family cannot take, a site or layer it lacks): one line now,
    not a failed trial."""
    from autopelt.delta.inject import check_fits
    from autopelt.delta.spec import parse_spec
    from autopelt.models import load_config

    check_fits(parse_spec(settings.spec), load_config(model, 2))


def _check_checkpointing(settings) -> None:
    from autopelt.models import load_config, resolve_model
    from autopelt.train.backbone import checkpointing_refusal

    reason = checkpointing_refusal(load_config(resolve_model(settings.model), 2), settings.spec)
    if reason:
        raise UserError(reason)


def _check_quantize(settings, model: str) -> None:
    """--quantize 4bit where it cannot run (autopelt/quantize.py): one line before the model loads."""
    from autopelt.models import load_config
    from autopelt.quantize import check
    from autopelt.train.device import pick_device

    if settings.quantize:
        check(settings, settings.spec, load_config(model, 2), pick_device(settings.device))

"""Warm workers: a process holds the base model and a trial's tokenised rows between trials on the same model and
data (a search's Ray workers are reused between trials) instead of loading them for every trial.

Each trial gets a model of its own: a copy of the held one whose parameters share the held tensors (only the
modules are copied), with a fresh head from the trial's seed (`models.fresh_head`). Before it trains, every
parameter it trains that still shares the held storage (BitFit's biases, a LayerNorm) gets storage of its own
(`BaseModel.own_trainable`), so the held model stays as loaded; what a trial changes in the structure (injected
modules, hooks, attention, dropout, gradient checkpointing) lives in its copy alone. The global random state is set
to what a load with the trial's seed leaves (the load's draws replayed, `draws.py`): a warm trial is bit-identical
to a cold one.

One model and one trial's data are held (memory), each under a key of everything that changes it; another key
loads anew and replaces what is held. `AUTOPELT_WARM=0` turns holding off: every trial loads, as before.
"""

from __future__ import annotations

import copy
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from autopelt.data.loading import DATA_DIR_ENV
from autopelt.models import fresh_head, load_language_model, load_model, load_tokenizer
from autopelt.train.draws import Draws, replayed
from autopelt.train.trial_data import TrialData, prepare_data

WARM_ENV = "AUTOPELT_WARM"
_LOCK = threading.RLock()
_HELD: dict[str, object] = {}  # "model": _Held, "data": (key, TrialData), "tokenizer": (key, tokenizer)


def enabled() -> bool:
    """Whether this process holds models and data between trials: unless $AUTOPELT_WARM is 0, off, false or no."""
    return os.environ.get(WARM_ENV, "1").strip().lower() not in ("0", "off", "false", "no")


def forget() -> None:
    """Let go of everything held (the next trial loads)."""
    with _LOCK:
        _HELD.clear()


@dataclass
class BaseModel:
    """A trial's own base model, `warm` when it was copied from a held one rather than loaded for this trial."""
    model: nn.Module
    warm: bool
    shared: frozenset = frozenset()  # storage addresses of the held tensors the copy's parameters share

    def own_trainable(self) -> int:
        """Give every trainable parameter that shares a held tensor's storage a copy of its own (call it after the
        delta is in, before training); how many were given one."""
        owned = 0
        with torch.no_grad():
            for param in self.model.parameters():
                if param.requires_grad and param.untyped_storage().data_ptr() in self.shared:
                    param.data = param.data.clone()
                    owned += 1
        return owned


def classifier(model_name: str, num_labels: int, problem_type: str | None, seed: int, dtype,
               quantize: str | None = None, device=None) -> BaseModel:
    """`models.load_model(model_name, num_labels, problem_type, seed, dtype, quantize, device)` for a trial, the
    global random state left as that load leaves it; from the held model where one is held under the same key. A
    4-bit (`quantize`) model is loaded for every trial: its weights live on the GPU in bitsandbytes' own tensors."""
    if not enabled() or quantize:
        return BaseModel(load_model(model_name, num_labels, problem_type, seed=seed, dtype=dtype, quantize=quantize,
                                    device=device), warm=False)
    key = ("classifier", model_name, _model_stamp(model_name), num_labels, problem_type, str(dtype))
    return _base(key, seed, lambda info: load_model(model_name, num_labels, problem_type, seed=seed, dtype=dtype,
                                                    info=info))


def language_model(model_name: str, seed: int, dtype, quantize: str | None = None, device=None) -> BaseModel:
    """`models.load_language_model(model_name, seed, dtype, quantize, device)` for a trial, as `classifier` does
    it."""
    if not enabled() or quantize:
        return BaseModel(load_language_model(model_name, seed=seed, dtype=dtype, quantize=quantize, device=device),
                         warm=False)
    key = ("language model", model_name, _model_stamp(model_name), str(dtype))
    return _base(key, seed, lambda info: load_language_model(model_name, seed=seed, dtype=dtype, info=info))


def _base(key: tuple, seed: int, load) -> BaseModel:
    with _LOCK:
        held = _HELD.get("model")
        if isinstance(held, _Held) and held.serves(key, seed):
            return held.copy(seed, warm=True)
        _HELD.pop("model", None)  # let it go before another loads
        info: dict = {}
        with Draws() as draws:
            model = load(info)
        held = _Held(key, model, seed, {seed: torch.get_rng_state()}, draws.ops if draws.replayable else None)
        held.seed_bound = not _seed_free(model, info)
        _HELD["model"] = held
        return held.copy(seed, warm=False)


@dataclass
class _Held:
    """A loaded model, never trained, and how to put the global random state where its load left it."""
    key: tuple
    model: nn.Module
    seed: int  # the seed it was loaded with
    states: dict[int, torch.Tensor]  # seed -> the global CPU generator's state after a load with that seed
    draws: list | None  # the load's draws from the global generator (Draws.ops); None: they cannot be replayed
    seed_bound: bool = False  # a tensor of it was initialised from the seed, not read: it serves that seed only
    checked: bool = False  # whether replaying `draws` was found to give the load's own state

    def serves(self, key: tuple, seed: int) -> bool:
        if key != self.key or (self.seed_bound and seed != self.seed):
            return False
        return seed in self.states or self._replayable()

    def _replayable(self) -> bool:
        if self.draws is not None and not self.checked:
            self.checked = True
            if not torch.equal(replayed(self.draws, self.seed), self.states[self.seed]):
                self.draws = None
        return self.draws is not None

    def copy(self, seed: int, warm: bool) -> BaseModel:
        """A model of the trial's own (its head fresh from `seed`, on a classifier) with the global random state as
        a load with `seed` leaves it."""
        memo = {}
        for param in self.model.parameters():
            twin = nn.Parameter(param.data, requires_grad=param.requires_grad)  # the same storage
            twin.__dict__.update(param.__dict__)
            memo[id(param)] = twin
        model = copy.deepcopy(self.model, memo)
        shared = frozenset(p.untyped_storage().data_ptr() for p in self.model.parameters())
        head = _head_parts(model)
        if head:
            with torch.no_grad():
                for param in (p for part in head for p in model.get_submodule(part).parameters()):
                    param.data = param.data.clone()
            fresh_head(model, seed)
        if seed not in self.states:
            self.states[seed] = replayed(self.draws, seed)
        torch.manual_seed(seed)  # as the load does (the CUDA generators too), then its draws
        torch.set_rng_state(self.states[seed])
        return BaseModel(model, warm, shared)


def _head_parts(model: nn.Module) -> tuple[str, ...]:
    """The task head's modules of a sequence classifier; none on a language model (its head is frozen base)."""
    from autopelt.delta.families import architecture_of

    parts = architecture_of(model.config).head_parts
    return tuple(parts) if getattr(model, architecture_of(model.config).head, None) is not None else ()


def _seed_free(model: nn.Module, info: dict) -> bool:
    """Whether everything the load initialised rather than read (missing or mis-sized in the checkpoint) is drawn
    again per trial (`fresh_head`: the head's linear layers); else the held tensors depend on the seed."""
    head = _head_parts(model)
    keys = set(info.get("missing_keys") or ()) | {entry[0] for entry in info.get("mismatched_keys") or ()}
    for key in keys:
        owner = key.rpartition(".")[0]
        if not any(owner == part or owner.startswith(part + ".") for part in head):
            return False
        if not isinstance(model.get_submodule(owner), nn.Linear):
            return False
    return True


def trial_data(settings, model_name: str, task) -> tuple[TrialData, bool]:
    """`trial_data.prepare_data` of the settings with `model_name`'s tokenizer, and whether it was held."""
    if not enabled():
        return prepare_data(settings, load_tokenizer(model_name), task), False
    key = _data_key(settings, model_name, task)
    with _LOCK:
        held = _HELD.get("data")
        if held is not None and held[0] == key:
            return held[1], True
        _HELD.pop("data", None)
    data = prepare_data(settings, tokenizer(model_name), task)
    with _LOCK:
        _HELD["data"] = (key, data)
    return data, False


def tokenizer(model_name: str):
    """`models.load_tokenizer(model_name)`, held between trials (when holding is on)."""
    if not enabled():
        return load_tokenizer(model_name)
    key = (model_name, _model_stamp(model_name))
    with _LOCK:
        held = _HELD.get("tokenizer")
        if held is None or held[0] != key:
            held = _HELD["tokenizer"] = (key, load_tokenizer(model_name))
        return held[1]


_DATA_FIELDS = ("task", "custom_task", "data_dir", "protocol", "dev_size", "max_train_examples", "max_length",
                "distill")


def _data_key(settings, model_name: str, task) -> tuple:
    """Everything a trial's data is made from: the settings that choose and tokenise its rows, the tokenizer, and
    the files read (their sizes and modification times)."""
    chosen = json.dumps({name: getattr(settings, name) for name in _DATA_FIELDS}, sort_keys=True, default=str)
    data_dir = settings.data_dir or os.environ.get(DATA_DIR_ENV)
    files = [Path(path) for _, path in task.files] if task.files else \
        [Path(data_dir).expanduser() / task.dataset] if data_dir else []
    if settings.distill:
        files.append(Path(settings.distill["targets"]))
    return (chosen, settings.split_seed, data_dir, model_name, _model_stamp(model_name), _stamp(files))


def _model_stamp(model_name: str) -> tuple:
    folder = Path(model_name).expanduser()
    return _stamp([folder]) if folder.is_dir() else ()


def _stamp(paths) -> tuple:
    """(path, size, modification time) of each file, a folder's files for a folder."""
    found = []
    for path in paths:
        files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
        for file in files:
            try:
                stat = file.stat()
            except OSError:
                continue
            found.append((str(file), stat.st_size, stat.st_mtime_ns))
    return tuple(found)

"""Declarative search spaces: a YAML file says which deltas a study may try; `sample` draws one per trial.

A file (see autopelt/search_spaces/default.yaml) has five sections:

    methods:   method -> fields (the delta spec's: `autopelt methods` lists them). A field is a fixed value or a
               distribution:
               {choice: [a, b]}; {choice: {a: {fields that exist only when a is chosen}, b: {}}};
               {int: [low, high], step: 2} or {int: [low, high], log: true}; {float: [low, high], log: true}
    combine:   {max_methods: k}: each method switched on or off (parameters use.<method>), at most k on;
               or {combinations: {name: [methods]}}: one categorical parameter `methods`
    shared:    gate / layers, drawn once and given to every chosen method that has the field and leaves it unset
    head:      pooling (cls or mean): what the task head reads, a field of the spec beside its methods (optional)
    train:     learning_rate (required), epochs, batch_size, weight_decay, warmup_ratio, grad_clip, max_length

Parameter names are <method>.<field> (lora.rank, adapter.n, adamix.delta, adamix.lora.rank), use.<method>,
methods, gate, layers, pooling and the train fields. A spec is never empty.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autopelt.delta.spec import DeltaSpec
from autopelt.errors import UserError
from autopelt.train.settings import TrialSettings
from autopelt.search.space_schema import HEAD_FIELDS, TRAIN_FIELDS, layer_indices, method_fields, nested_field
from autopelt.search.space_tree import (Choice, Fixed, Parser, SpaceError, Tree, draw, draw_fields, free_mixtures,
                                        read_yaml)

SPACES_DIR = Path(__file__).resolve().parents[1] / "search_spaces"
# what a baseline trains with for a training field a space may draw (batch_size, weight_decay, ...): the defaults
# (search/baselines.py sets only the rate and the epochs)
BASELINE_TRAINING = {f.name: f.default for f in dataclasses.fields(TrialSettings)
                     if f.name in TRAIN_FIELDS and f.name not in ("learning_rate", "epochs")}
FORMAT_VERSION = 1  # part of the fingerprint: bump when the meaning of a file changes
# what a spec that leaves out a head field means: the spec's own default
DEFAULT_HEAD = {name: DeltaSpec.__dataclass_fields__[name].default for name in HEAD_FIELDS}


@dataclass(frozen=True)
class SearchSpace:
    name: str
    path: Path
    tree: Tree
    fingerprint: str  # hash of the parsed content: equal files (comments, key order aside) sample alike
    param_names: tuple[str, ...]  # every Optuna parameter this space can draw

    @property
    def methods(self) -> tuple[str, ...]:
        return tuple(self.tree.methods)

    def sample(self, trial, num_layers: int) -> tuple[dict, dict]:
        """(delta spec, training hyper-parameters) drawn define-by-run on an Optuna trial."""
        if not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"num_layers must be a positive integer, got {num_layers!r}")
        chosen = self._choose(trial)
        entries = [self._entry(method, chosen, trial) for method in chosen]
        self._share(entries, trial)
        self._place(entries, num_layers)
        head = {name: value for name, value in draw_fields(self.tree.head, trial).items()
                if value != DEFAULT_HEAD.get(name)}  # a spec leaves its defaults out
        return _plain({"methods": entries, **head}), _plain(draw_fields(self.tree.train, trial))

    def pinned(self, **train: Any) -> SearchSpace:
        """This space with the given training fields fixed (`--batch-size 16`: batch_size is no longer drawn, so
        the sampler spends no trials on it); None values leave a field as the file says. The fingerprint is the
        file's."""
        given = {name: value for name, value in train.items() if value is not None}
        if not given:
            return self
        fields = {**self.tree.train, **{name: Fixed(value) for name, value in given.items()}}
        names = tuple(n for n in self.param_names if n not in given)
        return dataclasses.replace(self, tree=dataclasses.replace(self.tree, train=fields), param_names=names)

    def poolings(self) -> tuple[str, ...] | None:
        """What the task head may read in this space's deltas (`head: pooling`); None when the space does not say."""
        node = self.tree.head.get("pooling")
        if node is None:
            return None
        return (node.value,) if isinstance(node, Fixed) else tuple(o.value for o in node.options)

    def params_for(self, spec: dict, num_layers: int) -> dict | None:
        """The parameters with which this space draws `spec` (as Optuna would record them), or None when it cannot
        draw it. The study's baselines are queued with these, so the sampler learns from them like any trial."""
        from autopelt.delta import parse_spec

        wanted = parse_spec(spec).to_dict()
        for combination in self._combinations():
            replay = _Replay(wanted, combination, num_layers)
            try:
                drawn, _ = self.sample(replay, num_layers)
            except (_NotDrawable, UserError):
                continue
            if _unordered(parse_spec(drawn).to_dict()) == _unordered(wanted):
                return replay.params
        return None

    def _combinations(self) -> list[str | None]:
        return [o.label for o in self.tree.combine.options] if isinstance(self.tree.combine, Choice) else [None]

    def _choose(self, trial) -> list[str]:
        if isinstance(self.tree.combine, Choice):
            return list(draw(self.tree.combine, trial)[0])
        return self._switch(trial, self.tree.combine)

    def _switch(self, trial, most: int) -> list[str]:
        """Methods switched on in a fixed order; once `most` are on the rest stay off; never none."""
        names, chosen = self.methods, []
        for i, method in enumerate(names):
            if len(chosen) == most:
                break
            nested = nested_field(method)
            if nested and not free_mixtures(self.tree.methods[method][nested], chosen):
                continue
            if (i == len(names) - 1 and not chosen) or trial.suggest_categorical(f"use.{method}", [False, True]):
                chosen.append(method)
        return chosen

    def _entry(self, method: str, chosen: list[str], trial) -> dict:
        fields, nested = self.tree.methods[method], nested_field(method)
        if nested:  # a mixture mixes only families the spec does not hold yet
            free = free_mixtures(fields[nested], chosen)
            fields = {**fields, nested: dataclasses.replace(fields[nested], options=free)}
        return {"method": method, **draw_fields(fields, trial)}

    def _share(self, entries: list[dict], trial) -> None:
        for name, node in self.tree.shared.items():
            takers = [e for e in entries if name in method_fields(e["method"]) and name not in e]
            if takers:
                value, _ = draw(node, trial)
                for entry in takers:
                    entry[name] = value

    def _place(self, entries: list[dict], num_layers: int) -> None:
        for entry in entries:
            nested = nested_field(entry["method"])
            for target in (entry, entry.get(nested) if nested else None):
                if isinstance(target, dict) and "layers" in target:
                    try:
                        target["layers"] = layer_indices(target["layers"], num_layers)
                    except ValueError as error:
                        raise UserError(f"{self.path}: {entry['method']}.layers: {error}") from None


def _unordered(spec: dict) -> dict:
    """A spec with its entries in a fixed order (the order of entries never changes the delta: inject.py)."""
    return {**spec, "methods": sorted(spec["methods"], key=lambda entry: entry["method"])}


class _NotDrawable(Exception):
    pass


class _Replay:
    """An Optuna-like trial that answers each draw with the value a given spec holds, and each training field
    with what a baseline trains with (for `params_for`)."""

    def __init__(self, spec: dict, combination: str | None, num_layers: int):
        self.entries = {entry["method"]: entry for entry in spec["methods"]}
        self.head = {name: spec.get(name, default) for name, default in DEFAULT_HEAD.items()}
        self.combination, self.num_layers, self.params = combination, num_layers, {}

    def suggest_categorical(self, name: str, labels: list):
        wanted = self._wanted(name, labels)
        match = next((label for label in labels if label == wanted or str(label) == str(wanted)), _NotDrawable)
        if match is _NotDrawable:
            raise _NotDrawable(name)
        self.params[name] = match
        return match

    def suggest_int(self, name: str, low: int, high: int, step: int = 1, log: bool = False) -> int:
        return self._number(name, low, high)

    def suggest_float(self, name: str, low: float, high: float, step=None, log: bool = False) -> float:
        return self._number(name, low, high)

    def _number(self, name: str, low, high):
        if name == "lr_scale":
            value = 1.0
        else:
            value = BASELINE_TRAINING[name] if name in BASELINE_TRAINING else self._field(name)
        if not isinstance(value, (int, float)) or not low <= value <= high:
            raise _NotDrawable(name)
        self.params[name] = value
        return value

    def _wanted(self, name: str, labels: list):
        if name in BASELINE_TRAINING:
            return BASELINE_TRAINING[name]
        if name in self.head:
            return self.head[name]
        if name == "methods":
            return self.combination
        if name.startswith("use."):
            return name[4:] in self.entries
        if name == "gate":
            return next((e["gate"] for e in self.entries.values() if "gate" in e), False)
        if name.split(".")[-1] == "layers":
            layers = self._field(name) if "." in name else next(
                (e["layers"] for e in self.entries.values() if "layers" in e), None)
            return next((label for label in labels if layer_indices(label, self.num_layers) == layers), None)
        value = self._field(name)
        return "+".join(value) if isinstance(value, list) else value

    def _field(self, name: str):
        """`lora.rank` -> the lora entry's rank; `adapter.n`; `adamix.delta` -> its inner method;
        `adamix.lora.rank` -> the rank of adamix's inner lora."""
        method, *path = name.split(".")
        entry = self.entries.get(method)
        if entry is None:
            raise _NotDrawable(name)
        nested = nested_field(method)
        if nested and len(path) > 1 and path[0] != nested:  # a mixture's own delta's field
            entry, path = entry[nested], path[1:]
        value = entry.get(path[-1]) if path else None
        return value["method"] if isinstance(value, dict) and "method" in value else value


def available_spaces() -> list[str]:
    return sorted(p.stem for p in SPACES_DIR.glob("*.yaml"))


def load_space(name_or_path: str | Path) -> SearchSpace:
    """A bare name (`default`) is a file of autopelt/search_spaces/; anything else is a path to a YAML file."""
    path = _resolve(name_or_path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise UserError(f"cannot read search space {path}: {error}") from None
    parser = Parser()
    try:
        tree = parser.tree(read_yaml(text))
    except SpaceError as error:
        raise UserError(f"{path}: {error}") from None
    names = tuple(sorted(set(parser.names) | _switch_names(tree)))
    return SearchSpace(path.stem, path, tree, _fingerprint(tree), names)


def _resolve(name_or_path: str | Path) -> Path:
    text = str(name_or_path)
    if isinstance(name_or_path, Path) or "/" in text or text.endswith((".yaml", ".yml")):
        if not Path(text).is_file():
            raise UserError(f"search space file {text} does not exist")
        return Path(text)
    path = SPACES_DIR / f"{text}.yaml"
    if not path.is_file():
        raise UserError(f"unknown search space {text!r}; available: {', '.join(available_spaces())} "
                        f"(or give the path of a .yaml file)")
    return path


def _switch_names(tree: Tree) -> set[str]:
    """use.<method> parameters; with max_methods 1 the last switch is never asked (all off forces it on)."""
    if isinstance(tree.combine, Choice) or len(tree.methods) == 1:
        return set()
    asked = list(tree.methods)[:-1] if tree.combine == 1 else list(tree.methods)
    return {f"use.{m}" for m in asked}


def _fingerprint(tree: Tree) -> str:
    tree_data = dataclasses.asdict(tree)
    if not tree.head:  # a space without a head section hashes as before the section existed
        del tree_data["head"]
    content = json.dumps({"format": FORMAT_VERSION, "tree": tree_data}, sort_keys=True)
    return hashlib.sha256(content.encode()).hexdigest()[:12]


def _plain(value: Any) -> Any:
    """JSON-plain data (tuples become lists), fresh for every trial."""
    return json.loads(json.dumps(value))

"""A search-space file read into a tree of parameter nodes, and how one node is drawn on an Optuna trial.

Parsing checks everything it can, so a bad file fails at load time with a `SpaceError` naming its key;
`space.load_space` adds the file name and turns it into a one-line `UserError`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Union

import yaml

from autopelt.delta.fields import NESTED_DELTA, Kind
from autopelt.delta.registry import sizes
from autopelt.search.space_schema import (
    HEAD_FIELDS, TRAIN_FIELDS, TRAIN_REQUIRED, field_default, method_fields, method_names, mixed_fields, mixed_methods,
    nested_field, preset_fields, required_fields, shared_fields,
)

TOP_KEYS = ("methods", "combine", "shared", "head", "train")


class SpaceError(Exception):
    """A problem at `key`, a dotted path into the file (`methods.lora.rank`)."""

    def __init__(self, key: str, problem: str):
        super().__init__(f"{key}: {problem}")


@dataclass(frozen=True)
class Fixed:
    value: Any


@dataclass(frozen=True)
class Option:
    label: Any  # what Optuna records: a scalar; a list value is recorded as "a+b"
    value: Any  # what the spec gets
    branch: dict = field(default_factory=dict)  # fields that exist only when this option is chosen


@dataclass(frozen=True)
class Choice:
    name: str
    options: tuple[Option, ...]
    nested: bool = False  # the option is a mixed delta: its branch becomes a nested entry, not more fields


@dataclass(frozen=True)
class Range:
    name: str
    integer: bool
    low: float
    high: float
    step: float | None
    log: bool


Node = Union[Fixed, Choice, Range]


@dataclass(frozen=True)
class Tree:
    methods: dict[str, dict[str, Node]]  # in the spec's method order; each field dict in the spec's field order
    combine: int | Choice  # most methods switched on at once (use.<method>), or a categorical over combinations
    shared: dict[str, Node]
    train: dict[str, Node]
    head: dict[str, Node] = field(default_factory=dict)  # the spec's fields beside its methods (pooling)


def draw(node: Node, trial) -> tuple[Any, dict]:
    """The value of one node on `trial`, and the fields its chosen option brings along."""
    if isinstance(node, Fixed):
        return node.value, {}
    if isinstance(node, Range):
        suggest = trial.suggest_int if node.integer else trial.suggest_float
        return suggest(node.name, node.low, node.high, step=node.step, log=node.log), {}
    labels = [o.label for o in node.options]
    label = labels[0] if len(labels) == 1 else trial.suggest_categorical(node.name, labels)
    option = node.options[labels.index(label)]
    return option.value, option.branch


def draw_fields(fields: dict[str, Node], trial) -> dict:
    out: dict[str, Any] = {}
    for key, node in fields.items():
        value, branch = draw(node, trial)
        inner = draw_fields(branch, trial)
        if isinstance(node, Choice) and node.nested:
            out[key] = {"method": value, **inner}
        else:
            out[key] = value
            out.update(inner)
    return out


def free_mixtures(delta: Choice, chosen: list[str] | tuple[str, ...]) -> tuple[Option, ...]:
    """A mixture's options whose family is not already a method of the spec (a spec holds one entry per
    family)."""
    return tuple(o for o in delta.options if o.value not in chosen)


class _StrictLoader(yaml.SafeLoader):
    """Safe YAML that reads 1e-5 as a number (YAML 1.2) and refuses a key given twice."""

    def construct_mapping(self, node, deep=False):
        keys = [self.construct_object(k, deep=deep) for k, _ in node.value]
        for i, (key, (key_node, _)) in enumerate(zip(keys, node.value)):
            if key in keys[:i]:
                raise SpaceError(str(key), f"duplicate key (line {key_node.start_mark.line + 1})")
        return super().construct_mapping(node, deep)


_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def read_yaml(text: str) -> Any:
    """The document in `text`; SpaceError for malformed YAML (with its line) or a duplicate key."""
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown position"
        raise SpaceError(f"({where})", "malformed YAML: " + " ".join(str(error.problem).split())) from None
    except yaml.YAMLError as error:
        raise SpaceError("(file)", "malformed YAML: " + " ".join(str(error).split())) from None


def _mapping(raw: Any, key: str) -> dict:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise SpaceError(key, f"expected a mapping, got {type(raw).__name__} {raw!r}")
    return raw


def _known(raw: dict, allowed, key: str, what: str) -> None:
    for name in raw:
        if name not in allowed:
            prefix = f"{key}." if key else ""
            raise SpaceError(f"{prefix}{name}", f"unknown {what}; known: {', '.join(map(str, allowed))}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _label(value: Any) -> Any:
    return "+".join(map(str, value)) if isinstance(value, (list, tuple)) else value


@dataclass(frozen=True)
class _Scope:
    """Where fields are read: what they may be, their parameter-name prefix, which fields are already set."""

    schema: dict[str, Kind]
    prefix: str
    taken: frozenset = frozenset()


class Parser:
    """Reads a document into a Tree; `names` maps each parameter it may draw to its key and distribution."""

    def __init__(self) -> None:
        self.names: dict[str, tuple[str, tuple]] = {}

    def tree(self, doc: Any) -> Tree:
        if not isinstance(doc, dict):
            raise SpaceError("(top level)", f"a search space is a mapping with keys {', '.join(TOP_KEYS)}")
        _known(doc, TOP_KEYS, "", "top-level key")
        methods = self.methods(doc.get("methods"))
        combine = self.combine(doc.get("combine"), methods)
        shared = self.shared(doc.get("shared"), methods)
        train = self.fields(doc.get("train"), "train", _Scope(TRAIN_FIELDS, ""), TRAIN_REQUIRED)
        head = self.fields(doc.get("head"), "head", _Scope(HEAD_FIELDS, ""))
        return Tree(methods, combine, shared, train, head)

    def methods(self, raw: Any) -> dict[str, dict[str, Node]]:
        raw = _mapping(raw, "methods")
        if not raw:
            raise SpaceError("methods", "required: at least one delta method")
        for name in raw:
            if preset_fields(name):
                raise SpaceError(f"methods.{name}", f"{name} is an adapter: write adapter: {{{preset_fields(name)}}}")
        _known(raw, method_names(), "methods", "method")
        out = {m: self.fields(raw[m], f"methods.{m}", _Scope(method_fields(m), f"{m}."), required_fields(m))
               for m in method_names() if m in raw}
        for method, fields in out.items():
            _check_sizes(method, fields)
        return out

    def fields(self, raw: Any, key: str, scope: _Scope, required: tuple[str, ...] = ()) -> dict[str, Node]:
        raw = _mapping(raw, key)
        _known(raw, scope.schema, key, "field")
        for name in required:
            if name not in raw:
                raise SpaceError(f"{key}.{name}", "required")
        clash = sorted(scope.taken & set(raw))
        if clash:
            raise SpaceError(f"{key}.{clash[0]}", "already set outside this choice")
        inner = _Scope(scope.schema, scope.prefix, scope.taken | set(raw))
        return {name: self.value(raw[name], scope.schema[name], f"{key}.{name}", scope.prefix + name, inner)
                for name in scope.schema if name in raw}

    def value(self, raw: Any, kind: Kind, key: str, name: str, scope: _Scope) -> Node:
        if kind is NESTED_DELTA:
            return self.mixture(raw, key, name)
        if isinstance(raw, dict) and "choice" in raw:
            return self.choice(raw, kind, key, name, scope)
        if isinstance(raw, dict) and ("int" in raw or "float" in raw):
            return self.range(raw, kind, key, name)
        if isinstance(raw, dict):
            raise SpaceError(key, f"expected {kind.what}, or a distribution: {{choice: [...]}}, "
                                  f"{{int: [low, high]}} or {{float: [low, high]}}")
        return Fixed(_check(raw, kind, key))

    def choice(self, raw: dict, kind: Kind, key: str, name: str, scope: _Scope) -> Choice:
        _known(raw, ("choice",), key, "key beside choice")
        options, key = raw["choice"], f"{key}.choice"
        if isinstance(options, dict):
            parsed = [self._branch(value, body, kind, f"{key}.{value}", scope) for value, body in options.items()]
        elif isinstance(options, list):
            parsed = [Option(_label(v), _check(v, kind, key)) for v in options]
        else:
            raise SpaceError(key, "expected a list of options, or a mapping option -> fields for that option")
        return self._choice_node(name, parsed, key)

    def _branch(self, value: Any, body: Any, kind: Kind, key: str, scope: _Scope) -> Option:
        value = _check(value, kind, key)
        return Option(value, value, self.fields(body, key, scope))

    def _choice_node(self, name: str, options: list[Option], key: str, nested: bool = False) -> Choice:
        labels = [o.label for o in options]
        if not labels:
            raise SpaceError(key, "empty choice: give at least one option")
        for i, label in enumerate(labels):
            if label in labels[:i]:
                raise SpaceError(key, f"option {label!r} is given twice")
        if len(labels) > 1:
            self._register(name, key, ("choice", tuple(labels)))
        return Choice(name, tuple(options), nested)

    def range(self, raw: dict, kind: Kind, key: str, name: str) -> Range:
        which = "int" if "int" in raw else "float"
        _known(raw, (which, "step", "log"), key, f"key beside {which}")
        if which not in kind.ranges:
            article = "an" if which == "int" else "a"
            raise SpaceError(f"{key}.{which}", f"{article} {which} range cannot draw {kind.what}")
        low, high = _bounds(raw[which], which, kind, f"{key}.{which}")
        log, step = _log_and_step(raw, which, low, high, key)
        self._register(name, key, (which, low, high, step, log))
        return Range(name, which == "int", low, high, step, log)

    def mixture(self, raw: Any, key: str, name: str) -> Choice:
        """A mixture's delta (adamix.delta): {choice: {adapter: {...}, lora: {...}}}, or one of them alone."""
        mixture = name.rsplit(".", 1)[0]
        mixes = mixed_methods(mixture)
        if not isinstance(raw, dict) or not raw:
            each = ", ".join(f"{m}: {{...}}" for m in mixes)
            raise SpaceError(key, f"expected the mixed delta: {{choice: {{{each}}}}} or {{{mixes[0]}: {{...}}}}")
        if "choice" in raw:
            _known(raw, ("choice",), key, "key beside choice")
            raw, key = _mapping(raw["choice"], f"{key}.choice"), f"{key}.choice"
        elif len(raw) > 1:
            raise SpaceError(key, "several mixed deltas: list them under choice:")
        _known(raw, mixes, key, f"mixed delta ({mixture} mixes {' or '.join(mixes)} experts)")
        options = [Option(m, m, self.fields(body, f"{key}.{m}", _Scope(mixed_fields(mixture, m), f"{mixture}.{m}.")))
                   for m, body in raw.items()]
        return self._choice_node(name, options, key, nested=True)

    def combine(self, raw: Any, methods: dict) -> int | Choice:
        raw = _mapping(raw, "combine")
        _known(raw, ("max_methods", "combinations"), "combine", "key")
        if len(raw) > 1:
            raise SpaceError("combine", "give max_methods or combinations, not both")
        if "combinations" in raw:
            return self.combinations(raw["combinations"], methods)
        most = raw.get("max_methods", len(methods))
        if not _is_int(most) or not 1 <= most <= len(methods):
            raise SpaceError("combine.max_methods", f"expected an integer from 1 to {len(methods)} "
                                                    f"(the number of methods), got {most!r}")
        return most

    def combinations(self, raw: Any, methods: dict) -> Choice:
        key = "combine.combinations"
        if isinstance(raw, dict):
            items = [(str(label), combo) for label, combo in raw.items()]
        elif isinstance(raw, list):
            items = [(None, combo) for combo in raw]
        else:
            raise SpaceError(key, "expected a mapping name -> [methods], or a list of [methods]")
        options = [_combination(label, combo, f"{key}.{label or i}", methods) for i, (label, combo) in enumerate(items)]
        used = {m for o in options for m in o.value}
        for method in methods:
            if method not in used:
                raise SpaceError(f"methods.{method}", "is in no combination (add it to one, or remove it)")
        return self._choice_node("methods", options, key)

    def shared(self, raw: Any, methods: dict) -> dict[str, Node]:
        fields = self.fields(raw, "shared", _Scope(shared_fields(), ""))
        for name, node in fields.items():
            if not any(name in method_fields(m) for m in methods):
                raise SpaceError(f"shared.{name}", f"no method of this space has a {name} field")
            if any(o.branch for o in getattr(node, "options", ())):
                raise SpaceError(f"shared.{name}", "a shared field takes a list of options, not branches")
        return fields

    def _register(self, name: str, key: str, distribution: tuple) -> None:
        first_key, first = self.names.setdefault(name, (key, distribution))
        if first != distribution:
            raise SpaceError(key, f"parameter {name} is drawn differently at {first_key}: "
                                  f"one parameter name needs one distribution")


def _check(value: Any, kind: Kind, key: str) -> Any:
    if not kind.accepts(value):
        raise SpaceError(key, f"{value!r} is invalid: expected {kind.what}")
    return tuple(value) if isinstance(value, list) else value


def _bounds(raw: Any, which: str, kind: Kind, key: str) -> tuple[float, float]:
    ok = isinstance(raw, list) and len(raw) == 2 and all(_is_int(v) or which == "float" and
                                                         isinstance(v, float) for v in raw)
    if not ok:
        raise SpaceError(key, f"expected [low, high] with {which} bounds, got {raw!r}")
    low, high = (float(v) for v in raw) if which == "float" else raw
    if low > high:
        raise SpaceError(key, f"low {low} > high {high}")
    return _check(low, kind, key), _check(high, kind, key)


def _log_and_step(raw: dict, which: str, low: float, high: float, key: str) -> tuple[bool, float | None]:
    log, step = raw.get("log", False), raw.get("step")
    if not isinstance(log, bool):
        raise SpaceError(f"{key}.log", f"expected true or false, got {log!r}")
    if log and low <= 0:
        raise SpaceError(f"{key}.{which}", f"a log range needs low > 0, got {low}")
    if step is None:
        return log, 1 if which == "int" else None
    if log:
        raise SpaceError(f"{key}.step", "step and log cannot be combined")
    number = _is_int(step) or which == "float" and isinstance(step, float)
    if not number or step <= 0:
        raise SpaceError(f"{key}.step", f"expected a positive {which}, got {step!r}")
    if which == "int" and (high - low) % step:
        raise SpaceError(f"{key}.step", f"high - low = {high - low} is not a multiple of step {step}")
    return log, step


def _combination(label: str | None, combo: Any, key: str, methods: dict) -> Option:
    if not isinstance(combo, list) or not combo:
        raise SpaceError(key, f"expected a non-empty list of methods, got {combo!r}")
    for i, method in enumerate(combo):
        if method not in methods:
            raise SpaceError(key, f"{method!r} is not under methods (defined: {', '.join(methods)})")
        if method in combo[:i]:
            raise SpaceError(key, f"{method!r} is listed twice")
    chosen = tuple(m for m in method_names() if m in combo)
    for method in chosen:
        nested = nested_field(method)
        if nested and not free_mixtures(methods[method][nested], chosen):
            raise SpaceError(key, f"{method} mixes a family ({' or '.join(mixed_methods(method))}) that the "
                                  "combination already holds; a spec holds one entry per family")
    return Option(label if label is not None else "+".join(chosen), chosen)


def possible_values(fields: dict[str, Node], name: str) -> set:
    """Every value field `name` may take anywhere in `fields`, including inside choice branches."""
    found: set = set()
    for key, node in fields.items():
        if key == name and isinstance(node, Fixed):
            found.add(node.value)
        elif key == name and isinstance(node, Range):
            found.update(range(int(node.low), int(node.high) + 1, int(node.step or 1)))
        for option in getattr(node, "options", ()):
            if key == name:
                found.add(option.value)
            found.update(possible_values(option.branch, name))
    return found


def _check_sizes(method: str, fields: dict[str, Node]) -> None:
    """Every value of a size field the method's entry says must divide another (`registry.Divides`: PHM's n, the
    bottleneck) divides every value that other may take (its default where the space leaves it out)."""
    for rule in sizes(method):
        multiples = possible_values(fields, rule.multiple) or {field_default(method, rule.multiple)}
        for divisor in sorted(possible_values(fields, rule.divisor)):
            bad = sorted(m for m in multiples if m % divisor)
            if bad:
                raise SpaceError(f"methods.{method}.{rule.divisor}", f"{rule.divisor}={divisor} does not divide "
                                                                     f"{rule.multiple} {bad[0]}; {rule.why}")

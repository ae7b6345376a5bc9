"""One entry per delta method: everything autopelt knows of a method, registered in one place.

A method is one file (the built-in ones: autopelt/delta/methods/) that declares its config and calls
`register(Method(...))` with it: what it builds and where (`build`), how many parameters that is (`count`), what
it asks of a model (`fits`, `refuses`), and its peft form or why it has none (`peft`). The spec parses it, the
search spaces list its fields, `apply_delta` builds it, `count_parameters` counts it and `export` writes it, all
through this entry, and so do the trial (its extra loss, checkpointing), the search (its rate family, the sizes a
space must draw together, a refinement's wider placement), `autopelt train --method` (a wrapper's inner delta), the
report (its gate's row) and the ensemble's soup; outside autopelt/delta/ no code compares a method's name
(tests/test_delta_registry.py fails on one). A method outside the package registers itself the same way when its
file is imported.

This module is torch-free, as every method's file is at import time: a `build` imports its modules when it runs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable

from autopelt.delta.config import MethodConfig
from autopelt.delta.fields import NESTED_DELTA, kind_of
from autopelt.errors import UserError

if TYPE_CHECKING:
    from autopelt.delta.sites import Architecture


@dataclass(frozen=True)
class Mixture:
    """How a delta's projections are built: `experts` of each (AdaMix), the up-projection shared or not."""

    experts: int = 1
    share_up: bool = True
    copy: bool = True  # every expert starts as a copy of one draw

    def count(self, up: bool) -> int:
        """How many of one projection there are: the down-projection's experts, or the up-projection's."""
        return 1 if up and self.share_up else self.experts


@dataclass(frozen=True)
class Shape:
    """What counting reads of a model before it exists: its transformers config, its family, what its head reads,
    and the mixture the delta is built under (one expert unless AdaMix mixes it)."""

    config: Any
    arch: Architecture
    pooling: str = "cls"
    mixture: Mixture = Mixture()


@dataclass(frozen=True)
class Divides:
    """One size field that must divide another in every config a search space may draw (PHM's n, the bottleneck);
    `why` ends the one-line error of a space that breaks it."""

    divisor: str
    multiple: str
    why: str


@dataclass(frozen=True)
class Stack:
    """How members of one low-rank structure stack into one delta (a "ranks" soup): each tensor whose name ends in
    `down` is concatenated by rows, each ending in `up` by columns, every member's times its weight and `ratio` (s/s':
    the update's scale at a member's rank over its scale at the stacked rank); `config` is the stacked delta's."""

    config: MethodConfig
    ratio: float
    down: str
    up: str


def _nothing(*_: Any) -> None:
    return None


def _itself(config: MethodConfig) -> MethodConfig:
    return config


@dataclass(frozen=True)
class Method:
    """A delta method's registry entry.

    config:   its frozen config class; `config.method` is its name, its fields' kinds its validation and schema.
    build:    `build(at, config)` puts its modules in the model (`at`: inject.Build, the one place that changes a
              model); what it wraps and where is its injection rule.
    count:    `count(config, shape)` -> (trainable, stored) parameters on a model of `shape` (registry.Shape),
              the task head left out; stored is what its inference form saves.
    order:    methods are built lowest first, so a model's module paths depend on the spec alone; what is built
              later wraps what was built before on the same module.
    fits:     `fits(config, model_config, arch)` raises a one-line UserError for what it cannot be on this model
              (sizes that must divide; the layers and targets every method has are checked for it).
    refuses:  `refuses(config, arch)`: why it cannot apply to this family at all, or None; the search spaces
              leave such a method out.
    wraps:    a wrapper (AdaMix): the delta it builds, which then gives its family, order, fits and refusals.
    stored:   its inference form's config (what a saved delta holds and builds).
    peft:     `peft(config, target)` -> its peft config (target: peft_export.PeftTarget); or a string, the
              one-line reason peft has no form of it.
    peft_refuses: `peft_refuses(config, arch)` (arch None: an unknown model type): why this config has no peft
              form on that family, or None.
    peft_bias: peft trains biases beside it (its `bias` setting).
    peft_beside: a method peft holds only as another method's setting (BitFit: its `bias`):
              `peft_beside(config, other)` -> that setting, or a one-line UserError.
    peft_names: peft's names for its tensors (its adapter's name dropped) -> ours, where they differ.
    peft_tensors: `peft_tensors(model)` -> tensors peft holds in a form of its own, by peft's names (a prefix as
              peft's embedding).
    aliases:  other names read as this method with these fields (`compacter`: an adapter with PHM projections).
    rate_family: `rate_family(config)` -> the family whose learning rate it trains at (the search measures one
              rate a family: search/rate_policy.py); default its name. A wrapper trains at its delta's.
    extra_loss: `extra_loss(config)` -> the weight of the training loss's term of its own (AdaMix's consistency
              between two routings, train/loop.py); 0 for none.
    checkpointing_refusal: `checkpointing_refusal(config, model_config, arch)`: why it cannot train with gradient
              checkpointing on this model, or None (a decoder's prefix travels in the key/value cache).
    soup:     how members of one structure average into one delta (ensemble/soup.py): "ranks" (low-rank factors
              stacked: LoRA), "average" (the tensors averaged: BitFit), or None (not linear in its tensors).
    soup_refuses: `soup_refuses(config)`: why this config of a soupable method is not, or None (a gated LoRA).
    soup_stack: a "ranks" soup's `soup_stack(config, members)`: how that many members stack (registry.Stack).
    sizes:    fields that must divide others (registry.Divides): a search space checks each pair over every value it
              may draw, so a file that would draw an impossible config fails when it is loaded.
    wider:    field -> {value: the value that puts the delta in more places}: a refinement "in more places"
              (search/refine.py) draws the wider value where the space offers it (a Pfeiffer adapter: Houlsby's).
    gate_row: where its UniPELT gate's row goes in a gate map (the report), lowest first; None: after those, by
              name (the gates' kind is the method's name).
    unpackable: why its trials cannot share a backbone pass with others (delta/packing.py), or None: they can.
    """

    config: type[MethodConfig]
    build: Callable[[Any, Any], None]
    count: Callable[[Any, Shape], tuple[int, int]]
    order: int = 0
    fits: Callable[[Any, Any, Architecture], None] = _nothing
    refuses: Callable[[Any, Architecture], str | None] = _nothing
    wraps: Callable[[Any], MethodConfig] | None = None
    stored: Callable[[Any], MethodConfig] = _itself
    peft: Callable[[Any, Any], Any] | str = "peft has no such method"
    peft_refuses: Callable[[Any, Architecture | None], str | None] = _nothing
    peft_bias: bool = False
    peft_beside: Callable[[Any, MethodConfig], str] | None = None
    peft_names: dict[str, str] = field(default_factory=dict)
    peft_tensors: Callable[[Any], dict] | None = None
    aliases: dict[str, dict] = field(default_factory=dict)
    rate_family: Callable[[Any], str] | None = None
    extra_loss: Callable[[Any], float] = lambda config: 0.0
    checkpointing_refusal: Callable[[Any, Any, Architecture], str | None] = _nothing
    soup: str | None = None
    soup_refuses: Callable[[Any], str | None] = _nothing
    soup_stack: Callable[[Any, int], Stack] | None = None
    sizes: tuple[Divides, ...] = ()
    wider: dict[str, dict] = field(default_factory=dict)
    gate_row: int | None = None
    unpackable: str | None = None

    @property
    def name(self) -> str:
        return self.config.method


# name -> config class, in registration order (the order `autopelt methods` and a search space list them in)
METHODS: dict[str, type[MethodConfig]] = {}
ENTRIES: dict[str, Method] = {}
ALIASES: dict[str, tuple[str, dict]] = {}  # another name -> (its method, the fields the name sets)


def register(method: Method) -> Method:
    """Make `method` known to the spec, the search spaces, injection, counting and export.

    Returns:
        `method`, so that a method's file may keep it.
    Raises:
        ValueError: its name or one of its aliases is empty or already taken.
    """
    for name in (method.name, *method.aliases):
        if not name or name in METHODS or name in ALIASES:
            raise ValueError(f"cannot register a delta method named {name!r}: the name is empty or taken")
    METHODS[method.name] = method.config
    ENTRIES[method.name] = method
    ALIASES.update({alias: (method.name, fields) for alias, fields in method.aliases.items()})
    return method


def method_of(config: MethodConfig) -> Method:
    """The registry entry of a config (KeyError for a config class no method registered)."""
    return ENTRIES[config.method]


def innermost(config: MethodConfig) -> MethodConfig:
    """The delta a config builds: itself, or what a wrapper (AdaMix) wraps."""
    entry = ENTRIES.get(config.method)  # a config may be in METHODS alone: parsed and searched, never built
    return config if entry is None or entry.wraps is None else innermost(entry.wraps(config))


def rate_family(config: MethodConfig) -> str:
    """The family whose learning rate a config trains at (`Method.rate_family`; a wrapper: its delta's)."""
    inner = innermost(config)
    entry = ENTRIES.get(inner.method)
    return entry.rate_family(inner) if entry is not None and entry.rate_family else inner.method


def inner_field(method: str) -> str | None:
    """The field of a wrapper's spec entry that holds the delta it wraps (AdaMix's `delta`: its field of kind
    NESTED_DELTA), or None for a method that wraps none (KeyError for an unknown method)."""
    return next((f.name for f in dataclasses.fields(METHODS[method]) if kind_of(f) is NESTED_DELTA), None)


def mixable() -> tuple[str, ...]:
    """Every method some wrapper may wrap (its config's `mixes`), in the order the wrappers, in registration order,
    list them (AdaMix: adapter, lora; `autopelt train --inner` takes the first by default)."""
    return tuple(dict.fromkeys(name for config in METHODS.values() for name in config.mixes))


def sizes(method: str) -> tuple[Divides, ...]:
    """The size rules a search space checks for `method` (`Method.sizes`); none for a method with no entry."""
    entry = ENTRIES.get(method)
    return () if entry is None else entry.sizes


def wider(method: str, field_name: str, value: Any) -> Any:
    """The value of `method`'s field that puts its delta in more places than `value` does (`Method.wider`), or
    None."""
    entry = ENTRIES.get(method)
    return None if entry is None else entry.wider.get(field_name, {}).get(value)


def in_gate_order(kinds: Iterable[str]) -> list[str]:
    """Gate kinds (each the name of the method whose gates they are) in the order a gate map lists them: by their
    entries' `gate_row`, then the others by name."""
    rows = {kind: getattr(ENTRIES.get(kind), "gate_row", None) for kind in kinds}
    placed = sorted((kind for kind, row in rows.items() if row is not None), key=rows.__getitem__)
    return placed + sorted(kind for kind, row in rows.items() if row is None)


def normalise_method(name: Any) -> str | None:
    """The method a spec entry's name means (an alias's method), or None for an unknown name."""
    if name in ALIASES:
        return ALIASES[name][0]
    return name if name in METHODS else None


def parse_method(data: dict) -> MethodConfig:
    """The checked config of one spec entry, `{"method": name, field: value...}`.

    Raises:
        UserError: no method, an unknown one, or a field its config refuses (MethodConfig.from_dict).
    """
    if not isinstance(data, dict) or "method" not in data:
        raise UserError(f"each delta entry needs a \"method\" field; got {data!r}")
    name = data["method"]
    if normalise_method(name) is None:
        known = sorted(METHODS) + sorted(ALIASES)
        raise UserError(f"unknown method {name!r}; known methods: {', '.join(known)}")
    if name in ALIASES:
        method, fields = ALIASES[name]
        return METHODS[method].from_dict({**fields, **{k: v for k, v in data.items() if k != "method"}})
    return METHODS[name].from_dict(data)

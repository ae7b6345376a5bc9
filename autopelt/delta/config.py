"""The base of every method's config: a frozen dataclass whose fields declare the values they accept
(their `Kind`, fields.py), checked here when a config is read from a dict. Torch-free, like the whole spec.

The site names a method's `targets` may name are here too: they are the spec's words, which each family
(sites.py) maps to its own modules.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from autopelt.delta.fields import kind_of
from autopelt.errors import UserError

ENCODER_SITES = ("query", "key", "value", "attention_output", "intermediate", "output")
# Sites only some families have (autopelt/delta/sites.py): GPT-2's fused query/key/value, the gate projection of a
# gated FFN (Llama), T5's decoder cross-attention
DECODER_SITES = ("qkv", "gate", "cross_query", "cross_key", "cross_value", "cross_output")
LINEAR_SITES = ENCODER_SITES + DECODER_SITES
BIAS_SITES = ENCODER_SITES + ("layernorm", "embeddings")


@dataclass(frozen=True)
class MethodConfig:
    """Base of every method config: `from_dict` checks field names, then each value against its field's kind;
    `check` checks what involves several fields."""

    method: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    mixes: ClassVar[tuple[str, ...]] = ()  # a mixture: the methods its nested delta may be
    experts_leave: ClassVar[tuple[str, ...]] = ()  # a mixture: fields its experts keep at their defaults

    @classmethod
    def from_dict(cls, data: dict) -> MethodConfig:
        """A checked config from a spec entry (its "method" key, if any, is ignored).

        Raises:
            UserError: an unknown field, a value of the wrong type or outside its kind, or a rule between fields
                broken (`check`), in one line naming the field.
        """
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known - {"method"})
        if unknown:
            raise UserError(
                f"unknown field {unknown[0]!r} for method {cls.method!r}; known fields: {', '.join(sorted(known))}"
            )
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k != "method"}
        try:
            config = cls(**values)
        except TypeError as error:
            raise UserError(f"bad {cls.method} config: {error}") from None
        for f in dataclasses.fields(cls):
            _check_type(cls.method, f, getattr(config, f.name))
        for f in dataclasses.fields(cls):
            kind = kind_of(f)
            if kind is not None:
                require(config, f.name, kind.accepts(getattr(config, f.name)), kind.what)
        config.check()
        return config

    def to_dict(self) -> dict:
        out: dict[str, Any] = {"method": self.method}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, MethodConfig):
                value = value.to_dict()
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    def check(self) -> None:
        """Rules between fields (each field's own values are its kind's)."""

    def describe(self) -> str:
        """Its words in a spec's summary: the method and the fields that give its size (`lora r8`, their
        `abbrev`), then `(gated)` when gated."""
        sizes = [f"{f.metadata['abbrev']}{getattr(self, f.name)}" for f in dataclasses.fields(self)
                 if f.metadata.get("abbrev")]
        return " ".join([self.method, *sizes]) + self.gated_suffix()

    def gated_suffix(self) -> str:
        return "(gated)" if getattr(self, "gate", False) else ""


def _check_type(method: str, f: dataclasses.Field, value: Any) -> None:
    """Values must have their default's type (an int where a float is expected is fine)."""
    default = f.default
    if default is None or default is dataclasses.MISSING or value is None and default is None:
        return
    expected = type(default)
    ok = isinstance(value, expected) and (expected is bool or not isinstance(value, bool))
    if expected is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok and not isinstance(default, MethodConfig):
        kind = {bool: "true or false", int: "an integer", float: "a number", str: "a string", tuple: "a list"}
        raise UserError(f"{method}.{f.name} = {value!r} is invalid: expected {kind.get(expected, expected.__name__)}")


def require(config: MethodConfig, name: str, ok: bool, what: str) -> None:
    """A rule of `check`: raise the spec's one-line UserError for field `name` unless `ok` (`what` completes
    "expected ...")."""
    if not ok:
        raise UserError(f"{config.method}.{name} = {getattr(config, name)!r} is invalid: expected {what}")

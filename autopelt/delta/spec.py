"""The delta spec: plain, validated, JSON-serialisable data describing which methods a delta is made of.

A spec is a tuple of frozen method configs. Nothing here touches a model: `apply_delta` reads a spec and
builds it, `count_parameters` reads a spec and a model config and counts it. Each method's config is declared in
its own file with the rest of its registry entry (autopelt/delta/registry.py, autopelt/delta/methods/); each field
declares the values it accepts (its `Kind`, fields.py), which the spec checks and the search spaces' schema reads.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autopelt.delta import methods  # noqa: F401  (registers the built-in methods)
from autopelt.delta.config import (  # noqa: F401  (the spec's names, where they were)
    BIAS_SITES, DECODER_SITES, ENCODER_SITES, LINEAR_SITES, MethodConfig,
)
from autopelt.delta.methods.adamix import AdaMixConfig  # noqa: F401
from autopelt.delta.methods.adapter import AdapterConfig  # noqa: F401
from autopelt.delta.methods.bitfit import BitFitConfig  # noqa: F401
from autopelt.delta.methods.ia3 import IA3Config  # noqa: F401
from autopelt.delta.methods.lora import LoRAConfig  # noqa: F401
from autopelt.delta.methods.prefix import PrefixConfig  # noqa: F401
from autopelt.delta.methods.prompt import PromptConfig  # noqa: F401
from autopelt.delta.methods.vera import VeRAConfig  # noqa: F401
from autopelt.delta.registry import METHODS, innermost, normalise_method, parse_method  # noqa: F401
from autopelt.errors import UserError

ADAPTER_PRESETS: dict[str, dict] = methods.adapter.ALIASES  # names read as adapter entries (the search spaces')

POOLINGS = ("cls", "mean")


def with_pooling(spec: dict, pooling: str) -> dict:
    """A spec dict whose head reads `pooling`; "cls" is left out, as DeltaSpec.to_dict leaves it."""
    return {**spec, "pooling": pooling} if pooling != "cls" else spec


@dataclass(frozen=True)
class DeltaSpec:
    """What a delta is made of: at most one entry per method family, and what the task head reads.

    `pooling` is what the head sees of the sequence: "cls", the first token through the model's own head (BERT's
    pooler over it, RoBERTa's head), or "mean", the mean of the last layer's token states over real tokens, the
    way sentence-transformers checkpoints were trained to be read. It adds no parameter and is left out of the
    spec's dict when "cls", so every spec written before it reads and hashes as before. Which one a model was
    trained for is `models.own_pooling`'s answer; `autopelt train` and the study's baselines fill it in from there
    where no one chose.
    """

    methods: tuple[MethodConfig, ...]
    pooling: str = "cls"

    def __post_init__(self) -> None:
        if not self.methods:
            raise UserError("a delta spec needs at least one method")
        if self.pooling not in POOLINGS:
            raise UserError(f"pooling must be one of {', '.join(POOLINGS)}, not {self.pooling!r}")
        families = [innermost(m).method for m in self.methods]
        for family in set(families):
            if families.count(family) > 1:
                raise UserError(f"a delta spec may hold one {family} entry (including inside adamix); "
                                f"merge them into one entry")

    def get(self, method: str) -> MethodConfig | None:
        return next((m for m in self.methods if m.method == method), None)

    def to_dict(self) -> dict:
        return {"methods": [m.to_dict() for m in self.methods],
                **({"pooling": self.pooling} if self.pooling != "cls" else {})}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def summary(self) -> str:
        return " + ".join(m.describe() for m in self.methods) + (f", {self.pooling} pooling"
                                                                 if self.pooling != "cls" else "")

    @property
    def is_gated(self) -> bool:
        return any(getattr(m, "gate", False) for m in self.methods)


def parse_spec(source: Any) -> DeltaSpec:
    """A DeltaSpec from a dict, a JSON string, a path to a JSON file, or a DeltaSpec."""
    if isinstance(source, DeltaSpec):
        return source
    if isinstance(source, Path) or (isinstance(source, str) and not source.lstrip().startswith("{")):
        path = Path(source)
        try:
            source = path.read_text()
        except OSError as error:
            raise UserError(f"cannot read delta spec {path}: {error.strerror}") from None
    if isinstance(source, str):
        try:
            source = json.loads(source)
        except json.JSONDecodeError as error:
            raise UserError(f"delta spec is not valid JSON: {error.msg} at line {error.lineno}") from None
    if not isinstance(source, dict) or set(source) - {"methods", "pooling"} \
            or not isinstance(source.get("methods"), list):
        raise UserError('a delta spec is an object {"methods": [...]}, optionally with "pooling": "cls" or "mean", '
                        'and no other top-level field')
    return DeltaSpec(tuple(parse_method(entry) for entry in source["methods"]), source.get("pooling", "cls"))

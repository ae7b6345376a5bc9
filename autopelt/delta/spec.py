"""The delta spec: plain, validated, JSON-serialisable data describing which methods a delta is made of.

A spec is a tuple of frozen method configs. Nothing here touches a model: `apply_delta` reads a spec and
builds it, `count_parameters` reads a spec and a model config and counts it. Each field declares the values it
accepts (its `Kind`, fields.py); the spec checks them, and the search spaces derive their schema from them, so
a method is declared here once (plus its module, injection and count).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from autopelt.delta.fields import (
    BOOL, LAYER_INDICES, NESTED_DELTA, NON_NEGATIVE_INT, NON_NEGATIVE_NUMBER, NON_ZERO_NUMBER, POSITIVE_INT,
    POSITIVE_NUMBER, PROBABILITY, declare, kind_of, one_of, site_list,
)
from autopelt.errors import UserError

ENCODER_SITES = ("query", "key", "value", "attention_output", "intermediate", "output")
# Sites only some families have (autopelt/delta/sites.py): GPT-2's fused query/key/value, the gate projection of a
# gated FFN (Llama), T5's decoder cross-attention
DECODER_SITES = ("qkv", "gate", "cross_query", "cross_key", "cross_value", "cross_output")
LINEAR_SITES = ENCODER_SITES + DECODER_SITES
BIAS_SITES = ENCODER_SITES + ("layernorm", "embeddings")
ACTIVATIONS = ("relu", "gelu", "tanh", "swish")
PLACEMENTS = ("houlsby", "pfeiffer", "ffn")
EXPERT_INITS = ("copy", "independent")


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
                _require(config, f.name, kind.accepts(getattr(config, f.name)), kind.what)
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


def _require(config: MethodConfig, name: str, ok: bool, what: str) -> None:
    if not ok:
        raise UserError(f"{config.method}.{name} = {getattr(config, name)!r} is invalid: expected {what}")


@dataclass(frozen=True)
class LoRAConfig(MethodConfig):
    method: ClassVar[str] = "lora"
    summary: ClassVar[str] = "low-rank update W + (alpha/r)·B·A on chosen linear layers (Hu et al. 2021)"

    rank: int = declare("rank r of the update", 8, POSITIVE_INT, abbrev="r")
    alpha: float = declare("scaling numerator: the update is multiplied by alpha/rank (ignored when gated)", 16.0,
                           POSITIVE_NUMBER)
    targets: tuple[str, ...] = declare(f"linear layers to adapt, among {', '.join(LINEAR_SITES)}", ("query", "value"),
                                       site_list(LINEAR_SITES))
    dropout: float = declare("dropout on the LoRA branch input", 0.0, PROBABILITY)
    gate: bool = declare("UniPELT gate G_L = sigmoid(W·h_in) replaces alpha/rank", False, BOOL)
    layers: tuple[int, ...] | None = declare("layer indices to adapt; null = all", None, LAYER_INDICES)
    rslora: bool = declare("rsLoRA (Kalajdzievski 2023): scale by alpha/sqrt(rank) instead of alpha/rank (ignored "
                           "when gated)", False, BOOL)
    dora: bool = declare("DoRA (Liu et al. 2024): W' = m·(W + s·B·A)/||W + s·B·A||, one learned magnitude m per "
                         "output feature, the norm per row and held constant for the gradient; not with gate", False,
                         BOOL)

    def check(self) -> None:
        _require(self, "dora", not (self.dora and self.gate),
                 "false with gate: true (UniPELT's gate replaces the scale, which DoRA normalises inside the weight)")

    @property
    def scaling(self) -> float:
        return self.alpha / (self.rank ** 0.5 if self.rslora else self.rank)

    def describe(self) -> str:
        name = ("rs" if self.rslora else "") + ("dora" if self.dora else "lora")
        return f"{name} r{self.rank}" + self.gated_suffix()


@dataclass(frozen=True)
class AdapterConfig(MethodConfig):
    method: ClassVar[str] = "adapter"
    summary: ClassVar[str] = ("bottleneck adapter h + up(act(down(h))) after attention and/or FFN "
                              "(Houlsby 2019, Pfeiffer 2021); PHM/Compacter projections (Mahabadi 2021)")

    placement: str = declare("houlsby: on the attention and FFN outputs, after their dropout (Houlsby 2019); "
                             "pfeiffer: FFN only, on LN(h_FN + residual), the sublayer's LayerNorm applied again "
                             "after (Pfeiffer 2021, AdapterHub); ffn: FFN only, on the FFN projection output before "
                             "its dropout (AdaMix's expert soup)", "houlsby", one_of(*PLACEMENTS))
    bottleneck: int = declare("bottleneck size k", 48, POSITIVE_INT)
    activation: str = declare(f"non-linearity, one of {', '.join(ACTIVATIONS)}", "relu", one_of(*ACTIVATIONS))
    projection: str = declare("dense; phm: W = sum A_i kron B_i with full B_i and A per projection; "
                              "compacter: A shared by all layers, B_i = s_i t_i^T of rank phm_rank", "dense",
                              one_of("dense", "phm", "compacter"))
    n: int = declare("number of Kronecker terms for phm/compacter (divides hidden size and bottleneck)", 4,
                     POSITIVE_INT)
    phm_rank: int = declare("rank of B_i for compacter", 1, POSITIVE_INT)
    gate: bool = declare("UniPELT gate G_A = sigmoid(W·x) scales the adapter output, x the adapter's input", False,
                         BOOL)
    layers: tuple[int, ...] | None = declare("layer indices to adapt; null = all", None, LAYER_INDICES)

    def check(self) -> None:
        if self.projection != "dense":
            _require(self, "bottleneck", self.bottleneck % self.n == 0, f"a multiple of n={self.n}")

    def describe(self) -> str:
        name = {"dense": self.placement, "phm": "phm-adapter", "compacter": "compacter"}[self.projection]
        if self.projection == "compacter" and self.placement == "pfeiffer":
            name = "compacter++"
        elif self.projection != "dense" and self.placement != "houlsby":
            name += f"({self.placement})"
        size = f" k{self.bottleneck}" + (f" n{self.n}" if self.projection != "dense" else "")
        return name + size + self.gated_suffix()


@dataclass(frozen=True)
class PrefixConfig(MethodConfig):
    method: ClassVar[str] = "prefix"
    summary: ClassVar[str] = "L trainable key/value vectors prepended in every attention layer (Li & Liang 2021)"

    length: int = declare("prefix length L", 10, POSITIVE_INT, abbrev="L")
    reparam_hidden: int = declare("hidden size of the reparameterisation MLP used while training; 0 = none "
                                  "(only the prefix matrices are ever saved)", 512, NON_NEGATIVE_INT)
    gate: bool = declare("UniPELT gate G_P = sigmoid(W·h_in) scales the prefix keys and values", False, BOOL)
    split_gate: bool = declare("with gate: two gate values per layer, one for the keys and one for the values; "
                               "UniPELT scales both with one", False, BOOL)
    layers: tuple[int, ...] | None = declare("layer indices with a prefix; null = all", None, LAYER_INDICES)
    shift_positions: bool = declare("the real tokens take positions L..L+T-1, as when the prefix is passed as past "
                                    "keys and values (peft's prefix-tuning; needed for a peft export); false: 0..T-1, "
                                    "as UniPELT", False, BOOL)

    def describe(self) -> str:
        return f"prefix L{self.length}" + (" shifted" if self.shift_positions else "") + self.gated_suffix()

    def gated_suffix(self) -> str:
        return "(gated k,v)" if self.gate and self.split_gate else super().gated_suffix()


@dataclass(frozen=True)
class PromptConfig(MethodConfig):
    method: ClassVar[str] = "prompt"
    summary: ClassVar[str] = "L soft tokens inserted after the first token at the input embeddings (Lester 2021)"

    length: int = declare("number of soft tokens L", 20, POSITIVE_INT, abbrev="L")


@dataclass(frozen=True)
class BitFitConfig(MethodConfig):
    method: ClassVar[str] = "bitfit"
    summary: ClassVar[str] = "train bias terms only (Ben Zaken et al. 2021)"

    targets: tuple[str, ...] | None = declare(f"bias groups among {', '.join(BIAS_SITES)}; null = every bias", None,
                                              site_list(BIAS_SITES, nullable=True))
    # not drawn by search spaces: a space's shared `layers` has never restricted BitFit
    layers: tuple[int, ...] | None = declare("layer indices whose biases train; null = all", None, LAYER_INDICES,
                                             search=False)
    pooler: bool = declare("also train the pooler's bias (BERT; RoBERTa's head has none), as BitFit's code always "
                           "does; not under mean pooling, which skips the pooler", True, BOOL)

    def describe(self) -> str:
        targets = None if self.targets is None else ",".join(self.targets)
        if not self.pooler:
            targets = f"{targets or 'all'},no pooler"
        return "bitfit" if targets is None else f"bitfit({targets})"


@dataclass(frozen=True)
class IA3Config(MethodConfig):
    method: ClassVar[str] = "ia3"
    summary: ClassVar[str] = ("(IA)³: learned vectors rescale keys, values and the FFN's inner activation, starting at "
                              "one (Liu et al. 2022)")

    targets: tuple[str, ...] = declare(f"where a vector rescales, among {', '.join(LINEAR_SITES)}: a linear's "
                                       "output, except `output`, whose input (the FFN's inner activation) it rescales",
                                       ("key", "value", "output"), site_list(LINEAR_SITES))
    layers: tuple[int, ...] | None = declare("layer indices to adapt; null = all", None, LAYER_INDICES)

    def describe(self) -> str:
        return "ia3" if set(self.targets) == {"key", "value", "output"} else f"ia3({','.join(self.targets)})"


@dataclass(frozen=True)
class VeRAConfig(MethodConfig):
    method: ClassVar[str] = "vera"
    summary: ClassVar[str] = ("W + diag(b)·B·diag(d)·A with A, B frozen random matrices shared by all layers, "
                              "b and d trained (Kopiczko et al. 2024)")

    rank: int = declare("rank r of the shared matrices A (r x in) and B (out x r)", 256, POSITIVE_INT, abbrev="r")
    targets: tuple[str, ...] = declare(f"linear layers to adapt, among {', '.join(LINEAR_SITES)}", ("query", "value"),
                                       site_list(LINEAR_SITES))
    d_initial: float = declare("initial value of every entry of d (b starts at zero; d = 0 would never learn)", 0.1,
                               NON_ZERO_NUMBER)
    dropout: float = declare("dropout on the VeRA branch input", 0.0, PROBABILITY)
    # not drawn by search spaces: a seed is neither a size nor a placement
    projection_seed: int = declare("seed the shared A and B are drawn from (Kaiming-uniform, as peft's "
                                   "projection_prng_key); they are regenerated from it, never saved", 0,
                                   NON_NEGATIVE_INT, search=False)
    gate: bool = declare("UniPELT gate G = sigmoid(W·h_in) scales the update", False, BOOL)
    layers: tuple[int, ...] | None = declare("layer indices to adapt; null = all", None, LAYER_INDICES)


# What an adapter inside AdaMix is when its fields are left out: the reference's expert soup (one per layer on the
# FFN output, GELU, adapter size 48; microsoft/AdaMix expert_soup.py and bert_base_mnli_expert_soup.sh).
ADAMIX_ADAPTER = {"method": "adapter", "placement": "ffn", "bottleneck": 48, "activation": "gelu"}


@dataclass(frozen=True)
class AdaMixConfig(MethodConfig):
    method: ClassVar[str] = "adamix"
    summary: ClassVar[str] = ("mixture of M adapter or LoRA experts, one random expert per step, "
                              "averaged into one module for inference (Wang et al. 2022)")
    mixes: ClassVar[tuple[str, ...]] = ("adapter", "lora")
    # AdaMix averages its experts into one module: it mixes ungated dense deltas only, and no DoRA (a magnitude
    # normalises one weight, not an average of experts)
    experts_leave: ClassVar[tuple[str, ...]] = ("gate", "projection", "n", "phm_rank", "dora")

    experts: int = declare("experts M per site", 4, POSITIVE_INT)
    share_up: bool = declare("share the up-projection (LoRA: B) across experts, as in the paper", True, BOOL)
    consistency: float = declare("weight of the symmetric-KL consistency loss between two stochastic passes "
                                 "(each side's target detached, task loss on the first pass, as AdaMix's code)", 1.0,
                                 NON_NEGATIVE_NUMBER)
    expert_init: str = declare("copy: every expert starts as a copy of one draw, as AdaMix's code; independent: one "
                               "draw per expert", "copy", one_of(*EXPERT_INITS))
    delta: AdapterConfig | LoRAConfig = declare("the mixed delta: an adapter or lora entry; an adapter's fields left "
                                                "out are AdaMix's (placement ffn, gelu, bottleneck 48)",
                                                AdapterConfig(placement="ffn", bottleneck=48, activation="gelu"),
                                                NESTED_DELTA)

    @classmethod
    def from_dict(cls, data: dict) -> MethodConfig:
        data = dict(data)
        inner = data.pop("delta", ADAMIX_ADAPTER)
        if isinstance(inner, MethodConfig):
            inner = inner.to_dict()
        if not isinstance(inner, dict) or normalise_method(inner.get("method")) not in cls.mixes:
            raise UserError("adamix.delta must be an adapter or lora entry, e.g. {\"method\": \"adapter\"}")
        if inner.get("method") == "adapter":
            inner = {**ADAMIX_ADAPTER, **inner}
        data["delta"] = parse_method(inner)
        return super().from_dict(data)

    def check(self) -> None:
        _require(self, "delta", not self.delta.gate, "an ungated delta (AdaMix and UniPELT gates do not mix)")
        _require(self, "delta", not getattr(self.delta, "dora", False),
                 "a LoRA without dora (a magnitude normalises one weight, not an average of experts)")
        if isinstance(self.delta, AdapterConfig):
            _require(self, "delta", self.delta.projection == "dense", "a dense adapter (PHM weights do not average)")

    def describe(self) -> str:
        init = "" if self.expert_init == "copy" else ", independent"
        return f"adamix M{self.experts}[{self.delta.describe()}{init}]"


METHODS: dict[str, type[MethodConfig]] = {
    c.method: c for c in (LoRAConfig, AdapterConfig, PrefixConfig, PromptConfig, BitFitConfig, AdaMixConfig,
                          IA3Config, VeRAConfig)
}

# Names accepted on input for adapter variants, normalised to `adapter` entries.
ADAPTER_PRESETS: dict[str, dict] = {
    "houlsby": {"placement": "houlsby"},
    "pfeiffer": {"placement": "pfeiffer"},
    "phm_adapter": {"placement": "houlsby", "projection": "phm"},
    "compacter": {"placement": "houlsby", "projection": "compacter"},
    "compacter++": {"placement": "pfeiffer", "projection": "compacter"},
}


def normalise_method(name: Any) -> str | None:
    if name in ADAPTER_PRESETS:
        return "adapter"
    return name if name in METHODS else None


def parse_method(data: dict) -> MethodConfig:
    if not isinstance(data, dict) or "method" not in data:
        raise UserError(f"each delta entry needs a \"method\" field; got {data!r}")
    name = data["method"]
    if normalise_method(name) is None:
        known = sorted(METHODS) + sorted(ADAPTER_PRESETS)
        raise UserError(f"unknown method {name!r}; known methods: {', '.join(known)}")
    if name in ADAPTER_PRESETS:
        data = {**ADAPTER_PRESETS[name], **{k: v for k, v in data.items() if k != "method"}}
        return AdapterConfig.from_dict(data)
    return METHODS[name].from_dict(data)


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
        families = [self._family(m) for m in self.methods]
        for family in set(families):
            if families.count(family) > 1:
                raise UserError(f"a delta spec may hold one {family} entry (including inside adamix); "
                                f"merge them into one entry")

    @staticmethod
    def _family(config: MethodConfig) -> str:
        return config.delta.method if isinstance(config, AdaMixConfig) else config.method

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

"""Bottleneck adapters: Houlsby (2019), Pfeiffer (2021), AdaMix's FFN position, with dense, PHM or Compacter
projections (Mahabadi et al. 2021)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from autopelt.delta.config import MethodConfig, require
from autopelt.delta.fields import BOOL, LAYER_INDICES, POSITIVE_INT, declare, one_of
from autopelt.delta.registry import Divides, Method, register
from autopelt.delta.sites import chosen_layers
from autopelt.errors import UserError

ACTIVATIONS = ("relu", "gelu", "tanh", "swish")
PLACEMENTS = ("houlsby", "pfeiffer", "ffn")


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
            require(self, "bottleneck", self.bottleneck % self.n == 0, f"a multiple of n={self.n}")

    def describe(self) -> str:
        name = {"dense": self.placement, "phm": "phm-adapter", "compacter": "compacter"}[self.projection]
        if self.projection == "compacter" and self.placement == "pfeiffer":
            name = "compacter++"
        elif self.projection != "dense" and self.placement != "houlsby":
            name += f"({self.placement})"
        size = f" k{self.bottleneck}" + (f" n{self.n}" if self.projection != "dense" else "")
        return name + size + self.gated_suffix()


# Names a spec entry may use for adapter variants, read as `adapter` entries with these fields.
ALIASES: dict[str, dict] = {
    "houlsby": {"placement": "houlsby"},
    "pfeiffer": {"placement": "pfeiffer"},
    "phm_adapter": {"placement": "houlsby", "projection": "phm"},
    "compacter": {"placement": "houlsby", "projection": "compacter"},
    "compacter++": {"placement": "pfeiffer", "projection": "compacter"},
}


def positions(cfg: AdapterConfig, arch, stack) -> list[tuple[str, type]]:
    """(path inside a layer, wrapper) of each adapter a layer of `stack` gets under `cfg.placement`."""
    from autopelt.delta.modules.adapter import AdapterWrapper, PostNormAdapter

    if cfg.placement == "houlsby":  # after each sublayer's dropout, before its LayerNorm (pre-norm: its residual)
        return [(stack.dropouts[site], AdapterWrapper) for site in ("attention_output", "output")]
    if cfg.placement == "pfeiffer" and not arch.pre_norm:  # on the FFN's normalised sum, through its LayerNorm
        return [(stack.layernorms["output"], PostNormAdapter)]
    if cfg.placement == "pfeiffer":  # pre-norm: the FFN's output joins the residual un-normalised, as AdapterHub's
        return [(stack.dropouts["output"], AdapterWrapper)]
    return [(stack.linears["output"], AdapterWrapper)]  # ffn: on the FFN projection, before its dropout


def build(at, cfg: AdapterConfig) -> None:
    """A bottleneck at each of the placement's positions in the chosen layers; a Compacter's rule is one for the
    model."""
    from autopelt.delta.modules.adapter import Bottleneck
    from autopelt.delta.modules.phm import new_rule

    entries = at.arch.layer_entries(at.model)
    hidden = at.config.hidden_size
    rule = new_rule(cfg.n, at.generator) if cfg.projection == "compacter" else None
    for i in chosen_layers(cfg.layers, len(entries)):
        layer, stack = entries[i]
        for path, wrapper in positions(cfg, at.arch, stack):
            down = _projection(at, cfg, hidden, cfg.bottleneck, rule, up=False)
            up = _projection(at, cfg, cfg.bottleneck, hidden, rule, up=True)
            gate = at.gate(hidden, 1, "adapter", i, stack) if cfg.gate else None
            adapter = Bottleneck(down, up, cfg.activation)
            at.replace(layer, path, lambda base: wrapper(base, adapter, gate))


def _projection(at, cfg: AdapterConfig, in_f: int, out_f: int, rule, up: bool):
    from autopelt.delta.modules.phm import PHMLinear, new_rule

    if cfg.projection == "dense":
        return at.linear(in_f, out_f, up)
    if cfg.projection == "phm":
        return PHMLinear(in_f, out_f, new_rule(cfg.n, at.generator), None, at.generator, up)
    return PHMLinear(in_f, out_f, rule, cfg.phm_rank, at.generator, up)


def count(cfg: AdapterConfig, shape) -> tuple[int, int]:
    """Down and up projections with biases (a mixture's experts of them), a gate's hidden + 1, per position and
    layer; a Compacter's shared rule once."""
    layers = len(chosen_layers(cfg.layers, shape.arch.num_layers(shape.config)))
    hidden = shape.config.hidden_size
    per_layer = 2 if cfg.placement == "houlsby" else 1
    down_t, down_s = _projection_size(cfg, hidden, cfg.bottleneck, shape.mixture.count(up=False))
    up_t, up_s = _projection_size(cfg, cfg.bottleneck, hidden, shape.mixture.count(up=True))
    gate = (hidden + 1) if cfg.gate else 0
    shared_rule = cfg.n ** 3 if cfg.projection == "compacter" else 0
    total = lambda down, up: (down + up + gate) * per_layer * layers + shared_rule  # noqa: E731
    return total(down_t, up_t), total(down_s, up_s)


def _projection_size(cfg: AdapterConfig, in_f: int, out_f: int, experts: int) -> tuple[int, int]:
    """(trainable, stored) of one projection, bias included; a shared Compacter rule is counted by the caller."""
    if cfg.projection == "dense":
        one = in_f * out_f + out_f
        return one * experts, one
    if cfg.projection == "phm":  # Zhang et al.: k·d/n + n³ per projection
        one = in_f * out_f // cfg.n + cfg.n ** 3 + out_f
    else:  # Compacter: B_i = s_i t_i^T of rank r: r·(k + d) per projection
        one = cfg.phm_rank * (in_f + out_f) + out_f
    return one, one


def fits(cfg: AdapterConfig, config, arch) -> None:
    if cfg.projection != "dense" and config.hidden_size % cfg.n:
        raise UserError(f"adapter.n = {cfg.n} must divide the model's hidden size {config.hidden_size}")


# PHM and Compacter split the bottleneck into n blocks (`check`); a space may not draw an n that misses one
PHM_SIZES = Divides("n", "bottleneck", "PHM and Compacter need bottleneck % n == 0")
WIDER = {"placement": {"pfeiffer": "houlsby"}}  # a Pfeiffer adapter also after attention: Houlsby's places


METHOD = register(Method(AdapterConfig, build, count, order=40, fits=fits, aliases=ALIASES,
                         peft="peft has no bottleneck adapters (AdapterHub has)",
                         rate_family=lambda cfg: "adapter" if cfg.projection == "dense" else "compacter",
                         sizes=(PHM_SIZES,), wider=WIDER,
                         gate_row=0))  # UniPELT's order of its gates: adapter, prefix, LoRA

"""(IA)³ (Liu et al. 2022): learned vectors, starting at one, rescale keys, values and the FFN's inner activation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from autopelt.delta.config import LINEAR_SITES, MethodConfig
from autopelt.delta.fields import LAYER_INDICES, declare, site_list
from autopelt.delta.registry import Method, register
from autopelt.delta.families import linear_shape, linears_of


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


def build(at, cfg: IA3Config) -> None:
    """Wrap each target linear, outermost (it rescales everything under it): on the FFN output layer its input,
    the inner activation (l_ff); elsewhere its output."""
    from autopelt.delta.modules.ia3 import IA3Linear

    for _, layer, stack, site in at.site_layers(cfg):
        in_f, out_f = linear_shape(at.config, site)
        on_input = site == "output"
        at.replace(layer, stack.linears[site], lambda base: IA3Linear(base, in_f if on_input else out_f, on_input))


def count(cfg: IA3Config, shape) -> tuple[int, int]:
    """One vector per linear: its output's size, its input's on the FFN output layer."""
    n = sum((in_f if site == "output" else out_f) * times
            for site, in_f, out_f, times in linears_of(shape.config, shape.arch, cfg.targets, cfg.layers))
    return n, n


def fits(cfg: IA3Config, config, arch) -> None:
    arch.sites(cfg.targets)


def peft(cfg: IA3Config, target):
    """The vector on `output` rescales its input: peft's feedforward module."""
    import peft

    inputs = [site for site in target.arch.sites(cfg.targets) if site == "output"]
    return peft.IA3Config(target_modules=target.sites(cfg.layers, cfg.targets), **target.with_head,
                          feedforward_modules=target.sites(cfg.layers, inputs) if inputs else [])


METHOD = register(Method(IA3Config, build, count, order=30, fits=fits, peft=peft, peft_names={"ia3_l": "scale"}))

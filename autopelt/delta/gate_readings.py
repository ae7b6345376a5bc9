"""Reading UniPELT's gate values: forward hooks observe the gates; nothing is stored inside a forward."""

from __future__ import annotations

from collections import defaultdict
from contextlib import contextmanager

import torch
from torch import nn

from autopelt.delta.modules.decoder import LayerGates
from autopelt.delta.modules.gate import Gate


@contextmanager
def recording_gates(model: nn.Module):
    """Within the block, every gate's output is summed per (kind, layer); yields the accumulator."""
    totals: dict[tuple[str, int], list[float]] = defaultdict(lambda: [0.0, 0])

    def observe(gate: Gate, _inputs, output: torch.Tensor) -> None:
        entry = totals[(gate.kind, gate.layer)]
        entry[0] += float(output.detach().float().reshape(output.shape[0], -1).mean(dim=-1).sum())  # per-token too
        entry[1] += output.shape[0]

    def observe_layers(gates, _inputs, output: torch.Tensor) -> None:  # a decoder's prefix: (layers, heads)
        for layer, value in zip(gates.layers, output.detach().float().mean(dim=-1)):
            entry = totals[(gates.kind, layer)]
            entry[0], entry[1] = entry[0] + float(value), entry[1] + 1

    handles = [m.register_forward_hook(observe) for m in model.modules() if isinstance(m, Gate)]
    handles += [m.register_forward_hook(observe_layers) for m in model.modules() if isinstance(m, LayerGates)]
    try:
        yield totals
    finally:
        for handle in handles:
            handle.remove()


def has_gates(model: nn.Module) -> bool:
    return any(isinstance(module, (Gate, LayerGates)) for module in model.modules())


def summarise_gates(totals) -> dict[str, dict[str, float]]:
    """{kind: {layer: mean gate value}}: what the result JSON and the report's heat map show."""
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for (kind, layer), (total, count) in sorted(totals.items()):
        out[kind][str(layer)] = total / max(count, 1)
    return dict(out)


def gate_values(model: nn.Module, batch: dict) -> dict[str, dict[str, float]]:
    """Mean gate value per method and layer on one batch (eval mode, no gradients)."""
    with torch.no_grad(), recording_gates(model) as totals:
        model(**batch)
    return summarise_gates(totals)

"""AdaMix's mixture of projections: M experts, one active per training step, their average at inference."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MixtureLinear(nn.Module):
    """M stacked linear experts. Training uses `active` (set by `route`); eval uses the mean of the experts,
    which has the size and FLOPs of one linear layer (AdaMix's merging)."""

    def __init__(self, in_features: int, out_features: int, experts: int, bias: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(experts, out_features, in_features))
        self.bias = nn.Parameter(torch.zeros(experts, out_features)) if bias else None
        self.active = 0

    @property
    def experts(self) -> int:
        return self.weight.shape[0]

    def route(self, generator: torch.Generator) -> None:
        self.active = int(torch.randint(self.experts, (1,), generator=generator))

    def merged(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        bias = self.bias.mean(0) if self.bias is not None else None
        return self.weight.mean(0), bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            bias = self.bias[self.active] if self.bias is not None else None
            return F.linear(x, self.weight[self.active], bias)
        return F.linear(x, *self.merged())

    def stored_state(self) -> dict[str, torch.Tensor]:
        """The merged expert, under nn.Linear's names: what a saved delta holds."""
        weight, bias = self.merged()
        return {"weight": weight} if bias is None else {"weight": weight, "bias": bias}


def init_experts_(mixture: MixtureLinear, generator: torch.Generator, zero: bool = False, copy: bool = True) -> None:
    """Kaiming-uniform experts (zero for an up-projection): one draw copied into every expert, as AdaMix's code
    deep-copies one module, or with `copy=False` one draw per expert."""
    with torch.no_grad():
        if zero:
            mixture.weight.zero_()
        else:
            bound = (1.0 / mixture.weight.shape[-1]) ** 0.5
            draw = torch.empty(mixture.weight.shape[1:] if copy else mixture.weight.shape)
            mixture.weight.copy_(draw.uniform_(-bound, bound, generator=generator).expand_as(mixture.weight))
        if mixture.bias is not None:
            mixture.bias.zero_()


def route_all(model: nn.Module, generator: torch.Generator) -> None:
    """Draw one expert per mixture for the next training step, from an explicit generator."""
    for module in model.modules():
        if isinstance(module, MixtureLinear):
            module.route(generator)


def has_mixtures(model: nn.Module) -> bool:
    return any(isinstance(m, MixtureLinear) for m in model.modules())


def consistency_loss(logits_a: torch.Tensor, logits_b: torch.Tensor) -> torch.Tensor:
    """AdaMix's regulariser between two stochastic passes: (KL(sg q || p) + KL(sg p || q)) / 2.

    Each pass is pulled towards the other's detached prediction, as `symmetric_KL_loss` in AdaMix's code: the value is
    the symmetric KL divergence, the gradient does not flow into either target.
    """
    if logits_a.shape[-1] == 1:  # regression, where a KL over one logit is zero: the squared distance instead
        return 0.5 * (F.mse_loss(logits_a, logits_b.detach()) + F.mse_loss(logits_b, logits_a.detach()))
    log_p, log_q = F.log_softmax(logits_a, -1), F.log_softmax(logits_b, -1)
    towards_q = F.kl_div(log_p, log_q.detach(), log_target=True, reduction="batchmean")  # KL(sg q || p)
    towards_p = F.kl_div(log_q, log_p.detach(), log_target=True, reduction="batchmean")  # KL(sg p || q)
    return 0.5 * (towards_q + towards_p)

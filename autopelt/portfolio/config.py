"""A configuration: a whole trial recipe (a delta spec, an absolute learning rate, a batch size, the backbone's
dropout, the classifier head's rate scale), as a portfolio file and the meta-dataset's design name it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Config:
    """One configuration of the design; `layers` "upper_half" is resolved per model (the upper half of its layers)."""

    name: str
    methods: tuple[dict, ...]
    learning_rate: float
    batch_size: int = 32
    pooling: str = "mean"
    layers: str | None = None
    backbone_dropout: str = "model"
    tags: tuple[str, ...] = field(default=())
    head_lr_scale: float = 1.0  # the classifier head's rate is learning_rate x this (TrialSettings.head_lr_scale)

    def spec(self, num_layers: int) -> dict:
        methods = [dict(m) for m in self.methods]
        if self.layers == "upper_half":
            upper = list(range(num_layers // 2, num_layers))
            methods = [{**m, "layers": upper} for m in methods]
        return {"methods": methods, "pooling": self.pooling}

    def to_dict(self) -> dict:
        return {"name": self.name, "methods": list(self.methods), "learning_rate": self.learning_rate,
                "batch_size": self.batch_size, "pooling": self.pooling, "layers": self.layers,
                "backbone_dropout": self.backbone_dropout,
                **({"head_lr_scale": self.head_lr_scale} if self.head_lr_scale != 1 else {})}


def rate_text(rate: float) -> str:
    """3e-3, not 0.003: how a rate is written in a configuration's name."""
    mantissa, exponent = f"{rate:e}".split("e")
    return f"{float(mantissa):g}e{int(exponent)}"

"""Portfolio configurations the product's tests queue, written out (the lab's design names them the same way,
lab/metalearning/design.py; the product's tests never import the lab)."""

from __future__ import annotations

from autopelt.portfolio.config import Config

_QV, _QV_FFN = ["query", "value"], ["query", "value", "intermediate", "output"]
_LORA = {"method": "lora", "rank": 8, "alpha": 16, "targets": _QV}
_PFEIFFER = {"method": "adapter", "placement": "pfeiffer", "bottleneck": 48}

BY_NAME = {config.name: config for config in (
    Config("lora-r8-qv@3e-3", (_LORA,), 3e-3),
    Config("lora-r8-qv-b16@2e-3", (_LORA,), 2e-3, batch_size=16),
    Config("lora-r8-qv-ffn-b16@2e-3", ({**_LORA, "targets": _QV_FFN},), 2e-3, batch_size=16),
    Config("lora+bitfit@3e-3", (_LORA, {"method": "bitfit"}), 3e-3),
    Config("pfeiffer-48@1e-3", (_PFEIFFER,), 1e-3),
    Config("pfeiffer-48@3e-3", (_PFEIFFER,), 3e-3),
)}

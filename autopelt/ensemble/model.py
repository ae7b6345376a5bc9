"""An ensemble on one backbone load: the base model is read from disk once; members of one structure share one
copy of it with their delta applied, and each member's delta tensors are swapped in before its forward pass.

The output is the weighted average of the members' class probabilities (or values for a regression), given as
`logits = log(average probabilities)`, so that softmax of the output is the ensemble's probabilities and code
written for one model (autopelt.export.predict.predict) runs an ensemble unchanged. Cost at inference: one
forward pass a member. Memory: one copy of the backbone a distinct member structure (the backbone's weights are
the same in every copy; only the deltas differ).
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from types import SimpleNamespace

from autopelt.errors import UserError


class EnsembleModel:
    """The members of an ensemble folder, ready to predict (eval mode, nothing trainable).

    Attributes:
        header: what `autopelt predict` reads of the task (task, text_columns, label_names, base_model, …).
        weights: the members' weights (sum 1); `forward_passes`: members a prediction runs.
    """

    def __init__(self, folder, model=None):
        import torch

        from autopelt import delta
        from autopelt.ensemble.folder import read_manifest
        from autopelt.models import load_model, resolve_model

        folder = Path(folder)
        manifest = read_manifest(folder)
        name = resolve_model(str(model) if model is not None else manifest.get("base_model"))
        base = load_model(name, manifest["num_labels"], manifest.get("problem_type"))  # the one backbone load
        self.header = {**manifest, "base_model": name}
        self.weights = [float(m["weight"]) for m in manifest["members"]]
        total = sum(self.weights)
        self.weights = [w / total for w in self.weights]
        self.copies: dict[str, torch.nn.Module] = {}  # stored spec (as JSON) -> the base with that delta applied
        self.members: list[tuple[str, dict]] = []  # (structure key, delta tensors by parameter name)
        for member in manifest["members"]:
            member_dir = folder / member["folder"]
            header = delta.read_delta_header(member_dir)
            key = repr(header["spec"])
            if key not in self.copies:
                self.copies[key] = delta.load_delta(copy.deepcopy(base), member_dir).eval().requires_grad_(False)
            self.members.append((key, _tensors(self.copies[key], member_dir)))
        del base

    @property
    def forward_passes(self) -> int:
        return len(self.members)

    def __call__(self, **batch):
        """SimpleNamespace(logits=…): log of the averaged probabilities (rows, classes), or the averaged values
        (rows, 1) of a regression."""
        import torch

        total = None
        with torch.no_grad():
            for (key, tensors), weight in zip(self.members, self.weights):
                model = self.copies[key]
                params = dict(model.named_parameters())
                for name, tensor in tensors.items():
                    params[name].copy_(tensor)
                logits = model(**batch).logits.float()
                part = logits if logits.shape[-1] == 1 else logits.softmax(-1)
                total = part * weight if total is None else total + part * weight
        if total.shape[-1] == 1:
            return SimpleNamespace(logits=total)
        return SimpleNamespace(logits=total.clamp_min(math.ulp(0.0)).log())

    def eval(self):
        return self


def _tensors(model, member_dir: Path) -> dict:
    from safetensors.torch import load_file

    from autopelt.delta.io import WEIGHTS_FILE

    weights = load_file(str(member_dir / WEIGHTS_FILE))
    params = dict(model.named_parameters())
    unknown = sorted(set(weights) - set(params))
    if unknown:
        raise UserError(f"{member_dir / WEIGHTS_FILE} does not match its spec (first mismatch: {unknown[0]})")
    return weights

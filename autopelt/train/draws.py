"""The draws a piece of code makes from torch's global CPU generator, recorded once and replayed for another seed.

Loading a model draws from the global generator (transformers initialises every module before it reads the
checkpoint over it), so the random state a trial's dropout and delta start from is the seed's state advanced by
those draws. A warm worker that hands out a held model instead of loading it replays the draws on empty tensors of
the same shapes: the same kernels consume the same numbers of values, so the generator ends in the state a load
would have left, for any seed.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class Draws(TorchDispatchMode):
    """Inside `with Draws() as draws:`, every random op on the global CPU generator is recorded (`draws.ops`).
    `replayable` turns False at an op a replay could not repeat exactly: one reading other tensors, or drawing on
    another device (whose generator a replay would not advance)."""

    def __init__(self):
        super().__init__()
        self.ops: list[tuple] = []
        self.replayable = True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.Tag.nondeterministic_seeded in func.tags and kwargs.get("generator") is None:
            self._record(func, args, kwargs)
        return func(*args, **kwargs)

    def _record(self, func, args, kwargs) -> None:
        target = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if target is not None and target.device.type == "meta":
            return  # nothing is drawn for a tensor without storage
        rest = (args[1:], kwargs) if target is not None else (args, kwargs)
        device = target.device if target is not None else torch.device(kwargs.get("device") or "cpu")
        if device.type != "cpu" or any(isinstance(leaf, torch.Tensor) for leaf in tree_leaves(rest)):
            self.replayable = False
            return
        meta = (tuple(target.shape), target.dtype) if target is not None else None
        self.ops.append((func, meta, tuple(rest[0]), dict(kwargs)))


def replayed(ops: list[tuple], seed: int) -> torch.Tensor:
    """The global CPU generator's state after seeding it with `seed` and making the draws `ops` (`Draws.ops`);
    the generator itself is left as it was."""
    generator = torch.default_generator
    saved = generator.get_state()
    try:
        generator.manual_seed(seed)
        for func, meta, args, kwargs in ops:
            if meta is None:
                func(*args, **kwargs)
            else:
                func(torch.empty(meta[0], dtype=meta[1]), *args, **kwargs)
        return generator.get_state()
    finally:
        generator.set_state(saved)

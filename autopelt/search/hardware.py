"""What this machine offers a search's trials: its CPU cores and each CUDA GPU's name and memory (`Hardware`), read
once by `probe` and passed into the resource decision (resources.py), so that the decision reads no device itself and
is tested with any machine described."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Gpu:
    name: str  # as the driver names it: "NVIDIA H200"
    total_bytes: int
    free_bytes: int  # free when probed: other processes' memory is not the search's


@dataclass(frozen=True)
class Hardware:
    cpus: int
    gpus: tuple[Gpu, ...] = ()

    def line(self) -> str:
        """`16 CPU cores, 1 GPU (NVIDIA H200, 139 of 140 GiB free)`: what a plan's note says it was given."""
        cores = f"{self.cpus} CPU core{'s' if self.cpus != 1 else ''}"
        if not self.gpus:
            return f"{cores}, no CUDA GPU"
        names = sorted({gpu.name for gpu in self.gpus})
        free = sum(gpu.free_bytes for gpu in self.gpus) / 2**30
        total = sum(gpu.total_bytes for gpu in self.gpus) / 2**30
        return (f"{cores}, {len(self.gpus)} GPU{'s' if len(self.gpus) > 1 else ''} ({', '.join(names)}, "
                f"{free:.0f} of {total:.0f} GiB free)")


def probe() -> Hardware:
    """This machine as a local search sees it: the cores this process may run on, and each visible CUDA GPU's name,
    total and free memory (asking opens a CUDA context on each GPU in this process, as gpu_share's measured step
    does on the first)."""
    import torch

    gpus = []
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            free, total = torch.cuda.mem_get_info(index)
            gpus.append(Gpu(torch.cuda.get_device_name(index), int(total), int(free)))
    return Hardware(cpu_count(), tuple(gpus))


def cpu_count() -> int:
    """The cores this process may run on (its affinity, where the system says; a container's CPU set), else all."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1

"""The device a trial runs on, mixed precision, and peak memory: nothing here assumes a CPU."""

from __future__ import annotations

import contextlib
import os
import resource
import sys
import threading

import torch


def pick_device(requested: str | None) -> torch.device:
    """The requested device, else the first CUDA device Ray (or CUDA_VISIBLE_DEVICES) gives us, else CPU."""
    if requested:
        return torch.device(requested)
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def autocast_dtype(device: torch.device, enabled: bool) -> torch.dtype | None:
    if not enabled or device.type != "cuda":
        return None
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


def autocast(device: torch.device, dtype: torch.dtype | None):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def grad_scaler(device: torch.device, dtype: torch.dtype | None):
    """fp16 needs loss scaling; bf16 and fp32 do not."""
    return torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)


class PeakMemory:
    """Peak memory of one trial, in MiB: CUDA's allocator counter, reset at the start; on a CPU, resident memory
    sampled every `every` seconds by a daemon thread. (The process's own maximum would not do: a reused Ray
    worker runs many trials, and it would carry every earlier trial's peak.)"""

    def __init__(self, device: torch.device, every: float = 0.05):
        self.device, self.every = device, every
        self._peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self._peak = resident_bytes()
            self._thread = threading.Thread(target=self._sample, name="autopelt-peak-memory", daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.every):
            self._peak = max(self._peak, resident_bytes())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    @property
    def mb(self) -> float:
        if self.device.type == "cuda":
            return torch.cuda.max_memory_allocated(self.device) / 2**20
        return max(self._peak, resident_bytes()) / 2**20


def resident_bytes() -> int:
    """This process's resident memory now (Linux), else its peak so far (the best other systems offer)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere


OUT_OF_MEMORY_TEXTS = ("out of memory", "can't allocate memory", "not enough memory")  # CUDA, CPU (POSIX, Windows)


def is_out_of_memory(error: BaseException) -> bool:
    text = str(error).lower()
    return isinstance(error, (MemoryError, torch.OutOfMemoryError)) or any(t in text for t in OUT_OF_MEMORY_TEXTS)

"""The device a trial runs on, mixed precision, and peak memory: nothing here assumes a CPU."""

from __future__ import annotations

import contextlib
import resource
import sys

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


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory_mb(device: torch.device) -> float:
    """Peak CUDA memory of this trial, or the process's peak resident memory on a CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB on Linux


OUT_OF_MEMORY_TEXTS = ("out of memory", "can't allocate memory", "not enough memory")  # CUDA, CPU (POSIX, Windows)


def is_out_of_memory(error: BaseException) -> bool:
    text = str(error).lower()
    return isinstance(error, (MemoryError, torch.OutOfMemoryError)) or any(t in text for t in OUT_OF_MEMORY_TEXTS)

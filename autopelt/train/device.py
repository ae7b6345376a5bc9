"""The device a trial runs on, mixed precision, and peak memory: nothing here assumes a CPU."""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import re
import resource
import sys
import threading
import time

import torch
from torch import nn

from autopelt.errors import UserError
from autopelt.train.settings import PRECISIONS


def pick_device(requested: str | None) -> torch.device:
    """The requested device, else the first CUDA device Ray (or CUDA_VISIBLE_DEVICES) gives us, else CPU."""
    if requested:
        return torch.device(requested)
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_precision(requested: str, device: torch.device) -> str:
    """The precision a trial runs in: `auto` is bf16 where `device` computes it natively and faster, else fp32;
    the others are taken as asked (bf16 on a CPU without native support works, but slower than fp32)."""
    if requested not in PRECISIONS:
        raise UserError(f"precision must be one of {', '.join(PRECISIONS)}, not {requested!r}")
    if requested != "auto":
        return requested
    return "bf16" if bf16_pays(device) else "fp32"


def bf16_pays(device: torch.device) -> bool:
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported(including_emulation=False)
    if device.type == "cpu":
        return cpu_bf16_pays()
    return False


BF16_SPEEDUP = 1.25  # a CPU computes in bf16 by default only if its bf16 matmul is at least this much faster


def cpu_bf16_pays() -> bool:
    """The CPU has AVX512-BF16 or AMX, and a bf16 matmul of a training step's shape is measured at least
    BF16_SPEEDUP times as fast as fp32's.

    The flags alone do not tell: on an Intel Xeon VM that reports AVX512-BF16 but no AMX, oneDNN's bf16 kernel
    took twice fp32's time (29 against 14 ms for 4096x384 @ 384x1536 on 2 threads) and whole steps 1.2-1.7x,
    while on an AMD EPYC with AVX512-BF16 a step took half."""
    speedup = cpu_bf16_speedup()
    return speedup is not None and speedup >= BF16_SPEEDUP


SPEEDUP_ENV = "AUTOPELT_CPU_BF16_SPEEDUP"  # the speedup measured elsewhere on this machine ("none": no native bf16)


@functools.cache
def cpu_bf16_speedup() -> float | None:
    """This CPU's bf16 matmul speed over fp32's, timed once per process; None, and nothing timed, without
    native bf16. A search measures it once, before its local workers start, and hands it to them in SPEEDUP_ENV,
    so that every trial on the machine makes the same choice (trials timing it beside each other could differ)."""
    given = os.environ.get(SPEEDUP_ENV)
    if given:
        try:
            return None if given.lower() == "none" else float(given)
        except ValueError:
            raise UserError(f"{SPEEDUP_ENV} must be a number or 'none', not {given!r}") from None
    return bf16_matmul_speedup() if cpu_has_native_bf16() else None


def share_cpu_bf16_speedup() -> None:
    """Measure the CPU's bf16 speedup here, once, and put it in the environment that local workers inherit."""
    speedup = cpu_bf16_speedup()
    os.environ.setdefault(SPEEDUP_ENV, "none" if speedup is None else f"{speedup:.3f}")


def bf16_matmul_speedup(rows: int = 4096, width: int = 384, out: int = 1536, rounds: int = 5) -> float:
    """fp32's time over bf16's for one linear layer on the CPU (a batch of 32 x 128 tokens through a MiniLM FFN
    by default), the best of `rounds` interleaved calls each, after one warm-up call; about 0.3 s on two
    threads, 0.5 s on one. Draws from its own generator, so the global RNG, and with it every trial, is
    untouched. 0.0 where this torch cannot compute the bf16 matmul at all."""
    generator = torch.Generator().manual_seed(0)
    inputs, weight = torch.randn(rows, width, generator=generator), torch.randn(out, width, generator=generator)
    pairs = {"fp32": (inputs, weight), "bf16": (inputs.bfloat16(), weight.bfloat16())}
    best = {name: float("inf") for name in pairs}
    try:
        with torch.inference_mode():
            for round_ in range(max(rounds, 1) + 1):
                for name, (a, b) in pairs.items():
                    start = time.perf_counter()
                    nn.functional.linear(a, b)
                    if round_:  # round 0 warms up
                        best[name] = min(best[name], time.perf_counter() - start)
    except RuntimeError:  # no bf16 kernel in this build
        return 0.0
    return best["fp32"] / best["bf16"]


@functools.cache
def cpu_has_native_bf16() -> bool:
    """AVX512-BF16 or AMX on this CPU (asked once): bf16 is not emulated there, though not always faster."""
    probes = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    if all(probe is not None for probe in probes):
        return any(probe() for probe in probes)
    return bool(_cpuinfo_flags() & {"avx512_bf16", "amx_bf16"})  # torch without its probes: Linux's view


def cpu_precision_note() -> str:
    """What `auto` makes of this CPU, for benchmark headers: its flags, the measured bf16 speed, the choice."""
    speedup = cpu_bf16_speedup()
    if speedup is None:
        return f"CPU {torch.backends.cpu.get_cpu_capability()}, no native bf16: auto = fp32"
    return (f"CPU {torch.backends.cpu.get_cpu_capability()} with native bf16, a bf16 matmul {speedup:.2f}x "
            f"fp32's speed: auto = {'bf16' if cpu_bf16_pays() else 'fp32'}")


def _cpuinfo_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The autocast dtype of a resolved precision; None for fp32 (no autocast)."""
    return _DTYPES.get(precision)


def autocast(device: torch.device, dtype: torch.dtype | None):
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def load_dtype(precision: str) -> torch.dtype:
    """The dtype a resolved precision's frozen linear weights are loaded in: its autocast dtype, fp32 without."""
    return _DTYPES.get(precision, torch.float32)


def allow_tf32(device: torch.device, dtype: torch.dtype | None) -> bool:
    """fp32 on a CUDA card with TF32 (compute capability 8.0 and later): its matmuls and convolutions in TF32 (a
    10-bit mantissa, fp32's range: torch's "high" float32 matmul precision), several times fp32's speed there.
    Nothing changes on a CPU, at bf16 or fp16, or on an older card. Whether it was turned on."""
    if device.type != "cuda" or dtype is not None or torch.cuda.get_device_capability(device) < (8, 0):
        return False
    torch.set_float32_matmul_precision("high")  # torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = True
    return True


def grad_scaler(device: torch.device, dtype: torch.dtype | None):
    """fp16 needs loss scaling; bf16 and fp32 do not."""
    return torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)


def clip_and_step(optimiser, scaler, params, grad_clip: float) -> None:
    """One optimiser step from the gradients a backward of the (scaled) loss left, both loops' own: under fp16's
    loss scale (a step whose gradients overflow is skipped and the scale backs off; `grad_scaler` is disabled, a
    no-op, at bf16 and fp32), the gradients unscaled before they are clipped to `grad_clip`."""
    scaler.unscale_(optimiser)
    torch.nn.utils.clip_grad_norm_(params, grad_clip)
    scaler.step(optimiser)
    scaler.update()


def rng_state(device: torch.device) -> dict:
    """The global random state a training run draws dropout from (the device's own too, on CUDA)."""
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(device: torch.device, state: dict) -> None:
    torch.set_rng_state(state["cpu"])
    if "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


class PeakMemory:
    """Peak memory of one trial, in MiB: on the host, resident memory (`host_mb`); on CUDA, also the allocator's
    counter, reset at the start (`device_mb`); `mb` is the device's where there is one, else the host's.

    The host's peak is the process's own maximum (ru_maxrss, exact, counted by the kernel) where it rose during
    the trial: then the trial reached it. Where it did not (a reused Ray worker whose earlier trial, or a first
    load, set a higher maximum), it is the resident memory sampled every `every` seconds by a daemon thread,
    which can miss a spike shorter than that. `host_by` says which ("ru_maxrss" or "sampled")."""

    def __init__(self, device: torch.device, every: float = 0.05):
        self.device, self.every = device, every
        self._peak = 0
        self._maxrss_before = self._maxrss_after = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self._maxrss_before = max_resident_bytes()
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
        self._peak = max(self._peak, resident_bytes())
        self._maxrss_after = max_resident_bytes()

    @property
    def host_by(self) -> str:
        before, after = self._maxrss_before, self._maxrss_after
        return "ru_maxrss" if None not in (before, after) and after > before else "sampled"

    @property
    def host_mb(self) -> float:
        return (self._maxrss_after if self.host_by == "ru_maxrss" else self._peak) / 2**20

    @property
    def device_mb(self) -> float | None:
        if self.device.type != "cuda":
            return None
        return torch.cuda.max_memory_allocated(self.device) / 2**20

    @property
    def mb(self) -> float:
        device = self.device_mb
        return self.host_mb if device is None else device

    def record(self) -> dict:
        """What a trial's result holds: `peak_memory_mb` (as `mb`), `peak_host_memory_mb`, `peak_device_memory_mb`
        (None without CUDA) and `peak_host_memory_by`."""
        return {"peak_memory_mb": self.mb, "peak_host_memory_mb": self.host_mb,
                "peak_device_memory_mb": self.device_mb, "peak_host_memory_by": self.host_by}


def max_resident_bytes() -> int | None:
    """This process's peak resident memory so far (ru_maxrss), in bytes; None where the system has no such count."""
    try:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    except (AttributeError, OSError, ValueError):
        return None
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB elsewhere


def resident_bytes() -> int:
    """This process's resident memory now (Linux), else its peak so far (the best other systems offer)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return max_resident_bytes() or 0


OUT_OF_MEMORY_TEXTS = ("out of memory", "can't allocate memory", "not enough memory")  # CUDA, CPU (POSIX, Windows)


# where torch's out-of-memory message turns to per-process accounting and allocator advice
OUT_OF_MEMORY_DETAIL = (r" (?=Process \d+ has|Including non-PyTorch memory|[\d.]+ \w+ allowed;|Of the allocated memory"
                        r"|If reserved)")


def is_out_of_memory(error: BaseException) -> bool:
    text = str(error).lower()
    return isinstance(error, (MemoryError, torch.OutOfMemoryError)) or any(t in text for t in OUT_OF_MEMORY_TEXTS)


def out_of_memory_reason(error: BaseException, device: torch.device) -> str:
    """One line for a trial that did not fit: what ran out, and what to change."""
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    allowed = re.search(r"([\d.]+ \w+) allowed;", first)  # the process's memory limit (a share of a GPU)
    first = re.split(OUT_OF_MEMORY_DETAIL, first)[0]  # per-process accounting and allocator advice: not the point
    if allowed:
        first += f" This trial may use {allowed.group(1)}."
    remedy = ("lower --batch-size or --max-length, or raise --gpus-per-trial so that fewer trials share a GPU"
              if device.type == "cuda"
              else "lower --batch-size or --max-length, or run fewer --workers at once")
    return f"out of memory: {first} ({remedy})"


def gpu_memory_bytes() -> int | None:
    """The first visible GPU's memory (a Ray trial's own GPU), or None without CUDA."""
    return int(torch.cuda.get_device_properties(0).total_memory) if torch.cuda.is_available() else None


def limit_gpu_memory(fraction: float) -> None:
    """Hold this process to `fraction` of the current GPU's memory. Trials sharing a GPU are separate processes,
    and PyTorch's caching allocator keeps the blocks a trial freed for itself: without a limit, one trial's cache
    can take the memory another trial needs next. At its limit the allocator gives its cached blocks back and tries
    again before it reports out of memory."""
    torch.cuda.set_per_process_memory_fraction(min(1.0, fraction))


def release_memory() -> None:
    """Give back what a finished trial held: Python's garbage now, the C heap's free pages to the system (glibc's
    `malloc_trim`: a reused worker's resident memory otherwise climbs from trial to trial, freed but not returned),
    and CUDA's cached blocks to the device, so the next trial on this worker (or another process on the GPU)
    starts from the memory a fresh one would."""
    gc.collect()
    trim_host_heap()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


@functools.lru_cache(maxsize=1)
def _glibc():
    """The C library when it is glibc (it has `malloc_trim`), else None (musl, macOS, Windows)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def trim_host_heap() -> bool:
    """Return the C heap's free memory to the system where the C library can (glibc); whether it could."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


def trial_precision(settings, device) -> str:
    """What a trial computes in: bf16 over a 4-bit base (autopelt/quantize.py `COMPUTE_PRECISION`), else its
    `precision` resolved on `device`."""
    from autopelt.quantize import COMPUTE_PRECISION

    return COMPUTE_PRECISION if settings.quantize else resolve_precision(settings.precision, device)

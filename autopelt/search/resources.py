"""How many trials a search runs at once and what each gets of the machine or cluster: CPU threads, a share of a GPU
(by one measured step: gpu_share.py), and a one-line refusal where a trial would ask for more than a local machine
has. The machine comes in as a `hardware.Hardware` (probed once, or described by a test); nothing here reads a device.

Without `--workers`, a local machine with CUDA GPUs runs as many trials as fit in its GPUs' free memory by one
measured step and as its CPU cores feed (`CPUS_PER_GPU_TRIAL` a trial, beside the search's own process); a machine
without one runs one trial at a time on all its cores; a Ray cluster runs one trial per GPU it has
(`cluster_placement`), else one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from autopelt.errors import UserError
from autopelt.search import gpu_share
from autopelt.search.hardware import Hardware
from autopelt.train.settings import TrialSettings

if TYPE_CHECKING:
    from autopelt.search.options import SearchOptions

CPUS_PER_GPU_TRIAL = 1  # cores feeding one GPU trial: the meta-dataset's collector ran 15 one-core trials on a
#                         16-core H200 at 93% mean GPU utilisation (docs/speed.md)
DRIVER_CPUS = 1  # the search's own process (the controller, Ray's driver) beside its GPU trials


@dataclass(frozen=True)
class Placement:
    """Trials at once, and what each gets; `note` says why in one line ("" where nothing was decided here)."""

    workers: int
    cpus_per_trial: float
    gpus_per_trial: float
    note: str = ""


@dataclass(frozen=True)
class StepProbe:
    """The step a trial's GPU memory is measured on: its shape, as said, and the measurement (bytes; raises where
    the step fails, out of memory say). Called at most once, and only where a GPU decision needs it."""

    shape: str  # "batch 32 x 128 tokens"
    measure: Callable[[], int]


def trial_step(options: SearchOptions, model: str, num_labels: int, generation: bool, space) -> StepProbe:
    """The study's heaviest usual step (gpu_share.py): `--batch-size`/`--max-length` where given, else the space's
    largest batch size and sequence length, at the trials' precision, on the first GPU."""
    train = space.tree.train
    batch = options.batch_size or gpu_share.largest(train.get("batch_size"), TrialSettings.batch_size)
    length = options.max_length or gpu_share.largest(train.get("max_length"), TrialSettings.max_length)
    return StepProbe(f"batch {batch} x {length} tokens", lambda: gpu_share.measure_trial_bytes(
        model, num_labels, generation, batch, length, options.precision, eval_batch_size=TrialSettings.eval_batch_size))


def place(options: SearchOptions, hardware: Hardware, step: StepProbe) -> Placement:
    """Workers, CPU threads and GPU share of each trial: as asked; the rest decided as the module doc says. On a
    Ray cluster the plan's placement is provisional until the cluster is reached (`cluster_placement`)."""
    if options.ray_address:
        return Placement(options.workers or 1, options.cpus_per_trial or 1, options.gpus_per_trial or 0)
    if options.workers is None:
        return _default_placement(options, hardware, step)
    share, note = _gpu_share(options, options.workers, hardware, step)
    cpus = options.cpus_per_trial or max(1, hardware.cpus // options.workers)
    return Placement(options.workers, cpus, share, note)


def _default_placement(options: SearchOptions, hardware: Hardware, step: StepProbe) -> Placement:
    if not hardware.gpus or options.gpus_per_trial == 0:  # as before there was a choice: the header's "1 worker"
        return Placement(1, options.cpus_per_trial or hardware.cpus, 0)
    feed = options.cpus_per_trial or CPUS_PER_GPU_TRIAL
    by_cpu = max(1, int((hardware.cpus - DRIVER_CPUS) // feed))
    need, failed = _measured(step)
    if need is None:
        workers = min(len(hardware.gpus), by_cpu)
        why = f"one trial a GPU, unmeasured: a training step at {step.shape} failed ({failed})"
    else:
        by_memory = sum(gpu_share.trials_fitting(gpu.free_bytes, need) for gpu in hardware.gpus)
        workers = max(1, min(by_memory, by_cpu))
        why = (f"{by_memory} fit in the GPUs' free memory at {need / 2**30:.1f} GiB a trial ({step.shape}); the cores "
               f"feed {by_cpu} at {feed:g} a trial beside the search's own")
    if options.gpus_per_trial:  # a share asked for: no more trials than those shares on the GPUs
        workers = max(1, min(workers, int(len(hardware.gpus) // options.gpus_per_trial)))
        share = options.gpus_per_trial
    else:
        share = 1 / math.ceil(workers / len(hardware.gpus))
    cpus = options.cpus_per_trial or max(1, hardware.cpus // workers)
    note = f"{workers} worker{'s' if workers > 1 else ''} on {hardware.line()}: {why} (--workers to choose)"
    return Placement(workers, cpus, share, note)


def _gpu_share(options: SearchOptions, workers: int, hardware: Hardware, step: StepProbe) -> tuple[float, str]:
    """(share, a line saying why) for `workers` given: as asked; else the local GPUs shared among the workers, as
    many trials on one as fit in its memory by one measured step (`gpu_share`); 0 without a GPU."""
    if options.gpus_per_trial is not None:
        return options.gpus_per_trial, ""
    gpus = len(hardware.gpus)
    if not gpus:
        return 0, ""
    if math.ceil(workers / gpus) == 1:
        return 1, ""
    need, failed = _measured(step)
    if need is None:
        per_gpu = gpu_share.trials_per_gpu(workers, gpus, None, None)
        return 1 / per_gpu, (f"{per_gpu} trials share a GPU, unmeasured: a training step at {step.shape} failed "
                             f"({failed}; --gpus-per-trial to choose)")
    total = hardware.gpus[0].total_bytes
    per_gpu = gpu_share.trials_per_gpu(workers, gpus, need, total)
    return 1 / per_gpu, (f"{per_gpu} trials share a GPU: a training step at {step.shape} took "
                         f"{need / 2**30:.1f} GiB of the GPU's {total / 2**30:.0f} (--gpus-per-trial to choose)")


def _measured(step: StepProbe) -> tuple[int | None, str]:
    """(bytes, "") or (None, the failure's first line): a trial that does not fit says so itself, with the OOM
    line, so a failed measurement only leaves the decision unmeasured."""
    try:
        return step.measure(), ""
    except Exception as error:  # noqa: BLE001 - see the docstring
        return None, (str(error).strip().splitlines() or [type(error).__name__])[0][:120]


def cluster_placement(workers_given: bool, gpus_given: bool, cluster: dict,
                      current: Placement) -> tuple[Placement, str]:
    """On a Ray cluster (`cluster`: `ray.cluster_resources()`), without `--workers` and `--gpus-per-trial`: one
    trial per GPU the cluster has, each on one GPU; else `current`. Also a warning line ("" for none) when the
    cluster has GPUs that the trials would not get."""
    gpus = int(cluster.get("GPU", 0))
    placement = current
    if not workers_given and not gpus_given and gpus:
        placement = Placement(gpus, current.cpus_per_trial, 1,
                              f"{gpus} worker{'s' if gpus > 1 else ''}: the Ray cluster's {gpus} GPU"
                              f"{'s' if gpus > 1 else ''}, one a trial (--workers, --gpus-per-trial to choose)")
    warning = ""
    if gpus and not placement.gpus_per_trial:
        warning = (f"the Ray cluster has {gpus} GPU{'s' if gpus > 1 else ''} but each trial asks for none: pass "
                   f"--gpus-per-trial (1, or a share) to train on them")
    return placement, warning


def check_local(options: SearchOptions, hardware: Hardware) -> None:
    """A trial asking for more than this machine has would wait forever in a local Ray."""
    if options.ray_address:
        return
    if options.cpus_per_trial is not None and options.cpus_per_trial > hardware.cpus:
        raise UserError(f"--cpus-per-trial {options.cpus_per_trial:g}, but this machine has {hardware.cpus} CPUs")
    if options.gpus_per_trial and not hardware.gpus:
        raise UserError(f"--gpus-per-trial {options.gpus_per_trial:g}, but this machine has no CUDA GPU")

"""What each trial of a search gets of the machine or cluster it runs on: CPU threads, a share of a GPU (by one
measured step: gpu_share.py), and a one-line refusal where a trial would ask for more than a local machine has."""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING

from autopelt.errors import UserError
from autopelt.train.settings import TrialSettings

if TYPE_CHECKING:
    from autopelt.search.options import SearchOptions


def cpus_per_trial(options: SearchOptions) -> float:
    """CPU threads a trial gets: as asked; one on a cluster; else this machine's cores shared by the workers."""
    if options.cpus_per_trial is not None:
        return options.cpus_per_trial
    if options.ray_address:
        return 1
    return max(1, (os.cpu_count() or 1) // options.workers)


def gpus_per_trial(options: SearchOptions, model: str, num_labels: int, generation: bool, space) -> tuple[float, str]:
    """(share, a line saying why): as asked; else, on a local machine with CUDA, its GPUs shared among the workers,
    as many trials on one as fit in its memory by one measured step (`gpu_share`), so a GPU machine trains on its
    GPUs without a flag; else 0 (a cluster: say --gpus-per-trial)."""
    if options.gpus_per_trial is not None:
        return options.gpus_per_trial, ""
    if options.ray_address:
        return 0, ""
    gpus = local_gpus()
    if not gpus:
        return 0, ""
    if math.ceil(options.workers / gpus) == 1:
        return 1, ""
    from autopelt.search import gpu_share

    train = space.tree.train
    batch = gpu_share.largest(train.get("batch_size"), TrialSettings.batch_size)
    length = gpu_share.largest(train.get("max_length"), TrialSettings.max_length)
    try:
        need = gpu_share.measure_trial_bytes(model, num_labels, generation, batch, length, options.precision,
                                             eval_batch_size=TrialSettings.eval_batch_size)
    except Exception as error:  # noqa: BLE001 - a trial that does not fit says so itself, with the OOM line
        per_gpu = gpu_share.trials_per_gpu(options.workers, gpus, None, None)
        why = (str(error).strip().splitlines() or [type(error).__name__])[0][:120]
        return 1 / per_gpu, (f"{per_gpu} trials share a GPU, unmeasured: a training step at batch {batch} x {length} "
                             f"tokens failed ({why}; --gpus-per-trial to choose)")
    total = gpu_bytes()
    per_gpu = gpu_share.trials_per_gpu(options.workers, gpus, need, total)
    return 1 / per_gpu, (f"{per_gpu} trials share a GPU: a training step at batch {batch} x {length} tokens took "
                         f"{need / 2**30:.1f} GiB of the GPU's {total / 2**30:.0f} (--gpus-per-trial to choose)")


def check_local(options: SearchOptions, cpus_per_trial: float) -> None:
    """A trial asking for more than this machine has would wait forever in a local Ray."""
    if options.ray_address:
        return
    cpus = os.cpu_count() or 1
    if cpus_per_trial > cpus:
        raise UserError(f"--cpus-per-trial {cpus_per_trial:g}, but this machine has {cpus} CPUs")
    if options.gpus_per_trial and local_gpus() == 0:
        raise UserError(f"--gpus-per-trial {options.gpus_per_trial:g}, but this machine has no CUDA GPU")


def local_gpus() -> int:
    import torch

    return torch.cuda.device_count()


def gpu_bytes() -> int:
    import torch

    return int(torch.cuda.get_device_properties(0).total_memory)

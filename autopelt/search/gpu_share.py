"""How many trials share one GPU when `--gpus-per-trial` is not given: as many as the workers ask for, and at most
as many as fit in its memory by one measured training step.

The step is the study's heaviest usual trial: its model with UniPELT(APL) (LoRA where the family cannot take
UniPELT), a batch of the space's largest batch size at its longest sequence, forward and backward at the trials'
precision, on the first GPU, then an evaluation batch (no gradients, the trials' evaluation batch size: a language
model's logits over its vocabulary can outgrow the training step). The larger peak allocated memory plus a CUDA
context (`CONTEXT_BYTES`, which torch's allocator does not count) is what one trial needs; trials together may fill
`HEADROOM` of the GPU. A trial that still does not fit (a larger delta drawn later) fails with the out-of-memory line
(`train.device.out_of_memory_reason`), recorded, and the study goes on.
"""

from __future__ import annotations

import math

HEADROOM = 0.85  # of a GPU's memory the trials sharing it may fill together (the rest: fragmentation, spikes)
CONTEXT_BYTES = 600 * 2**20  # one process's CUDA context and kernels, outside torch's allocator (typical, assumed)


def trials_per_gpu(workers: int, gpus: int, trial_bytes: int | None, gpu_bytes: int | None) -> int:
    """The workers spread over the GPUs, at most as many on one as fit in its memory (at least one)."""
    wanted = math.ceil(workers / gpus)
    if not trial_bytes or not gpu_bytes:
        return wanted
    fit = int(HEADROOM * gpu_bytes // (trial_bytes + CONTEXT_BYTES))
    return max(1, min(wanted, fit))


def trials_fitting(free_bytes: int, trial_bytes: int) -> int:
    """Trials of `trial_bytes` each (plus a CUDA context) that fit together in `HEADROOM` of a GPU's free memory."""
    return int(HEADROOM * free_bytes // (trial_bytes + CONTEXT_BYTES))


def memory_fraction(share: float, gpu_bytes: int) -> float:
    """The fraction of a GPU's memory a trial given `share` of it may hold in torch's allocator: its part of the
    `HEADROOM` the trials may fill together, less its CUDA context (outside the allocator); never below half the
    share."""
    return max(share * HEADROOM - CONTEXT_BYTES / gpu_bytes, share / 2)


def largest(node, default: int) -> int:
    """The largest value a space's training field (a `space_tree` node, or None when the space leaves it to the
    trial's default) can take."""
    from autopelt.search.space_tree import Choice, Fixed, Range

    if isinstance(node, Fixed):
        values = [node.value]
    elif isinstance(node, Choice):
        values = [option.value for option in node.options]
    elif isinstance(node, Range):
        values = [node.high]
    else:
        values = []
    numbers = [v for v in values if isinstance(v, (int, float))]
    return int(max(numbers)) if numbers else default


def measure_trial_bytes(model: str, num_labels: int, generation: bool, batch_size: int, length: int,
                        precision: str = "auto", device: str = "cuda:0", eval_batch_size: int = 128) -> int:
    """Peak memory (bytes) of one training step and one evaluation batch as described above: allocated CUDA memory
    on a GPU (on a CPU the process's resident memory, `train.device.PeakMemory`)."""
    import torch

    from autopelt.delta import apply_delta
    from autopelt.delta.presets import PRESETS
    from autopelt.delta.spec import with_pooling
    from autopelt.models import load_language_model, load_model
    from autopelt.search.space_models import cannot_apply_preset
    from autopelt.train.device import PeakMemory, autocast, autocast_dtype, release_memory, resolve_precision

    where = torch.device(device)
    network = load_language_model(model) if generation else load_model(model, num_labels)
    preset = "unipelt_apl" if not cannot_apply_preset("unipelt_apl", network.config) else "lora"
    dtype = autocast_dtype(resolve_precision(precision, where))

    def batch(rows: int) -> dict:
        ids = torch.randint(3, max(4, min(int(network.config.vocab_size), 1000)), (rows, length), device=where)
        eos = network.config.eos_token_id
        if isinstance(eos, int):  # T5's classifier reads each row's last </s>, and counts them
            ids[ids == eos] = 3 if eos != 3 else 4
            ids[:, -1] = eos
        labels = ids if generation else torch.zeros(rows, dtype=torch.long, device=where)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}

    try:
        with PeakMemory(where) as peak:
            network = apply_delta(network, with_pooling(PRESETS[preset], "cls")).to(where).train()
            with autocast(where, dtype):
                loss = network(**batch(batch_size)).loss
            loss.backward()
            del loss
            network.eval()
            with torch.no_grad(), autocast(where, dtype):
                network(**batch(eval_batch_size)).logits.float().log_softmax(-1)  # as a dev loss computes it
        return int(peak.mb * 2**20)
    finally:
        network = None  # the model's memory goes back before the search starts
        release_memory()

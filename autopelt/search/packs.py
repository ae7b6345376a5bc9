"""Which trials of a search train together as one pack (`--pack`; the packing itself: train/packed.py).

`--pack auto` packs the finalists (finalists.py): they are queued together at the end, trained at their recorded
rate and never stopped early, so one Ray trial can train them all in one process on one frozen model, one backbone
pass a step for all (docs/packed.md). Only finalists of the LoRA family (LoRA, rsLoRA, DoRA: every method of the
delta trains at LoRA's rate family) pack: where the members add an ungated LoRA update the frozen linears run once
for every row, which is what pays on a CPU; a mix of methods routes nearly every linear member by member and
measured no gain. A finalist that train/packed.py refuses (`refusal`) or that shares no `packing_key` with the
first of its pack runs alone, as with `--pack off`. A pack holds no more finalists than leave a worker idle
(`most`): on one worker all of them, on as many workers as finalists none is packed.
"""

from __future__ import annotations

PACK_CHOICES = ("off", "auto")


def packable(ticket, pack: str) -> bool:
    """Whether `ticket` (controller.Ticket) may train in a pack under `--pack pack`."""
    if pack != "auto" or not ticket.finalist or ticket.stoppable:
        return False
    from autopelt.delta import parse_spec  # torch: the driver's, never a Ray worker's before it trains
    from autopelt.delta.packing import shares_frozen_pass
    from autopelt.train.packed import refusal

    if refusal(ticket.settings):
        return False
    return shares_frozen_pass(parse_spec(ticket.settings.spec))


def same_pack(first, other) -> bool:
    """Whether two packable tickets share what a pack shares (one model, data, pass: train/packed.SHARED)."""
    from autopelt.train.packed import packing_key

    return packing_key(first.settings) == packing_key(other.settings)


def most(finalists: int, workers: int) -> int:
    """How many finalists one pack holds: as few as keep every worker busy (3 finalists on 1 worker: one pack of 3;
    on 2 workers: 2 and 1; on 3 or more: each alone)."""
    return max(1, -(-finalists // max(1, workers)))

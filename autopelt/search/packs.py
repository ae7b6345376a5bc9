"""Which trials of a search train together as one pack (`--pack`; the packing itself: train/packed.py).

`--pack on` and `--pack auto` pack the finalists (finalists.py): they are queued together at the end, trained at
their recorded rate and never stopped early, so one Ray trial can train them all in one process on one frozen
model, one backbone pass a step for all (docs/packed.md). Under `auto` the pack first times its step against its
members' steps alone and trains packed only where that pays (train/packed.py, `measure`; else each member trains
alone in that Ray trial); under `on` it trains packed. A finalist that train/packed.py refuses (`refusal`) or
that shares no `packing_key` with the first of its pack runs alone, as with `--pack off`. A pack holds no more
finalists than leave a worker idle (`most`): on one worker all of them, on as many workers as finalists none is
packed.
"""

from __future__ import annotations

PACK_CHOICES = ("off", "on", "auto")


def packable(ticket, pack: str) -> bool:
    """Whether `ticket` (controller.Ticket) may train in a pack under `--pack pack`."""
    if pack == "off" or not ticket.finalist or ticket.stoppable:
        return False
    from autopelt.train.packed import refusal  # torch: the driver's, never a Ray worker's before it trains

    return not refusal(ticket.settings)


def measured(pack: str) -> bool:
    """Whether a pack times its step and trains packed only where that pays (`--pack auto`)."""
    return pack == "auto"


def same_pack(first, other) -> bool:
    """Whether two packable tickets share what a pack shares (one model, data, pass: train/packed.SHARED)."""
    from autopelt.train.packed import packing_key

    return packing_key(first.settings) == packing_key(other.settings)


def most(finalists: int, workers: int) -> int:
    """How many finalists one pack holds: as few as keep every worker busy (3 finalists on 1 worker: one pack of 3;
    on 2 workers: 2 and 1; on 3 or more: each alone)."""
    return max(1, -(-finalists // max(1, workers)))

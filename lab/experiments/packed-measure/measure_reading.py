"""What a measured pack reads, timed on its first batch alone against timed on its next steps after a warm-up.

`run_packed(measure=True)` decides to train packed by one ratio, the pack's training pass over its members' passes
alone. Read two ways on the same packs (bench/packed_throughput.py's members, fresh each time as `--pack auto`
builds them): `first batch` times each member's first batch twice and counts the second round (the reading before
2026-12-03); `next steps` warms up on the first batch and sums the next `MEASURED_STEPS` (the reading since). The
ratio the packed training itself ran at is bench/packed_throughput.py's (`train_speedup`, its inverse), measured
beside it.

    python lab/experiments/packed-measure/measure_reading.py --data-dir ../shared/data/glue-full --repeats 3
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "bench"))

import packed_throughput as bench  # noqa: E402
from results import write_results  # noqa: E402

from autopelt.train import packed  # noqa: E402
from autopelt.train.loop import Training  # noqa: E402


def first_batch_twice(self, count: int) -> list:  # the reading before: the first batch, twice
    return [self.upcoming_now(1)[0]] * 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--members", default="lora,mixed")
    cli = parser.parse_args()
    packed.PAYS = float("inf")  # train packed whatever it reads: only the reading is kept
    Training.upcoming_now = Training.upcoming
    rows = []
    for members in cli.members.split(","):
        args = argparse.Namespace(data_dir=cli.data_dir, task="sst2", k=1000, dev_size=32, model=None,
                                  pooling="mean", epochs=1, batch_size=32, max_length=128, threads=2,
                                  members=members, max_steps=6)
        bench.warm_up(args)
        with tempfile.TemporaryDirectory() as work:
            for repeat in range(cli.repeats):
                for reading in ("first batch", "next steps"):
                    Training.upcoming = first_batch_twice if reading == "first batch" else Training.upcoming_now
                    row = bench.measure(args, "measured", Path(work) / f"{repeat}-{reading}")
                    rows.append({"members": members, "repeat": repeat, "reading": reading,
                                 "ratio": row["step_ratio"]})
                    print(rows[-1], flush=True)
    Training.upcoming = Training.upcoming_now
    write_results("packed-measure-reading", rows, settings={"task": "sst2", "k": 1000, "batch_size": 32,
                                                            "measured_steps": packed.MEASURED_STEPS},
                  notes="ratio: the pack's training pass over its members' passes alone, as read; a fresh pack "
                        "each row", out_dir=Path(__file__).parent)


if __name__ == "__main__":
    main()

"""A decoder's regression head (Llama's `score`, no bias) as the model builds it, against one given a bias at the
training labels' mean (`autopelt/train/backbone.py`'s `center_regression_head`), same settings otherwise.

Reads two `python -m metalearning collect` JSON Lines files of SmolLM2-135M-Instruct on emobank_valence, one
collected at a commit before the change (f9a56ad: the head left without a bias) and one after (7bb4f35), paired by
configuration and seed: the answer's test Pearson (its best dev epoch's).

    python lab/experiments/regression-head/decoder_head.py --before decoder-before.jsonl --after decoder-after.jsonl
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

from regression_head import TASK, collected, paired_rows, print_table  # noqa: E402
from results import write_results  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, type=Path)
    parser.add_argument("--after", required=True, type=Path)
    args = parser.parse_args()
    rows = paired_rows("SmolLM2 emobank", collected(args.before, TASK), collected(args.after, TASK), lambda a: a.test)
    if not rows:
        sys.exit("decoder_head: the two files share no (configuration, seed) of emobank_valence")
    columns = print_table(rows)
    path = write_results("regression-head-decoder", rows, columns=columns, precision="bf16",
                         settings={"before": "f9a56ad", "after": "7bb4f35", "model": "SmolLM2-135M-Instruct",
                                   "task": TASK, "protocol": "the meta-dataset's pool (K=1,000)"},
                         notes="Test Pearson r x 100, mean ± std over seeds (worst in brackets); Δ: after − before, "
                               "paired by seed, in points. Both arms on one CPU, bf16 autocast, one thread a trial.")
    print(f"written {path}")


if __name__ == "__main__":
    main()

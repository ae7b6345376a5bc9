"""What the packaged all-mpnet-base-v2 (`--model mpnet-base`) costs on first use and after: the seconds of the
first resolve (its five installed pieces read in order as one stream and unzipped into a fresh cache), the size of
the folder it makes, and the seconds of a later resolve (the cached folder, checked against `source.json`). Each
first resolve unpacks into a new empty cache; the first repeat's time is listed too (its pieces may not be in the
page cache yet). The results go to benchmarks/results/mpnet-unpack-<date>.json (bench/results.py), printed too.

    python lab/experiments/mpnet-unpack/mpnet_unpack.py [--repeats 3] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
from results import write_results  # noqa: E402

COLUMNS = ["what", "seconds", "bytes"]


def resolve_in(cache: Path) -> tuple[str, float]:
    """The folder `resolve_model("mpnet-base")` gives with autopelt's cache at `cache`, and its seconds."""
    from autopelt.models import resolve_model

    os.environ["AUTOPELT_CACHE_DIR"] = str(cache)
    started = time.perf_counter()
    folder = resolve_model("mpnet-base")
    return folder, time.perf_counter() - started


def folder_bytes(folder: Path) -> int:
    return sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="first resolves, each into a new cache (default 3)")
    parser.add_argument("--out", help="the results folder (default benchmarks/results/)")
    args = parser.parse_args()
    from autopelt.packaged import PACKAGED, installed_file

    pieces = [installed_file(distribution, file) for distribution, file in PACKAGED["mpnet-base"].names()]
    if None in pieces:
        raise SystemExit(f"the mpnet-base parts are not installed: {PACKAGED['mpnet-base'].install}")
    firsts, cached = [], []
    work = Path(tempfile.mkdtemp(prefix="mpnet-unpack."))
    try:
        for repeat in range(args.repeats):
            folder, seconds = resolve_in(work / f"cache{repeat}")
            firsts.append(seconds)
            cached.extend(resolve_in(work / f"cache{repeat}")[1] for _ in range(5))
            size, files = folder_bytes(Path(folder)), sum(1 for p in Path(folder).rglob("*") if p.is_file())
            shutil.rmtree(work / f"cache{repeat}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    pieces_bytes = sum(piece.stat().st_size for piece in pieces)
    rows = [
        {"what": "the five pieces installed (a deflated zip)", "seconds": None, "bytes": pieces_bytes},
        {"what": f"first resolve: join + unzip, median of {len(firsts)}", "seconds": statistics.median(firsts),
         "bytes": size},
        {"what": "first resolve, the first repeat", "seconds": firsts[0], "bytes": size},
        {"what": f"cached resolve, median of {len(cached)}", "seconds": statistics.median(cached), "bytes": None},
    ]
    for row in rows:
        seconds = "" if row["seconds"] is None else f"{row['seconds']:.4f}s"
        print(f"{row['what']:<48} {seconds:>10} {'' if row['bytes'] is None else row['bytes']:>12}")
    path = write_results("mpnet-unpack", rows, columns=COLUMNS, out_dir=args.out,
                         settings={"model": "mpnet-base (all-mpnet-base-v2)", "repeats": args.repeats,
                                   "folder_files": files, "first_seconds": firsts},
                         notes=f"the folder: {size / 1e6:.0f} MB in {files} files (model.safetensors fp32, tokenizer, "
                               f"sentence-transformers' modules.json and Pooling config); the pieces "
                               f"{pieces_bytes / 1e6:.0f} MB")
    print(path)


if __name__ == "__main__":
    main()

"""What a warm worker would save: a trial's model load from disk against a copy of a model held in memory.

A search's Ray workers are reused between trials (ray_backend: reuse_actors), so imports, the CUDA context and the
tokenised-data cache (on disk) already outlive a trial; each trial still loads its base model. This times, for
each model, `autopelt.models.load_model` (from_pretrained of a memory-mapped safetensors file, a fresh head) once
to warm the page cache and then the median of --repeats loads, against `copy.deepcopy` of a loaded model (what a
worker holding the model would do per trial, since a delta changes the model it is built into), and where CUDA is
there, that copy and its move to the GPU.

    python lab/experiments/warm-workers/model_load.py [--models all-MiniLM-L6-v2,smollm2-135m] [--repeats 5]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
from results import write_results  # noqa: E402



def timed(fn, repeats: int) -> float:
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="all-MiniLM-L6-v2,smollm2-135m")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a trial's, by default one)")
    parser.add_argument("--out", default=str(Path(__file__).parent), help="results folder (default: beside this file)")
    args = parser.parse_args(argv)
    import torch

    from autopelt.models import load_model, model_name, resolve_model

    torch.set_num_threads(args.threads)
    rows = []
    for name in args.models.split(","):
        path = resolve_model(name)
        model = load_model(path, 2)  # the page cache warmed, as for every trial after a worker's first
        row = {"model": model_name(path), "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
               "load_s": timed(lambda: load_model(path, 2), args.repeats),
               "deepcopy_s": timed(lambda: copy.deepcopy(model), args.repeats)}
        if torch.cuda.is_available():
            def to_gpu():
                copy.deepcopy(model).to("cuda")
                torch.cuda.synchronize()
            row["deepcopy_to_gpu_s"] = timed(to_gpu, args.repeats)
        rows.append(row)
        print(", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()))
    path = write_results("model-load", rows, precision="fp32", out_dir=args.out,
                         settings={"repeats": args.repeats, "threads": args.threads},
                         notes="median seconds of a trial's model load from a warm page cache, against a deep copy "
                               "of the loaded model in memory")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

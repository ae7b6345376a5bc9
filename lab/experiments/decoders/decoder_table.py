"""A decoder LLM (SmolLM2-135M by default) on the papers' tasks: E2E NLG arms, SST-2 beside all-MiniLM-L6-v2, and
how many of its trials share one device.

Three parts, each trial a `run_trial` in its own process (as a search's worker runs it), on one device:
  1. sharing: the same SST-2 LoRA r8 (q,v) trial (K=1000, 3 epochs, the meta-dataset's rows: the pool's data seed 0,
     dev 1,000) run alone, then 2 and then 4 at once: trials per hour and peak memory per trial at each level. The
     runs are also the SST-2 arm: rate 1e-3 alone, 3e-4 and 3e-3 in pair, 1e-3 with four more seeds in the four.
  2. SST-2: the decoder's LoRA at the rate dev picks, beside all-MiniLM-L6-v2's LoRA from the shipped meta-dataset
     (same rows and protocol; read from the file, not trained here).
  3. E2E NLG (Novikova et al. 2017, as in AdaMix and the LoRA paper): zero-shot (the fixed prompt, no training),
     LoRA r8 (q,v), UniPELT(APL), prefix (L=10) and the Pfeiffer adapter, each at a short grid of rates; dev loss
     picks the rate, the pick's test BLEU and ROUGE-L over the distinct test inputs are reported.
  4. search: `autopelt search` on the same E2E rows as a user runs it (Ray workers, the GPU share measured by the
     search itself, --search-budget trials): every trial's row, the answer and its test scores.
  5. hardware: the E2E LoRA trial in fp16 (GradScaler) beside bf16, and a trial too large for the device, which
     must fail with the one-line out-of-memory reason.
Every part writes its results file (bench/results.py) as soon as it ends; --deadline (seconds from the start) starts
no trial after it, so a lease that runs out still leaves what finished.

Usage (the E2E folder holds e2e/{train,validation}.jsonl; the pool is `python -m metalearning pool`'s):
  python lab/experiments/decoders/decoder_table.py --pool POOL --e2e-dir ../shared/data/gen --parallel 4 --device cuda
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import time
from pathlib import Path

LORA = {"method": "lora", "rank": 8, "alpha": 16, "targets": ["query", "value"]}
E2E_ARMS = {  # arm -> (delta spec, rates swept)
    "LoRA r8 (q,v)": ({"methods": [LORA]}, (3e-4, 1e-3, 3e-3)),
    "UniPELT(APL)": (None, (3e-4, 1e-3)),  # the preset, filled in below
    "prefix L=10": (None, (3e-4, 1e-3)),
    "Pfeiffer adapter": (None, (3e-4, 1e-3)),
}
PRESET_OF = {"UniPELT(APL)": "unipelt_apl", "prefix L=10": "prefix", "Pfeiffer adapter": "adapter"}
SHARING = ((1, [(1e-3, 0)]), (2, [(3e-4, 0), (3e-3, 0)]), (4, [(1e-3, 1), (1e-3, 2), (1e-3, 3), (1e-3, 4)]))
E2E_COLUMNS = ["arm", "rate", "rates_tried", "dev_loss", "bleu", "rouge_l", "params_pct", "trial_s", "peak_mb"]
SST2_COLUMNS = ["model", "delta", "seeds", "dev_seed0", "test_mean", "test_min", "params_pct", "trial_s",
                "picked_by_dev"]
MINILM_CONFIGS = ("lora-r8-qv-cls@3e-3", "lora-r8-qv@1e-3", "lora-r8-qv@3e-3")


def main() -> None:
    args = parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
    from autopelt.models import resolve_model

    import torch  # noqa: F401  (imported here so the results files name the GPU: trials run in other processes)

    started = time.time()
    deadline = started + args.deadline if args.deadline else None
    model = resolve_model(args.model)  # a packaged model is converted here, once, not in every worker
    print(f"model {args.model} -> {model} ({time.time() - started:.0f} s)", flush=True)
    common = {"model": model, "device": args.device, "precision": args.precision, "threads": args.threads}
    settings = {"model": args.model, "k": args.k, "epochs": args.epochs, "device": args.device,
                "precision": args.precision}

    parts = {"sharing": part_sharing, "e2e": part_e2e, "search": part_search, "hardware": part_hardware}
    for part in args.parts:  # in the order given
        parts[part](args, common, settings, deadline)
    print(f"done in {time.time() - started:.0f} s", flush=True)


def part_sharing(args, common: dict, settings: dict, deadline: float | None) -> None:
    from results import write_results

    sharing, sst2 = [], []
    for level, runs in SHARING:
        jobs = [("sst2", {**common, "pool": args.pool, "k": args.k, "dev_size": args.dev_size,
                          "epochs": args.epochs, "rate": rate, "seed": seed}) for rate, seed in runs]
        wall, records = run_wave(jobs, level, deadline)
        if not records:
            break
        done = [r for r in records if r["status"] == "ok"]
        sst2 += records
        sharing.append({"trials_at_once": level, "trials": len(records), "ok": len(done),
                        "wall_s": round(wall, 1), "trials_per_hour": round(len(done) * 3600 / wall, 1),
                        "trial_s_median": round(statistics.median(r["total_seconds"] for r in records), 1),
                        "peak_mb_max": max((r["peak_memory_mb"] or 0) for r in records)})
        print(f"{level} at once: {sharing[-1]}", flush=True)
    precision = ran_at(sst2, args.precision)
    write_results(f"{args.results_prefix}-sharing", sharing, out_dir=args.results_dir, precision=precision,
                  settings={**settings, "task": "sst2"},
                  notes="the same SST-2 LoRA trial, N processes on one device; a trial's wall includes its model load")
    write_results(f"{args.results_prefix}-sst2", sst2_table(sst2, args), out_dir=args.results_dir, precision=precision,
                  settings={**settings, "task": "sst2"}, columns=SST2_COLUMNS,
                  notes="dev picks the decoder's rate; MiniLM rows are the shipped meta-dataset's (same rows)")


def part_e2e(args, common: dict, settings: dict, deadline: float | None) -> None:
    from results import write_results

    from autopelt.delta.presets import PRESETS

    jobs = [("zero-shot", {**common, "e2e_dir": args.e2e_dir, "k": args.e2e_k, "arm": "zero-shot"})]
    for arm, (spec, rates) in E2E_ARMS.items():
        spec = spec or PRESETS[PRESET_OF[arm]]
        jobs += [("e2e", {**common, "e2e_dir": args.e2e_dir, "k": args.e2e_k, "epochs": args.epochs,
                          "arm": arm, "spec": spec, "rate": rate, "seed": 0}) for rate in rates]
    wall, records = run_wave(jobs, args.parallel, deadline)
    write_results(f"{args.results_prefix}-e2e", e2e_table(records), out_dir=args.results_dir,
                  precision=ran_at(records, args.precision),
                  settings={**settings, "task": "e2e", "k": args.e2e_k, "max_new_tokens": 40,
                            "parallel": args.parallel, "wall_s": round(wall, 1)}, columns=E2E_COLUMNS,
                  notes="dev loss picks each arm's rate; BLEU and ROUGE-L over the distinct test inputs")
    for record in records:
        print(json.dumps(record), flush=True)


SEARCH_COLUMNS = ["trial", "role", "delta", "lr", "params_pct", "dev_loss", "bleu", "rouge_l", "state", "seconds",
                  "peak_mb", "precision"]


def part_search(args, common: dict, settings: dict, deadline: float | None) -> None:
    """`autopelt search` as a user types it, a fresh study each run; the table is read back from its study.
    --deadline does not bound it: its own --search-budget does."""
    import contextlib
    import io

    import optuna
    from results import write_results

    from autopelt import cli
    from autopelt.study import answers
    from autopelt.study.record import read_all

    work = Path(args.search_dir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    name = f"e2e-search-{time.strftime('%Y%m%d-%H%M%S')}"  # a fresh study: one of the same name would be resumed
    storage = f"sqlite:///{work / 'e2e-search.db'}"
    command = ["search", "--task", "e2e", "--input-column", "mr", "--target-column", "ref", "--model", args.model,
               "--data-dir", args.e2e_dir, "--k", str(args.e2e_k), "--epochs", str(args.epochs),
               "--budget", str(args.search_budget), "--workers", str(args.parallel), "--precision", args.precision,
               "--storage", storage, "--study-name", name, "--out", str(work / name)]
    print("autopelt " + " ".join(command), flush=True)
    seen = io.StringIO()
    started = time.perf_counter()
    with contextlib.redirect_stdout(_Tee(sys.stdout, seen)):
        code = cli.main(command)
    wall = time.perf_counter() - started
    records = read_all(optuna.load_study(study_name=name, storage=storage))
    best = answers.best(records)
    rows = [_search_row(r, best) for r in records]
    plan_lines = [line for line in seen.getvalue().splitlines() if "GPU" in line]
    write_results(f"{args.results_prefix}-e2e-search", rows, out_dir=args.results_dir,
                  precision=ran_at(rows, args.precision),
                  settings={**settings, "task": "e2e", "k": args.e2e_k, "budget": args.search_budget,
                            "workers": args.parallel, "exit_code": code, "wall_s": round(wall, 1),
                            "answer": best.number if best else None, "plan_lines": plan_lines,
                            "search_command": "autopelt " + " ".join(command)},
                  columns=SEARCH_COLUMNS,
                  notes="every trial of one `autopelt search` on E2E; dev loss selects, test is scored for the "
                        "baselines, the finalists' re-runs and the answer")


class _Tee:
    """Writes to both streams: the search's lines reach the log and are kept for the results."""

    def __init__(self, *streams):
        self.streams = streams

    def write(self, text):
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self):
        for stream in self.streams:
            stream.flush()

    def __getattr__(self, name):  # encoding, isatty, fileno: the real stream's (Ray reads them)
        if name == "streams":  # not set yet (a copy being made)
            raise AttributeError(name)
        return getattr(self.streams[0], name)


def _search_row(record, best) -> dict:
    if record.finalist_of:
        role = f"#{record.finalist_of.get('trial')} again"
    elif record.baseline:
        role = f"baseline {record.baseline}"
    elif record.portfolio:
        role = f"portfolio {record.portfolio.get('rank')}"
    else:
        role = "searched"
    if best is not None and record.number == best.number:
        role += " (answer)"
    dev = record.dev_value
    return {"trial": record.number, "role": role, "delta": record.summary, "lr": record.learning_rate,
            "params_pct": record.params_pct, "dev_loss": None if dev is None else round(-dev, 4),
            "bleu": record.test_value("bleu"), "rouge_l": record.test_value("rouge_l"),
            "state": record.stopped_by or record.fail_reason or record.state.name.lower(),
            "seconds": None if record.seconds is None else round(record.seconds, 1),
            "peak_mb": record.peak_memory_mb, "precision": record.precision}


def _on_cuda(device: str | None) -> bool:
    import torch

    return device == "cuda" or (device is None and torch.cuda.is_available())


HARDWARE_COLUMNS = ["check", "precision", "status", "dev_loss", "bleu", "rouge_l", "train_s", "peak_mb", "reason"]


def part_hardware(args, common: dict, settings: dict, deadline: float | None) -> None:
    """fp16 under GradScaler beside bf16 (the same E2E LoRA trial), then a trial that cannot fit: its reason."""
    from results import write_results

    spec = {"methods": [LORA]}
    jobs = [("e2e", {**common, "precision": precision, "e2e_dir": args.e2e_dir, "k": args.e2e_k,
                     "epochs": args.epochs, "arm": f"LoRA r8 (q,v) {precision}", "spec": spec, "rate": 3e-3,
                     "seed": 0}) for precision in ("fp16", "bf16")]
    if _on_cuda(args.device):  # too large for a GPU; on a CPU it would only exhaust the host's memory
        jobs.append(("e2e", {**common, "precision": "bf16", "e2e_dir": args.e2e_dir, "k": 4000, "epochs": 1,
                             "arm": "too large: batch 4000", "spec": spec, "rate": 3e-3, "seed": 0,
                             "batch_size": 4000, "max_length": 512}))
    records = run_wave(jobs[:2], 2, deadline)[1] + run_wave(jobs[2:], 1, deadline)[1]  # the large one alone
    rows = []
    for record in records:
        dev = record.get("dev_metric")
        test = record.get("test") or {}
        rows.append({"check": record["arm"], "precision": record.get("precision"), "status": record["status"],
                     "dev_loss": None if dev is None else round(-dev, 4), "bleu": test.get("bleu"),
                     "rouge_l": test.get("rouge_l"), "train_s": record.get("train_seconds"),
                     "peak_mb": record.get("peak_memory_mb"), "reason": record.get("reason")})
    write_results(f"{args.results_prefix}-hardware", rows, out_dir=args.results_dir, precision="fp16, bf16",
                  settings={**settings, "task": "e2e", "k": args.e2e_k}, columns=HARDWARE_COLUMNS,
                  notes="fp16 trains under GradScaler; the last trial is meant not to fit and must fail in one line")


def ran_at(records: list[dict], asked: str) -> str:
    """The precision the trials ran at (--precision auto resolves per device)."""
    return ", ".join(sorted({r["precision"] for r in records if r.get("precision")})) or asked


def run_wave(jobs: list, parallel: int, deadline: float | None) -> tuple[float, list[dict]]:
    """Run `jobs` on `parallel` processes; (wall seconds, the records of those that started before `deadline`)."""
    context = multiprocessing.get_context("spawn")
    started = time.perf_counter()
    with context.Pool(parallel) as pool:
        records = [r for r in pool.imap_unordered(_job, [(kind, job, deadline) for kind, job in jobs]) if r]
    return time.perf_counter() - started, records


def _job(payload) -> dict | None:
    kind, job, deadline = payload
    if deadline is not None and time.time() > deadline:
        return None
    started = time.perf_counter()
    try:
        record = {"sst2": sst2_trial, "e2e": e2e_trial, "zero-shot": zero_shot}[kind](**job)
    except Exception as error:  # a failed trial is a row that says why, not a lost table
        record = {"status": "error", "reason": f"{type(error).__name__}: {error}"[:300],
                  "total_seconds": time.perf_counter() - started, "peak_memory_mb": None}
    record.setdefault("total_seconds", round(time.perf_counter() - started, 1))
    return {**{k: v for k, v in job.items() if k in ("arm", "rate", "seed")}, **record}


def sst2_trial(model, device, precision, threads, pool, k, dev_size, epochs, rate, seed) -> dict:
    from metalearning.tasks import read_pool
    from autopelt.train import TrialSettings, run_trial

    task = read_pool(pool)["sst2"]
    settings = TrialSettings(
        task="sst2", spec={"methods": [LORA]}, model=model, data_dir=pool, protocol=k, dev_size=dev_size, seed=seed,
        data_seed=0, epochs=epochs, learning_rate=rate, batch_size=32, threads=threads, device=device,
        precision=precision, custom_task={"text_columns": task["text_columns"], "label_column": "label",
                                          "label_names": task["label_names"]})
    return _compact(run_trial(settings))


def e2e_trial(model, device, precision, threads, e2e_dir, k, epochs, arm, spec, rate, seed, batch_size=16,
              max_length=96) -> dict:
    from autopelt.train import TrialSettings, run_trial

    settings = TrialSettings(
        task="e2e", spec=spec, model=model, data_dir=e2e_dir, protocol=k, seed=seed, epochs=epochs,
        learning_rate=rate, batch_size=batch_size, max_length=max_length, max_new_tokens=40, threads=threads,
        device=device,
        precision=precision, custom_task={"input_column": "mr", "target_column": "ref"})
    return _compact(run_trial(settings))


def zero_shot(model, device, precision, threads, e2e_dir, k, arm) -> dict:
    """The base model given the fixed prompt, no delta: the floor every arm starts from."""
    import torch

    from autopelt.data.generation import GenerationTask, load_generation_splits, make_generation_splits
    from autopelt.dtypes import cast_frozen_weights
    from autopelt.models import load_language_model, load_tokenizer
    from autopelt.train import device as devices
    from autopelt.train.generate import score_generation

    if threads:
        torch.set_num_threads(threads)
    task = GenerationTask("e2e", "mr", "ref")
    splits = make_generation_splits(load_generation_splits(task, e2e_dir), task, k, 0, None)
    where = devices.pick_device(device)
    with devices.PeakMemory(where) as memory:
        lm = load_language_model(model, seed=0).to(where).eval()
        dtype = devices.autocast_dtype(devices.resolve_precision(precision, where))
        cast_frozen_weights(lm, dtype)
        test, samples = score_generation(lm, load_tokenizer(model), splits.test, task, 128, 40, where, dtype)
    return {"status": "ok", "test": test, "dev": None, "peak_memory_mb": memory.mb, "params": 0,
            "sample": samples[0][1] if samples else None}


def _compact(result: dict) -> dict:
    params = result.get("params") or {}
    return {"status": result["status"], "reason": result.get("reason"), "dev": result.get("dev"),
            "dev_metric": result.get("dev_metric"), "test": result.get("test"), "params": params.get("stored"),
            "params_pct": params.get("stored_pct"), "train_seconds": result.get("train_seconds"),
            "total_seconds": result.get("total_seconds"), "peak_memory_mb": result.get("peak_memory_mb"),
            "precision": result.get("precision"),
            "sample": (result.get("samples") or [{}])[0].get("text")}


def sst2_table(records: list[dict], args) -> list[dict]:
    """The decoder's LoRA at each rate (seed 0's dev picks the rate; its other seeds give the spread), then
    MiniLM's from the meta-dataset."""
    ok = [r for r in records if r["status"] == "ok"]
    rows = []
    for rate in sorted({r["rate"] for r in ok}):
        runs = [r for r in ok if r["rate"] == rate]
        tests = [100 * _accuracy(r["test"]) for r in runs]
        rows.append({"model": args.model, "delta": f"LoRA r8 (q,v) @{rate:g}", "seeds": len(runs),
                     "dev_seed0": _seed0(runs, "dev_metric"), "test_mean": round(statistics.mean(tests), 2),
                     "test_min": round(min(tests), 2), "params_pct": runs[0]["params_pct"],
                     "trial_s": round(statistics.median(r["total_seconds"] for r in runs), 1)})
    if rows:
        best = max(rows, key=lambda row: row["dev_seed0"] if row["dev_seed0"] is not None else -1)
        best["picked_by_dev"] = True
    for record in _minilm_records():
        epochs = record["epochs"][-1]
        rows.append({"model": "all-MiniLM-L6-v2 (meta-dataset)", "delta": record["config"], "seeds": 1,
                     "dev_seed0": epochs["dev"], "test_mean": round(100 * epochs["test"], 2),
                     "test_min": round(100 * epochs["test"], 2), "params_pct": record["params_percent"],
                     "trial_s": record["total_seconds"]})
    return rows


def e2e_table(records: list[dict]) -> list[dict]:
    """One row per arm: the rate with the lowest dev loss (highest dev_metric) and its test scores."""
    rows = []
    for arm in ["zero-shot", *E2E_ARMS]:
        runs = [r for r in records if r.get("arm") == arm]
        ok = [r for r in runs if r["status"] == "ok"]
        if not ok:
            rows.append({"arm": arm, "status": runs[0]["reason"] if runs else "not run"})
            continue
        pick = max(ok, key=lambda r: r["dev_metric"] if r.get("dev_metric") is not None else 0)
        test = pick["test"] or {}
        rows.append({"arm": arm, "rate": pick.get("rate"), "rates_tried": [r.get("rate") for r in runs],
                     "dev_loss": None if pick.get("dev_metric") is None else round(-pick["dev_metric"], 4),
                     "bleu": test.get("bleu"), "rouge_l": test.get("rouge_l"), "params_pct": pick.get("params_pct"),
                     "trial_s": pick["total_seconds"], "peak_mb": pick["peak_memory_mb"], "sample": pick["sample"]})
    return rows


def _accuracy(test) -> float:
    return test["accuracy"] if isinstance(test, dict) else test


def _seed0(runs: list[dict], key: str):
    seed0 = [r for r in runs if r["seed"] == 0]
    return seed0[0][key] if seed0 else None


def _minilm_records() -> list[dict]:
    from metalearning.metadata import SHIPPED, load

    return [r for r in load(SHIPPED / "all-MiniLM-L6-v2-v1.json").records if r["task"] == "sst2" and r["seed"] == 0 and r["config"] in MINILM_CONFIGS]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--pool", required=True, help="a folder written by `python -m metalearning pool` (SST-2 rows)")
    parser.add_argument("--e2e-dir", required=True, help="folder holding e2e/train.jsonl and e2e/validation.jsonl")
    parser.add_argument("--parts", default="sharing,e2e", type=lambda s: s.split(","))
    parser.add_argument("--k", type=int, default=1000)
    parser.add_argument("--dev-size", type=int, default=1000, help="SST-2 dev rows (the meta-dataset's 1,000)")
    parser.add_argument("--e2e-k", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--parallel", type=int, default=4, help="E2E trials at once")
    parser.add_argument("--device")
    parser.add_argument("--precision", default="auto")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads per trial")
    parser.add_argument("--results-dir", help="where the results files go (default: benchmarks/results)")
    parser.add_argument("--results-prefix", default="decoder", help="results files are named PREFIX-sharing, ...")
    parser.add_argument("--search-budget", type=int, default=12, help="trials of the search part")
    parser.add_argument("--search-dir", default="decoder-search", help="the search part's study and trial outputs")
    parser.add_argument("--deadline", type=float, help="start no trial this many seconds after the start")
    return parser.parse_args()


if __name__ == "__main__":
    main()

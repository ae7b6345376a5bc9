"""Build the meta-dataset: every configuration of the design trained on every task's pool, per seed.

Each trial runs the K-shot protocol on the task's pool (tasks.py) at the configuration's fixed rate, 3 epochs, and
records per epoch the dev metric, the dev loss, the test metric (never read by a choice; the simulation reports
with it) and the seconds so far, then its stored parameters. Results are appended to a JSON Lines file, one line
a trial, so a run can be killed and started again: it runs only what is missing. `finish` writes the versioned
data file that ships in the package.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from dataclasses import dataclass
from pathlib import Path

from autopelt.errors import UserError
from metalearning.design import DESIGN_VERSION, config_named
from metalearning.tasks import DEV_SIZE, K, dev_size, pool_task, read_pool
from autopelt.train.predictions import compact_many, save as save_predictions

EPOCHS = 3
MAX_DENSE_CLASSES, TOP_K = 16, 10  # past 16 classes a trial keeps each row's 10 most probable (ensembles average
#                                    them; an averaged winner is among its members' top classes)


@dataclass(frozen=True)
class Job:
    task: str
    config: str
    seed: int

    @property
    def key(self) -> tuple:
        return (self.task, self.config, self.seed)


def done_keys(results: Path) -> set[tuple]:
    if not results.exists():
        return set()
    keys = set()
    for line in results.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            keys.add((record["task"], record["config"], record["seed"]))
    return keys


def prediction_file(job: Job) -> str:
    """The file of a trial's predictions in its task's folder (a configuration's name may hold @, + and ~)."""
    return f"{job.config}@s{job.seed}.npz"


def run_job(job: Job, pool: str, model: str, device: str | None, precision: str, threads: int | None,
            cache_dir: str | None, config=None, predictions_dir: str | None = None) -> dict:
    """One trial of the meta-dataset, as a compact record; `config` (a design.Config) for a configuration outside
    the design (the job names it). With `predictions_dir` its dev and test predictions (train/predictions.py) go to
    `predictions_dir/<task>/<config>@s<seed>.npz`, written before the record, so a record implies its file."""
    from transformers import AutoConfig

    from autopelt.train import TrialSettings, run_trial

    config = config or config_named(job.config)
    layers = AutoConfig.from_pretrained(model).num_hidden_layers
    settings = TrialSettings(
        task=job.task, spec=config.spec(layers), model=model, data_dir=pool, protocol=K,
        dev_size=dev_size(pool, job.task), seed=job.seed, data_seed=0, epochs=EPOCHS,
        learning_rate=config.learning_rate, head_lr_scale=config.head_lr_scale, batch_size=config.batch_size,
        custom_task=pool_task(pool, job.task), threads=threads, device=device, precision=precision,
        backbone_dropout=config.backbone_dropout, cache_dir=cache_dir, keep_predictions=predictions_dir is not None)
    result = run_trial(settings, test_each_evaluation=True)
    if predictions_dir is not None and result["status"] == "ok":
        kept = compact_many(result["predictions"], MAX_DENSE_CLASSES, TOP_K)
        save_predictions(Path(predictions_dir) / job.task, kept, prediction_file(job))
    epochs = [{"dev": round(e["dev_metric"], 5), "dev_loss": round(e["dev_loss"], 5),
               "test": round(e["test_metric"], 5), "seconds": e["seconds"]} for e in result.get("history") or []]
    params = result.get("params") or {}
    return {"task": job.task, "config": job.config, "seed": job.seed, "status": result["status"],
            "reason": result.get("reason"), "epochs": epochs, "params": params.get("stored"),
            "params_percent": params.get("stored_pct"), "train_seconds": round(result["train_seconds"], 3),
            "eval_seconds": round(result["eval_seconds"], 3), "total_seconds": round(result["total_seconds"], 3),
            "precision": result.get("precision"), "peak_memory_mb": result.get("peak_memory_mb")}


def _work(payload) -> dict | None:
    job, deadline, kwargs, configs = payload
    if deadline is not None and time.time() > deadline:
        return None
    return run_job(job, **kwargs, config=configs.get(job.config))


def collect(jobs: list[Job], results: str | Path, pool: str, model: str, workers: int = 1,
            device: str | None = None, precision: str = "auto", threads: int | None = None,
            cache_dir: str | None = None, deadline: float | None = None, say=print, configs: dict | None = None,
            predictions_dir: str | Path | None = None) -> int:
    """Run the jobs not yet in `results` on `workers` processes; returns how many ran. `deadline` (a time.time()
    value) starts no trial after it. `configs`: {name: design.Config} for configurations outside the design.
    `predictions_dir`: where each trial's predictions go (run_job)."""
    results = Path(results)
    read_pool(pool)  # a missing pool is a one-line error before any worker starts
    finished = done_keys(results)
    todo = [job for job in jobs if job.key not in finished]
    say(f"{len(jobs) - len(todo)} of {len(jobs)} trials already in {results}; running {len(todo)} "
        f"on {workers} worker(s)")
    kwargs = {"pool": str(pool), "model": model, "device": device, "precision": precision, "threads": threads,
              "cache_dir": cache_dir, "predictions_dir": None if predictions_dir is None else str(predictions_dir)}
    ran, started = 0, time.time()
    context = multiprocessing.get_context("spawn")
    with context.Pool(workers) as workers_pool, results.open("a") as out:
        for record in workers_pool.imap_unordered(_work, [(job, deadline, kwargs, configs or {}) for job in todo]):
            if record is None:
                continue
            out.write(json.dumps(record) + "\n")
            out.flush()
            ran += 1
            last = record["epochs"][-1] if record["epochs"] else {}
            say(f"[{ran}/{len(todo)} {time.time() - started:.0f}s] {record['task']} {record['config']} "
                f"seed {record['seed']}: {record['status']} dev {last.get('dev', float('nan')):.3f} "
                f"test {last.get('test', float('nan')):.3f} ({record['total_seconds']:.0f}s)")
    return ran


def for_model(names: list[str], model: str) -> tuple[dict, str]:
    """({name: design.Config as `model`'s family runs it} for the configurations it can take, a line saying what
    changed or "" when nothing did): on a decoder or T5 the head reads the family's one token instead of the mean,
    and a configuration with a method the family cannot take (BitFit on Llama) is left out. The names stay: a
    meta-dataset is one model's."""
    from transformers import AutoConfig

    from autopelt.search.space_models import configuration_for_model

    model_config = AutoConfig.from_pretrained(model)
    adapted = {name: configuration_for_model(config_named(name), model_config) for name in names}
    left_out = [name for name, config in adapted.items() if config is None]
    kept = {name: config for name, config in adapted.items() if config is not None}
    if not kept:
        raise UserError(f"no configuration of those given applies to a {model_config.model_type} model")
    said = []
    if any(config.pooling != config_named(name).pooling for name, config in kept.items()):
        said.append(f"the head reads the {model_config.model_type} classifier's one token, not the mean")
    if left_out:
        said.append(f"left out, as a {model_config.model_type} model cannot take them: {', '.join(left_out)}")
    return kept, "; ".join(said)


def plan(tasks: list[str], configs: list[str], seeds: list[int], first_tasks: list[str] = ()) -> list[Job]:
    """Jobs seed by seed, so that a run cut short holds whole seeds of every configuration; within a seed,
    `first_tasks` whole before the others (the tasks a cut-short run must not miss), configurations in order."""
    groups = ([t for t in tasks if t in first_tasks], [t for t in tasks if t not in first_tasks])
    return [Job(t, c, s) for s in seeds for group in groups for c in configs for t in group]


def finish(results: str | Path, out: str | Path, header: dict, pool: str | Path | None = None,
           model: str | None = None) -> dict:
    """Write the meta-dataset file: `header` (model, protocol, hardware, commit), with `pool` each task's dev metric
    of predicting one class (`floors`: what tells a collapse from a hard task), and every trial of `results`."""
    from autopelt.files import write_atomic
    from metalearning.tasks import dev_floors

    records = [json.loads(line) for line in Path(results).read_text().splitlines() if line.strip()]
    records = list({(r["task"], r["config"], r["seed"]): r for r in records}.values())  # a trial run again: the last
    if not records:
        raise UserError(f"{results} holds no trials yet")
    tasks = sorted({r["task"] for r in records})
    floors = dev_floors(pool, tasks) if pool else None
    features = task_features(pool, tasks, model) if pool else None
    seeds = {str(s): sum(r["seed"] == s for r in records) for s in sorted({r["seed"] for r in records})}
    data = {"format": "autopelt-meta-dataset", "design_version": DESIGN_VERSION, "tasks": tasks,
            "trials_per_seed": seeds, "configurations": len({r["config"] for r in records}),
            "protocol": {"k": K, "dev_size": DEV_SIZE, "epochs": EPOCHS, "data_seed": 0}, **header,
            **({"floors": floors} if floors else {}), **({"features": features} if features else {}),
            "records": records}
    write_atomic(Path(out), json.dumps(data, separators=(",", ":")))
    return data


def task_features(pool: str | Path, tasks: list[str], model: str | None) -> dict[str, dict]:
    """Each task's meta-features (autopelt/portfolio/metafeatures.py) from its pool's train rows, tokens counted by
    the model's tokenizer: what the task-aware prior measures a new task against."""
    from autopelt.models import load_tokenizer, resolve_model
    from metalearning import prior

    found = prior.task_features(pool, load_tokenizer(resolve_model(model)))
    return {name: found[name].to_dict() for name in tasks}


def hardware() -> dict:
    """The device the trials ran on: the GPU's name, else the CPU model and whether it has AMX/AVX512-BF16."""
    import platform

    import torch

    if torch.cuda.is_available():
        return {"device": "cuda", "name": torch.cuda.get_device_name(0), "torch": torch.__version__}
    flags = ""
    if Path("/proc/cpuinfo").exists():
        text = Path("/proc/cpuinfo").read_text()
        name = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")),
                    platform.processor())
        flags = " ".join(f for f in ("avx512_bf16", "amx_bf16") if f in text)
    else:
        name = platform.processor()
    return {"device": "cpu", "name": name, "flags": flags, "cores": os.cpu_count(), "torch": torch.__version__}

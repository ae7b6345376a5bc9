"""Stand-ins for the space, the trainer and parameter counting: a search on a synthetic objective, in seconds.

The tests (and anyone checking a Ray cluster or a database before spending GPU hours) pass these to
`run_search`. They live in the package so that Ray workers and `python -c` subprocesses can import them.

The synthetic objective: a trial "trains" for `epochs` epochs; its dev metric after epoch e is
quality * (0.5 + 0.5 * e / epochs), quality being a drawn parameter. Draws can be scripted per draw order
(`FakeSpace(script=[{"quality": 0.9}, {"mode": "nan"}, ...])`) to make a trial good, bad, NaN, raise, or slow.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, NamedTuple

from autopelt.search.plan import PROBE_STUDY


class FakeCount(NamedTuple):
    trainable: int
    stored: int
    base: int


FAKE_BASE_PARAMS = 1_000_000
_SIZE_PER_UNIT = {"lora": ("rank", 1000), "adapter": ("bottleneck", 100), "prefix": ("length", 500)}


def fake_count(spec: dict, model_config=None, num_labels: int | None = None) -> FakeCount:
    """1,000 stored parameters per LoRA rank, 100 per adapter bottleneck unit, 500 per prefix position."""
    stored = 10  # the head
    for entry in spec["methods"]:
        field, size = _SIZE_PER_UNIT.get(entry["method"], (None, 5000))
        stored += size * int(entry.get(field, 1)) if field else size
    return FakeCount(stored, stored, FAKE_BASE_PARAMS)


def fake_describe(spec: dict) -> tuple[dict, str]:
    words = []
    for entry in spec["methods"]:
        detail = " ".join(f"{k[0]}{v}" for k, v in entry.items() if k in ("rank", "bottleneck", "length"))
        words.append(f"{entry['method']} {detail}".strip())
    return spec, " + ".join(words)


def fake_model_config(num_layers: int = 2) -> SimpleNamespace:
    return SimpleNamespace(num_hidden_layers=num_layers, name_or_path="fake-model", num_labels=2)


FAKE_BASELINES = {
    "lora": {"methods": [{"method": "lora", "rank": 8}]},
    "adapter": {"methods": [{"method": "adapter", "bottleneck": 48}]},
    "prefix": {"methods": [{"method": "prefix", "length": 10}]},
}


class FakeSpace:
    """A space of LoRA ranks with a `quality` knob; `script[i]` overrides the hparams of the i-th draw."""

    def __init__(self, ranks=(1, 2, 4, 8, 16, 32, 64), script: list[dict] | None = None, epochs: int = 3,
                 seconds_per_epoch: float = 0.0, name: str = "fake", fingerprint: str = "fake0001"):
        self.ranks = tuple(ranks)
        self.script = list(script or [])
        self.epochs = epochs
        self.seconds_per_epoch = seconds_per_epoch
        self.name = name
        self.fingerprint = fingerprint
        self.draws = 0

    def sample(self, trial, num_layers: int) -> tuple[dict, dict]:
        rank = trial.suggest_categorical("lora.rank", list(self.ranks))
        quality = trial.suggest_float("quality", 0.0, 1.0)
        hparams = {"learning_rate": 1e-3, "epochs": self.epochs, "quality": quality, "mode": "ok",
                   "sleep": self.seconds_per_epoch}
        if trial.study.study_name == PROBE_STUDY:  # the check `prepare` makes is not a draw of the script
            return {"methods": [{"method": "lora", "rank": rank}]}, hparams
        if self.draws < len(self.script):
            hparams.update(self.script[self.draws])
        self.draws += 1
        return {"methods": [{"method": "lora", "rank": rank}]}, hparams


def fake_trial(config: dict, report: Callable[[dict], None]) -> dict:
    """Train on the synthetic objective; leaves `fake_call.json` in the trial's folder (tests count them)."""
    hparams, epochs = config["hparams"], int(config["epochs"])
    out = Path(config["out_dir"])
    out.mkdir(parents=True, exist_ok=True)
    call = {k: config.get(k) for k in ("trial", "spec", "device", "threads", "baseline")}
    (out / "fake_call.json").write_text(json.dumps({**call, "pid": os.getpid(),
                                                    "omp": os.environ.get("OMP_NUM_THREADS")}))
    mode = hparams.get("mode", "ok")
    if mode == "raise":
        raise RuntimeError("the fake trial exploded")
    quality = float(hparams.get("quality", 0.5))
    history = []
    for epoch in range(1, epochs + 1):
        time.sleep(float(hparams.get("sleep", 0.0)))
        value = math.nan if mode == "nan" else quality * (0.5 + 0.5 * epoch / epochs)
        event = {"epoch": epoch, "step": 10 * epoch, "fidelity": epoch / epochs,
                 "dev": {"accuracy": value}, "dev_metric": value}
        report(event)
        history.append(event)
    final = history[-1]["dev_metric"]
    return {
        "status": "ok", "reason": None, "spec": config["spec"], "task": config.get("task"),
        "model": config.get("model"), "seed": config.get("seed"), "metric": "accuracy",
        "dev": {"accuracy": final}, "test": {"accuracy": final - 0.01}, "dev_metric": final,
        "epochs_run": epochs, "best_epoch": epochs, "history": history, "gates": None,
        "delta_dir": None, "train_seconds": epochs * float(hparams.get("sleep", 0.0)),
    }


def injected(space: FakeSpace | None = None, presets: dict | None = None) -> dict:
    """Keyword arguments for `run_search` / `prepare` that swap every outside piece for a stand-in;
    `presets`: the baselines (default FAKE_BASELINES; {} for none)."""
    return {
        "space": space or FakeSpace(), "trial_fn": fake_trial, "count_fn": fake_count,
        "describe_fn": fake_describe, "model_config": fake_model_config(),
        "baselines": FAKE_BASELINES if presets is None else presets,
    }


def run_serially(controller, trial_fn: Callable = fake_trial, stop_after: int | None = None) -> int:
    """Drive a Controller without Ray, one trial at a time in this process; the number of trials run."""
    from autopelt.search.controller import DONE, WAIT

    ran = 0
    while stop_after is None or ran < stop_after:
        ticket = controller.next_trial()
        if ticket == DONE:
            break
        if ticket == WAIT:
            time.sleep(0.05)
            continue
        try:
            result = trial_fn(ticket.config, lambda event: controller.report(ticket.number, event))
        except Exception as error:
            result = {"status": "failed", "reason": f"{type(error).__name__}: {error}"}
        controller.finish(ticket.number, result)
        ran += 1
    return ran


def main(arguments: dict) -> int:
    """A search on the synthetic objective from JSON-able arguments, for tests that run it in a subprocess:
    {"options": {SearchOptions fields}, "space": {FakeSpace arguments}, "serial": run without Ray,
     "start_at": a time.time() at which a serial search starts asking (to make several processes race)}."""
    from autopelt.search.run import SearchOptions, run_search

    options = SearchOptions(**arguments["options"])
    space = FakeSpace(**arguments.get("space", {}))
    if not arguments.get("serial"):
        run_search(options, **injected(space))
        return 0
    from autopelt.search.controller import Controller
    from autopelt.search.plan import prepare
    from autopelt.search.recovery import Heartbeat
    from autopelt.search.resume import open_study

    plan = prepare(options, **injected(space))
    study = open_study(plan)
    controller = Controller(study, plan)
    controller.start()
    time.sleep(max(0.0, arguments.get("start_at", 0) - time.time()))
    with Heartbeat(study, controller.running_trial_ids):
        run_serially(controller)
    controller.close()
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(json.loads(sys.argv[1])))

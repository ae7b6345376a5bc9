"""A search on a synthetic objective, in seconds: a stand-in for `autopelt.train.run_trial`, a space for it,
and a runner that drives the controller without Ray.

The stand-in trains nothing. Its dev metric after epoch e of E is quality * (0.5 + 0.5 * e / E), the quality
being the trial's learning rate, which `SPACE` draws from [0.01, 1] (TPE can learn it). Everything else is the
real search: the real model config counts the deltas, the real presets are the baselines.

A search's outputs folder may hold a `fake.json` (`script(out, ...)` writes it) that the stand-in reads:
seconds per epoch, and for a trial number its own `seconds_per_epoch`, a `quality`, or a `mode`: `nan` (the
dev metric is NaN) or `raise`.

Where the stand-in runs:
- in this process: `run_serially(controller)` calls it (the controller tests);
- in Ray workers: a Ray started with `RUNTIME_ENV` runs `use_in_this_process` in every worker it starts,
  which puts the stand-in where `autopelt.train.run_trial` is looked up (conftest puts tests/ on PYTHONPATH);
- in a subprocess: `python -m support.fakes JSON` (see `main`).
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Callable

SPACE = Path(__file__).with_name("fake_space.yaml")
SCRIPT = "fake.json"
RUNTIME_ENV = {"worker_process_setup_hook": "support.fakes.use_in_this_process"}


def script(out: Path, seconds_per_epoch: float = 0.0, trials: dict[int, dict] | None = None) -> None:
    """Tell the stand-in, for the search whose outputs go to `out`: how long an epoch takes, and what trial n
    does (`{"quality": 0.9}`, `{"mode": "nan"}`, `{"mode": "raise"}`, `{"seconds_per_epoch": 8}`)."""
    from autopelt.files import write_atomic

    out.mkdir(parents=True, exist_ok=True)
    body = {"seconds_per_epoch": seconds_per_epoch, "trials": {str(n): v for n, v in (trials or {}).items()}}
    write_atomic(out / SCRIPT, json.dumps(body))  # several processes of one search may write it at once


SWEPT_RATE = 1e-3  # the rate a fake trial "chooses" when given none


def fake_trial(settings, report: Callable[[dict], None]) -> dict:
    """Train on the synthetic objective; leaves `fake_call.json` in the trial's folder (tests count them)."""
    out = Path(settings.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    call = {"spec": settings.spec, "device": settings.device, "threads": settings.threads,
            "learning_rate": settings.learning_rate, "seed": settings.seed, "pid": os.getpid(),
            "omp": os.environ.get("OMP_NUM_THREADS")}
    (out / "fake_call.json").write_text(json.dumps(call))
    plan = _script(out)
    mine = plan["trials"].get(str(int(out.name.rsplit("-", 1)[-1])), {})
    if mine.get("mode") == "raise":
        raise RuntimeError("the fake trial exploded")
    rate = settings.learning_rate if settings.learning_rate is not None else SWEPT_RATE  # as a real trial chooses
    quality, epochs = float(mine.get("quality", rate)), settings.epochs
    seconds = float(mine.get("seconds_per_epoch", plan["seconds_per_epoch"]))
    history = []
    for epoch in range(1, epochs + 1):
        time.sleep(seconds)
        value = math.nan if mine.get("mode") == "nan" else quality * (0.5 + 0.5 * epoch / epochs)
        event = {"epoch": epoch, "step": 10 * epoch, "fidelity": epoch / epochs,
                 "dev": {"accuracy": value}, "dev_metric": value}
        report(event)
        history.append(event)
    final = history[-1]["dev_metric"]
    return {
        "status": "ok", "reason": None, "spec": settings.spec, "task": settings.task, "model": settings.model,
        "seed": settings.seed, "metric": "accuracy", "dev": {"accuracy": final},
        "test": {"accuracy": final - 0.01} if settings.score_test else None,
        "dev_metric": final, "epochs_run": epochs, "best_epoch": epochs, "history": history, "gates": None,
        "delta_dir": None, "train_seconds": epochs * seconds, "eval_seconds": 0.0, "settings": settings.to_dict(), "learning_rate": rate,
        "lr_choice": {"rate": rate, "how": "given" if settings.learning_rate is not None else "sweep", "seconds": 0.0},
    }


def _script(out: Path) -> dict:
    path = out.parent / SCRIPT
    return json.loads(path.read_text()) if path.is_file() else {"seconds_per_epoch": 0.0, "trials": {}}


def use_in_this_process() -> None:
    """Make this process's `autopelt.train.run_trial` the stand-in (what a Ray worker calls, see the module doc)."""
    import autopelt.train

    autopelt.train.run_trial = fake_trial


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
            result = trial_fn(ticket.settings, lambda event: controller.report(ticket.number, event))
        except Exception as error:
            result = {"status": "failed", "reason": f"{type(error).__name__}: {error}"}
        controller.finish(ticket.number, result)
        ran += 1
    return ran


def main(arguments: dict) -> int:
    """A search on the synthetic objective from JSON-able arguments, for tests that run it in a subprocess:
    {"options": {SearchOptions fields; space defaults to SPACE}, "seconds_per_epoch": float,
     "serial": run without Ray, "start_at": a time.time() at which a serial search starts asking (to make
     several processes race)}. With Ray, `options.ray_address` is the cluster to join."""
    from autopelt.search.run import SearchOptions, run_search

    options = SearchOptions(**{"space": str(SPACE), **arguments["options"]})
    if options.out:
        script(Path(options.out), arguments.get("seconds_per_epoch", 0.0))
    if not arguments.get("serial"):
        import ray

        ray.init(address=options.ray_address, runtime_env=RUNTIME_ENV)  # the search uses this Ray as it is
        run_search(options)
        return 0
    from autopelt.search.controller import Controller
    from autopelt.search.plan import prepare
    from autopelt.search.recovery import Heartbeat
    from autopelt.search.resume import open_study

    plan = prepare(options)
    study = open_study(plan)
    controller = Controller(study, plan)
    controller.start()
    time.sleep(max(0.0, arguments.get("start_at", 0) - time.time()))
    with Heartbeat(study, controller.recorder.running_trial_ids):
        run_serially(controller)
    controller.close()
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(json.loads(sys.argv[1])))

"""Where Ray meets the rest (the only module that imports ray): trials run as Ray Tune trials.

- `ControllerSearcher` is a Tune `Searcher` over the `Controller`: suggest -> controller.next_trial (ask,
  claim, draw, size check), on_trial_result -> report, on_trial_complete -> finish / stop_early / crash.
  It runs in this (the driver) process, so only the driver writes the study; workers just train.
- Early stopping is Tune's ASHA scheduler on the dev metric with epochs as its time (Ray's own
  OptunaSearch forces Optuna's NopPruner, so pruning has to come from a Tune scheduler anyway).
  A trial's last epoch is never shown to ASHA (it carries no `epoch` key), so a trial that trained to the
  end always returns its full result; trials ASHA stops are recorded as PRUNED at the epoch they reached.
  On a wall-time budget `FinalistsStopper` stops, at their next report, the searched trials still running when
  the finalists begin (they can no longer be the answer), so their workers take the finalists.
  Baselines are never shown to ASHA: they are the reference every searched delta is compared with.
- A trial travels as its TrialSettings (`to_dict`, JSON, `from_dict`); the worker sets only what Ray decided
  there: `threads` (the CPUs Ray gave it; torch follows them) and `device` ("cuda" when Ray assigned it a GPU;
  a fraction of one also limits the process to its part of the GPU's memory, `gpu_share.memory_fraction`), then calls
  `autopelt.train.run_trial`.
- With `--pack auto` one Tune trial may hold several finalists (search/packs.py): `suggest` bundles the tickets
  the controller hands out next that can pack with the first (a ticket that cannot is held for the next Tune
  trial); the worker trains them with `train.packed.run_packed`, sends each member's events and result keyed by
  its Optuna trial number, and shows ASHA nothing (finalists are never stopped early).
- Tune ends a trial it stops by raising SystemExit in the trial's thread and does not wait for that thread; a
  worker that exits meanwhile lets the thread's unwinding run into Python's finalisation, which aborts the process
  with a stack dump. A worker therefore waits, at exit, for its stopped trial to unwind (`_let_trials_unwind`).
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import logging
import math
import os
import socket
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Callable

import ray
from ray import tune
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler
from ray.tune.search import Searcher
from ray.tune.stopper import Stopper

from autopelt.errors import UserError
from autopelt.files import write_atomic
from autopelt.numbers import is_finite_number
from autopelt.search import gpu_share, packs, resources
from autopelt.search.controller import DONE, WAIT, Controller, SearchStopped, Ticket
from autopelt.search.plan import SearchPlan
from autopelt.train import device as devices

log = logging.getLogger(__name__)

METRIC = "dev_metric"
TIME_ATTR = "epoch"
TICKET_KEY = "autopelt_ticket"  # the trial's settings, as JSON so Tune does not flatten or name dirs after them
EVENT_KEY = "autopelt_event"
RESULT_KEY = "autopelt_result"
MEMBER_KEY = "autopelt_member"  # the Optuna trial number of a pack's member an event is of
PACK_KEY = "autopelt_pack"  # a pack's final report: RESULT_KEY holds {number: result} of its members
REDUCTION_FACTOR = 2  # half of the trials reaching a rung go on: searches here are tens of trials, not thousands
RAY_TOKEN_NOTICE = "ray._private.authentication.authentication_token_setup"  # the logger of that start notice
UNWIND_WAIT_S = 10.0  # how long an exiting worker waits for a stopped trial's thread to unwind
_RUNNING_TRIALS: set[threading.Thread] = set()  # this worker's threads inside a trial


def asha_settings(epochs: int) -> dict:
    """Rungs at grace * 2^k epochs; a trial trains a quarter of its epochs (at least one) before it can be
    stopped, since the first epochs of a warmed-up, decaying schedule rank deltas poorly."""
    return {"max_t": max(epochs, 1), "grace_period": max(1, epochs // 4), "reduction_factor": REDUCTION_FACTOR}


class ControllerSearcher(Searcher):
    def __init__(self, controller: Controller, max_concurrent: int, pack: str = "off", pack_most: int | None = None):
        super().__init__(metric=METRIC, mode="max")
        self.controller = controller
        self.max_concurrent = max_concurrent
        self.pack = pack  # --pack: which tickets may share one Tune trial (search/packs.py)
        self.pack_most = pack_most  # the most tickets one Tune trial holds (packs.most); None: as many as pack
        self.numbers: dict[str, list[int]] = {}  # Tune trial id -> its Optuna trial numbers (several: a pack)
        self.held: list[Ticket] = []  # a ticket drawn while filling a pack that could not join it: the next trial

    def suggest(self, trial_id: str) -> dict | str | None:
        if len(self.numbers) >= self.max_concurrent:
            return None
        outcome = self.held.pop(0) if self.held else self.controller.next_trial()
        if outcome == DONE:
            return Searcher.FINISHED if not self.numbers else None
        if outcome == WAIT:
            return None
        tickets = [outcome, *self._pack_with(outcome)]
        self.numbers[trial_id] = [ticket.number for ticket in tickets]
        if len(tickets) == 1:
            return {TICKET_KEY: ticket_json(outcome)}
        log.info("training finalists %s together as one pack", ", ".join(str(t.number) for t in tickets))
        return {TICKET_KEY: pack_json(tickets, packs.measured(self.pack))}

    def _pack_with(self, first: Ticket) -> list[Ticket]:
        """The tickets the controller hands out next that can train in one pack with `first` (search/packs.py);
        the first that cannot is held for the next Tune trial."""
        if not packs.packable(first, self.pack):
            return []
        more: list[Ticket] = []
        room = lambda: self.pack_most is None or len(more) + 1 < self.pack_most  # noqa: E731
        while room() and isinstance(ticket := self.controller.next_trial(), Ticket):
            if not (packs.packable(ticket, self.pack) and packs.same_pack(first, ticket)):
                self.held.append(ticket)
                break
            more.append(ticket)
        return more

    def on_trial_result(self, trial_id: str, result: dict) -> None:
        numbers = self.numbers.get(trial_id)
        if numbers and EVENT_KEY in result:
            self.controller.report(result.get(MEMBER_KEY, numbers[0]), json.loads(result[EVENT_KEY]))

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        numbers = self.numbers.pop(trial_id, None)
        if not numbers:
            return
        if error:
            for number in numbers:
                self.controller.crash(number, "the trial's Ray worker died (its error is in the log above)")
        elif result and RESULT_KEY in result:
            results = json.loads(result[RESULT_KEY])
            for number in numbers:
                self.controller.finish(number, results[str(number)] if result.get(PACK_KEY) else results)
        elif result:  # stopped by the scheduler; the result that stopped it was not passed to on_trial_result
            if EVENT_KEY in result:
                self.controller.report(result.get(MEMBER_KEY, numbers[0]), json.loads(result[EVENT_KEY]))
            for number in numbers:
                self.controller.stop_early(number, "early stopping")
        # no result: never started; the controller re-queues it when the run ends

    def __getstate__(self) -> dict:
        # Tune pickles its whole config for Tuner.restore, which autopelt never uses: the study is the state.
        # The controller (an open study, the live view's output) stays out of that file.
        return {"_metric": self._metric, "_mode": self._mode, "max_concurrent": self.max_concurrent,
                "pack": self.pack, "pack_most": self.pack_most}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, controller=None, numbers={}, held=[])

    def save(self, checkpoint_path: str) -> None:
        Path(checkpoint_path).write_text("{}")  # the study is the state; nothing to save here

    def restore(self, checkpoint_path: str) -> None:
        pass


class FinalistsStopper(Stopper):
    """Stops a trial at its latest report when the controller says the finalists need its worker
    (`Controller.superseded`); never a trial's final result, and never the whole experiment."""

    def __init__(self, searcher: ControllerSearcher):
        self.searcher = searcher

    def __call__(self, trial_id: str, result: dict) -> bool:
        numbers = self.searcher.numbers.get(trial_id) if self.searcher else None  # a pack: finalists, never stopped
        return numbers is not None and len(numbers) == 1 and RESULT_KEY not in result \
            and self.searcher.controller.superseded(numbers[0])

    def stop_all(self) -> bool:
        return False

    def __getstate__(self) -> dict:  # like the searcher's: the study is the state
        return {}

    def __setstate__(self, state: dict) -> None:
        self.searcher = None


class UnreportedErrors(tune.Callback):
    """Queues again a trial that Tune ended in ERROR without telling the searcher: a reused worker whose last trial's
    thread did not end in time ("Trainable runner reuse requires reset_config() …": Tune 2.60 marks the new trial
    ERROR before it starts and calls no searcher), which left the controller waiting for a trial that would never
    report."""

    def __init__(self, searcher: ControllerSearcher):
        self.searcher = searcher

    def on_step_end(self, iteration: int, trials: list, **info) -> None:
        if self.searcher is None:
            return
        for trial in trials:
            if trial.status == trial.ERROR and trial.trial_id in self.searcher.numbers:
                log.warning("Tune ended trial %s in an error it did not report: its worker did not take it; the "
                            "trial is queued again", trial.trial_id)
                for number in self.searcher.numbers.pop(trial.trial_id):
                    self.searcher.controller.interrupt(number)

    def __getstate__(self) -> dict:  # like the searcher's: the study is the state
        return {}

    def __setstate__(self, state: dict) -> None:
        self.searcher = None


@contextlib.contextmanager
def ray_session(plan: SearchPlan):
    """Ray for the search: the given cluster, or a local one started here (and stopped on exit); an already
    initialised Ray is used as it is. UserError when the cluster cannot be reached."""
    if ray.is_initialized():
        yield
        return
    common = {"include_dashboard": False, "log_to_driver": True, "logging_level": logging.WARNING}
    if plan.options.ray_address:
        _check_reachable(plan.options.ray_address)
    try:
        if plan.options.ray_address:
            ray.init(address=plan.options.ray_address, **common, runtime_env=_worker_environment())
        else:
            # a new local cluster turns on token authentication and says so at every start; keep the
            # protection, drop the notice (RAY_AUTH_MODE still decides, as Ray documents)
            logging.getLogger(RAY_TOKEN_NOTICE).setLevel(logging.ERROR)
            if plan.options.precision == "auto":  # one measurement for every trial on this machine
                devices.share_cpu_bf16_speedup()
            # the local workers inherit it: fewer glibc heaps, each returned to the system after a trial
            # (devices.release_memory); with one heap a thread, a reused worker's memory climbed from trial to trial
            os.environ.setdefault("MALLOC_ARENA_MAX", "2")
            ray.init(**common, runtime_env=_worker_environment())
    except (ConnectionError, RuntimeError, ValueError) as error:
        where = f"the Ray cluster at {plan.options.ray_address}" if plan.options.ray_address else "a local Ray"
        raise UserError(f"cannot start or reach {where}: {str(error).strip().splitlines()[0]}") from None
    try:
        if plan.options.ray_address:
            _warn_if_too_small(plan)
        yield
    finally:
        ray.shutdown()


THREAD_TIMEOUT_S = "60"  # how long a reused worker waits for its last trial's thread to end (Tune's default: 2 s)


def _worker_environment() -> dict:
    """What every trial's worker is started with: time for a stopped trial's thread to end before the worker takes
    the next trial. Tune waits 2 s; a trial stopped on a loaded machine (releasing its memory, mid-epoch until its
    next report) took longer, Tune then failed the next trial without telling the searcher (`UnreportedErrors`)."""
    return {"env_vars": {"TUNE_FUNCTION_THREAD_TIMEOUT_S": os.environ.get("TUNE_FUNCTION_THREAD_TIMEOUT_S",
                                                                          THREAD_TIMEOUT_S)}}


def on_cluster(plan: SearchPlan) -> SearchPlan:
    """The plan placed on the Ray cluster it reached (`resources.cluster_placement`: one trial per GPU without
    --workers); a local Ray's plan as it is. A cluster whose GPUs the trials would not get is warned of."""
    if not plan.options.ray_address:
        return plan
    current = resources.Placement(plan.options.workers, plan.cpus_per_trial, plan.gpus_per_trial)
    placement, warning = resources.cluster_placement(plan.workers_given, plan.options.gpus_per_trial is not None,
                                                     ray.cluster_resources(), current)
    if warning:
        log.warning(warning)
    return plan.placed(placement)


def run_trials(controller: Controller, plan: SearchPlan) -> None:
    """Run the search's trials on Ray Tune (inside `ray_session`) until the controller has nothing to start."""
    searcher = ControllerSearcher(controller, plan.options.workers, plan.options.pack,
                                  packs.most(plan.finalists, plan.options.workers))
    tuner = tune.Tuner(
        tune.with_resources(_trainable, {"cpu": plan.cpus_per_trial, "gpu": plan.gpus_per_trial}),
        tune_config=tune.TuneConfig(
            search_alg=searcher,
            scheduler=_scheduler(plan),
            num_samples=-1,
            reuse_actors=True,
            time_budget_s=controller.time_left(),
            trial_name_creator=_trial_name,
            trial_dirname_creator=_trial_name,
        ),
        run_config=tune.RunConfig(
            name=f"run-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}",
            storage_path=str(plan.out_dir / "ray"),
            stop=FinalistsStopper(searcher),
            callbacks=[UnreportedErrors(searcher)],
            verbose=0,
            failure_config=tune.FailureConfig(max_failures=0),
        ),
    )
    _tune_environment()
    try:
        with pending_trials(plan.options.workers):
            tuner.fit()
    except RuntimeError as error:  # Ray's memory monitor killed a worker: Tune ends the run, not the trial
        if "running low on memory" not in str(error):
            raise
        raise SearchStopped("Ray killed a trial's worker: the machine ran low on memory; run the same command "
                            "again to resume, with fewer --workers, or a smaller --batch-size or --max-length") \
            from None


PENDING_TRIALS = "TUNE_MAX_PENDING_TRIALS_PG"


@contextlib.contextmanager
def pending_trials(workers: int):
    """Let Tune start as many trials at once as there are workers. Tune keeps a searcher's trials pending one at a
    time (PENDING_TRIALS "auto" is 1 for any searcher but its own random and grid ones), so each trial's worker
    would wait for the last one's to start (docs/speed.md). A value the user set is kept; the old one is back
    afterwards."""
    before = os.environ.get(PENDING_TRIALS)
    if before is None:
        os.environ[PENDING_TRIALS] = str(max(1, workers))
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(PENDING_TRIALS, None)


def _scheduler(plan: SearchPlan):
    if not plan.options.early_stopping:
        return FIFOScheduler()
    return ASHAScheduler(time_attr=TIME_ATTR, metric=METRIC, mode="max", stop_last_trials=False,
                         **asha_settings(plan.epochs))


def _tune_environment() -> None:
    """The live view is the progress display: no Tune tables, no per-trial Tune logs (the study is the record).
    Ray 2.60 refuses to run while the old TUNE_RESULT_DIR is set; `storage_path` says where Tune writes."""
    os.environ.pop("TUNE_RESULT_DIR", None)
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)
    tune_log = logging.getLogger("ray.tune.tune")
    if not any(isinstance(f, NoRestoreHint) for f in tune_log.filters):
        tune_log.addFilter(NoRestoreHint())


class NoRestoreHint(logging.Filter):
    """Drops Tune's "Resume experiment with: Tuner.restore(...)" after Ctrl-C: an autopelt search resumes by running
    the same command again (the search says so itself), never through Tune's experiment state."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Tuner.restore(" not in record.getMessage()


def _trial_name(trial) -> str:
    return f"trial_{trial.trial_id}"


def _check_reachable(address: str, seconds: float = 10) -> None:
    """ray.init retries an unreachable address for minutes; a plain TCP connect answers at once."""
    host_port = address.removeprefix("ray://")
    host, _, port = host_port.rpartition(":")
    if not host or not port.isdigit():  # "auto" and friends: Ray resolves them
        return
    try:
        socket.create_connection((host, int(port)), timeout=seconds).close()
    except OSError as error:
        raise UserError(f"cannot reach the Ray cluster at {address} ({error.strerror or error})") from None


def _warn_if_too_small(plan: SearchPlan) -> None:
    have = ray.cluster_resources()
    for name, need in (("CPU", plan.cpus_per_trial), ("GPU", plan.gpus_per_trial)):
        if need > have.get(name, 0):
            log.warning("each trial asks for %g %s but the cluster has %g: trials wait until it grows",
                        need, name, have.get(name, 0))


def ticket_json(ticket: Ticket) -> str:
    return json.dumps({"settings": ticket.settings.to_dict(), "stoppable": ticket.stoppable})


def pack_json(tickets: list[Ticket], measure: bool = False) -> str:
    """A pack's tickets, each with its Optuna trial number (its events and result are sent keyed by it), and whether
    it trains packed only where its measured step pays (`packs.measured`)."""
    return json.dumps({"pack": [{"number": t.number, "settings": t.settings.to_dict()} for t in tickets],
                       "measure": measure})


# -- inside a Ray worker ------------------------------------------------------------------------------------


def _trainable(tune_config: dict) -> None:
    _wait_for_trials_at_exit()
    _RUNNING_TRIALS.add(threading.current_thread())
    try:
        _train(tune_config)
    finally:
        _RUNNING_TRIALS.discard(threading.current_thread())


@functools.cache
def _wait_for_trials_at_exit() -> None:
    atexit.register(_let_trials_unwind)


def _let_trials_unwind(timeout: float = UNWIND_WAIT_S) -> None:
    """Wait, at most `timeout` seconds in all, for the threads of trials this worker is still running: a trial Tune
    stopped unwinds (frees its tensors, gives back GPU memory) before the interpreter finalises."""
    deadline = time.monotonic() + timeout
    for thread in list(_RUNNING_TRIALS):
        if thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))


def _train(tune_config: dict) -> None:
    from autopelt.train import TrialSettings, run_trial

    ticket = json.loads(tune_config[TICKET_KEY])
    if "pack" in ticket:
        _train_pack(ticket["pack"], ticket.get("measure", False))
        return
    settings = TrialSettings.from_dict({**ticket["settings"], **_placement()})
    last_epoch = settings.epochs if ticket["stoppable"] else 0

    def report(event: dict) -> None:
        payload = {METRIC: _number(event.get("dev_metric")), EVENT_KEY: json.dumps(event, default=str)}
        if int(event.get("epoch") or 0) < last_epoch:  # ASHA's: epochs before the last, of searched trials
            payload[TIME_ATTR] = int(event["epoch"])
        tune.report(payload)

    result = _call(run_trial, settings, report)
    _write_result(settings.out_dir, result)
    tune.report({METRIC: _number(result.get("dev_metric")), RESULT_KEY: json.dumps(result, default=str)})


def _train_pack(members: list[dict], measure: bool = False) -> None:
    """Train a pack's members with `run_packed` (`measure`: packed only where its measured step pays), never shown
    to ASHA (a pack holds finalists only); each member's events and its result are sent keyed by its Optuna trial
    number."""
    from autopelt.train import TrialSettings
    from autopelt.train.packed import run_packed

    placement = _placement()
    numbers = [member["number"] for member in members]
    settings = [TrialSettings.from_dict({**member["settings"], **placement}) for member in members]

    def reporter(number: int) -> Callable[[dict], None]:
        def report(event: dict) -> None:
            tune.report({METRIC: _number(event.get("dev_metric")), EVENT_KEY: json.dumps(event, default=str),
                         MEMBER_KEY: number})
        return report

    try:
        results = run_packed(settings, [reporter(number) for number in numbers], measure=measure)
    except Exception as error:
        results = [_failed(error, trial) for trial in settings]
    finally:
        devices.release_memory()
    for trial, result in zip(settings, results):
        _write_result(trial.out_dir, result)
    tune.report({METRIC: math.nan, PACK_KEY: True,
                 RESULT_KEY: json.dumps(dict(zip(map(str, numbers), results)), default=str)})


def _placement() -> dict:
    """The device and CPU threads Ray assigned this trial; torch follows them."""
    resources = tune.get_context().get_trial_resources().required_resources
    threads = max(1, int(resources.get("CPU", 1)))
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(threads)
    if "torch" in sys.modules:  # a reused worker: torch read OMP_NUM_THREADS long ago
        sys.modules["torch"].set_num_threads(threads)
    on_gpu = bool(ray.get_gpu_ids())
    share = float(resources.get("GPU", 0))
    total = devices.gpu_memory_bytes() if on_gpu and 0 < share < 1 else None
    if total:
        devices.limit_gpu_memory(gpu_share.memory_fraction(share, total))
    return {"device": "cuda" if on_gpu else "cpu", "threads": threads}


def _call(trial_fn: Callable, settings, report: Callable[[dict], None]) -> dict:
    """The trial's result; an exception (run_trial returns failures, but a worker can still break) becomes a
    failed result, so the search goes on."""
    try:
        result = trial_fn(settings, report)
    except Exception as error:
        return _failed(error, settings)
    finally:
        devices.release_memory()  # a long study on a reused worker does not creep
    if not isinstance(result, dict):
        return {"status": "failed", "reason": f"the trial function returned {type(result).__name__}, not a dict"}
    return result


def _failed(error: Exception, settings) -> dict:
    return {"status": "failed", "reason": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc(),
            "spec": settings.spec}


def _write_result(out_dir: str | None, result: dict) -> None:
    """Leave a result.json in the trial's folder when the trial itself did not (it raised)."""
    if not out_dir:
        return
    path = Path(out_dir) / "result.json"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(result, indent=2, default=str))


def _number(value) -> float:
    return float(value) if is_finite_number(value) else math.nan

"""Trials left RUNNING by a controller that died: found, failed as `interrupted`, and queued again.

A controller marks each trial it runs with `controller` = {host, pid, start} and keeps a heartbeat for it in
Optuna's heartbeat table. A RUNNING trial is interrupted when its controller ran on this host and that
process is gone (seen at once, so re-running a killed search resumes immediately), or when its heartbeat is
older than the grace period (a controller on another machine). Optuna's heartbeat storage is public; finding the
stale trials without failing them is not (autopelt.study.optuna_private says why). Failing a trial is a guarded
state change, so when several processes notice the same trial only one of them re-queues it.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterable

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial, TrialState

from autopelt.search.claims import INTERRUPTED
from autopelt.study import optuna_private
from autopelt.study.record import failed, read, requeued

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 20
GRACE_SECONDS = 120  # a heartbeat older than this means the controller is gone


@dataclass(frozen=True)
class Owner:
    """One controller process, recognisable later even if its pid is reused."""

    host: str
    pid: int
    start: str  # the process's start time as the kernel counts it ("" where unknown)

    @classmethod
    def current(cls) -> Owner:
        return cls(host_id(), os.getpid(), _start_time(os.getpid()))

    def to_attr(self) -> dict:
        return asdict(self)

    @staticmethod
    def is_gone(attr: dict | None) -> bool:
        """True only when the owner certainly no longer runs: it ran on this host and its process is gone."""
        if not isinstance(attr, dict) or attr.get("host") != host_id():
            return False
        pid = attr.get("pid")
        if not isinstance(pid, int) or not _pid_exists(pid):
            return True
        return bool(attr.get("start")) and _start_time(pid) != attr["start"]


@lru_cache(maxsize=1)
def host_id() -> str:
    """Host name plus boot id: two machines (or two boots) never share it."""
    boot = Path("/proc/sys/kernel/random/boot_id")
    suffix = boot.read_text().strip()[:8] if boot.exists() else ""
    return f"{socket.gethostname()}/{suffix}" if suffix else socket.gethostname()


def _pid_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _start_time(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]  # field 22, after the parenthesised command name


def interrupted_trials(study: optuna.Study, own: Iterable[int] = ()) -> list[FrozenTrial]:
    """RUNNING trials (not ours) whose controller is gone."""
    own = set(own)
    running = [t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)) if t.number not in own]
    if not running:
        return []
    stale = optuna_private.stale_trial_ids(study)
    orphan_before = time.time() - GRACE_SECONDS
    return [t for t in running if _gone(t, stale, orphan_before)]


def unmarked(trials: Iterable[FrozenTrial]) -> bool:
    """Whether a RUNNING trial has no controller yet: asked a moment ago by a live one, or by one killed before it
    marked the trial, which only the trial's age reveals (GRACE_SECONDS)."""
    return any(t.state == TrialState.RUNNING and read(t).controller is None for t in trials)


def _gone(trial: FrozenTrial, stale: set[int], orphan_before: float) -> bool:
    owner = read(trial).controller
    if owner is None:  # died between ask and marking the trial: only its age tells
        start = trial.datetime_start or datetime.now()
        return start.timestamp() < orphan_before
    return Owner.is_gone(owner) or optuna_private.trial_id(trial) in stale


def fail_and_requeue(study: optuna.Study, trial: FrozenTrial) -> bool:
    """FAIL `trial` as interrupted and queue its parameters again; False if someone else got there first."""
    storage, trial_id = optuna_private.storage_of(study), optuna_private.trial_id(trial)
    try:
        for key, value in failed(INTERRUPTED).items():
            storage.set_trial_user_attr(trial_id, key, value)
        if not storage.set_trial_state_values(trial_id, state=TrialState.FAIL):
            return False
    except UpdateFinishedTrialError:
        return False
    study.enqueue_trial(dict(trial.params), user_attrs=requeued(trial))
    log.info("trial %d was interrupted; queued again", trial.number)
    return True


class Heartbeat:
    """A daemon thread that records a heartbeat for every trial this controller runs."""

    def __init__(self, study: optuna.Study, trial_ids: Callable[[], list[int]], every: float = HEARTBEAT_SECONDS):
        self._storage = optuna_private.storage_of(study)
        self._trial_ids = trial_ids
        self._every = every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="autopelt-heartbeat", daemon=True)

    def beat(self, trial_id: int) -> None:
        try:
            self._storage.record_heartbeat(trial_id)
        except Exception as error:  # a missed beat is retried; the grace period covers several
            log.warning("heartbeat for trial id %d failed: %s", trial_id, error)

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            for trial_id in self._trial_ids():
                self.beat(trial_id)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

"""`python -m support.serial_cli ARGS…`: the autopelt CLI with a search's trials run one at a time in this process
(no Ray), training for real, so a test can kill the whole search with SIGKILL and run the same command again."""

from __future__ import annotations

import contextlib
import sys


def serial(monkeypatch=None) -> None:
    """Route `autopelt search`'s trials through support.fakes.run_serially with the real `run_trial`; with pytest's
    `monkeypatch`, undone after the test."""
    from support import fakes

    from autopelt.search import ray_backend
    from autopelt.train import run_trial

    def session(plan):
        return contextlib.nullcontext()

    def trials(controller, plan):
        return fakes.run_serially(controller, run_trial)

    for name, value in (("ray_session", session), ("run_trials", trials)):
        if monkeypatch is None:
            setattr(ray_backend, name, value)
        else:
            monkeypatch.setattr(ray_backend, name, value)


if __name__ == "__main__":
    serial()
    from autopelt.cli import main

    sys.exit(main(sys.argv[1:]))

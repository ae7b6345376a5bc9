"""A trial's progress: a bar on a terminal, lines elsewhere (a log file, CI, a Ray worker)."""

from __future__ import annotations

import sys
import time


# Off a terminal (a file, nohup, CI, a Ray log) a long epoch, or a learning-rate sweep's candidates (their steps
# count in the same total), still says it is alive and how long is left, this often.
QUIET_LINE_SECONDS = 60.0


def with_progress(settings, run_trial) -> dict:
    """A progress bar on a terminal; elsewhere one line per evaluation (each epoch), and one per
    QUIET_LINE_SECONDS within a long epoch, so a log file holds lines, not a bar's carriage returns."""
    progress = _Bar() if sys.stderr.isatty() else _Lines()
    try:
        return run_trial(settings, report=progress.report, on_step=progress.on_step)
    finally:
        progress.close()


class _Bar:
    def __init__(self) -> None:
        from tqdm import tqdm

        self.bar = tqdm(desc="training", unit="step", dynamic_ncols=True, leave=False)

    def on_step(self, step: int, total: int, loss: float) -> None:
        self.bar.total = total
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{loss:.4f}")

    def report(self, entry: dict) -> None:
        self.bar.write(epoch_line(entry, self.bar.total or 0))

    def close(self) -> None:
        self.bar.close()


class _Lines:
    def __init__(self) -> None:
        self.last_line = self.started = time.monotonic()
        self.total = 0

    def on_step(self, step: int, total: int, loss: float) -> None:
        self.total = total
        now = time.monotonic()
        if now - self.last_line >= QUIET_LINE_SECONDS:
            left = (now - self.started) / max(step, 1) * max(total - step, 0)  # at the pace so far
            self._print(f"step {step}/{total}: loss {loss:.4f}, about {_duration(left)} left")

    def report(self, entry: dict) -> None:
        self._print(epoch_line(entry, self.total))

    def _print(self, line: str) -> None:
        print(line, flush=True)
        self.last_line = time.monotonic()

    def close(self) -> None:
        pass


def epoch_line(entry: dict, total_steps: int = 0) -> str:
    steps = f"{entry['step']}/{total_steps}" if total_steps else str(entry["step"])
    return f"epoch {entry['epoch']} step {steps}: dev {metrics_text(entry['dev'])}"


def metrics_text(values: dict) -> str:
    return " ".join(f"{k} {v:.4f}" for k, v in values.items())


def _duration(seconds: float) -> str:
    minutes, rest = divmod(int(round(seconds)), 60)
    return f"{minutes}m{rest:02d}s" if minutes else f"{rest}s"

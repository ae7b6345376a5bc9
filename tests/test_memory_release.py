"""What a finished trial gives back on a reused worker (train/device.release_memory), and a worker Ray kills for
memory: one line that says how to go on, not Tune's traceback."""

from __future__ import annotations

import sys

import pytest
from test_search_controller import make

from autopelt.search import ray_backend
from autopelt.search.controller import SearchStopped
from autopelt.train import device


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_the_c_heap_is_given_back_on_glibc():
    assert device.trim_host_heap() is True
    device.release_memory()  # and with it, every trial's end


class _KilledTuner:
    def __init__(self, *args, **kwargs):
        pass

    def fit(self):
        raise RuntimeError("Caught unexpected exception: 1 worker(s) were killed due to the node running low on "
                           "memory. Memory on the node (IP: 192.0.2.2) was 22.40GB used")


def test_a_worker_killed_for_memory_stops_the_search_in_one_line(tmp_path, monkeypatch):
    study, control = make(tmp_path, budget=4)
    monkeypatch.setattr(ray_backend.tune, "Tuner", _KilledTuner)
    with pytest.raises(SearchStopped, match="^Ray killed a trial's worker: the machine ran low on memory; run the "
                                            "same command again to resume, with fewer --workers"):
        ray_backend.run_trials(control, control.plan)


def test_any_other_tune_error_is_not_taken_for_memory(tmp_path, monkeypatch):
    class Broken(_KilledTuner):
        def fit(self):
            raise RuntimeError("something else")

    study, control = make(tmp_path, budget=4)
    monkeypatch.setattr(ray_backend.tune, "Tuner", Broken)
    with pytest.raises(RuntimeError, match="something else"):
        ray_backend.run_trials(control, control.plan)

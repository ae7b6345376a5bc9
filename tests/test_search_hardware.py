"""How many trials a search runs at once without --workers, and what each gets, on machines described by a probe
(`search/hardware.py`): no GPU, one H200, small cards, a Ray cluster. The trial's memory is an input here (what one
measured step would say); the measurement itself runs in tests/test_search_controller.py."""

from __future__ import annotations

import pytest
from conftest import GLUE_DIR
from support import fakes

from autopelt.search import gpu_share, resources
from autopelt.search.hardware import Gpu, Hardware
from autopelt.search.options import SearchOptions
from autopelt.search.plan import prepare
from autopelt.search.resources import Placement, StepProbe

GIB = 2**30
H200 = Gpu("NVIDIA H200", 140 * GIB, 139 * GIB)


def options(**given) -> SearchOptions:
    return SearchOptions(task="rte", **given)


def step(gib: float | None, shape: str = "batch 32 x 128 tokens") -> StepProbe:
    def measure() -> int:
        if gib is None:
            raise RuntimeError("CUDA out of memory. Tried to allocate 9.00 GiB\nmore")
        return int(gib * GIB)

    return StepProbe(shape, measure)


def test_a_machine_without_a_gpu_runs_one_trial_at_a_time_on_all_its_cores():
    """As before the hardware chose: the header's study line says "1 worker", and nothing more is said."""
    assert resources.place(options(), Hardware(8), step(1)) == Placement(1, 8, 0, "")
    assert resources.place(options(cpus_per_trial=2), Hardware(8), step(1)) == Placement(1, 2, 0, "")


def test_an_h200_runs_as_many_trials_as_its_cores_feed_when_its_memory_holds_more():
    """2 GiB a trial: 0.85 x 139 / (2 + 0.59) = 45 fit in memory; 16 cores feed 15 beside the search's own."""
    placed = resources.place(options(), Hardware(16, (H200,)), step(2))
    assert (placed.workers, placed.cpus_per_trial) == (15, 1)
    assert placed.gpus_per_trial == pytest.approx(1 / 15)
    assert placed.note == ("15 workers on 16 CPU cores, 1 GPU (NVIDIA H200, 139 of 140 GiB free): 45 fit in the GPUs' "
                           "free memory at 2.0 GiB a trial (batch 32 x 128 tokens); the cores feed 15 at 1 a trial "
                           "beside the search's own (--workers to choose)")


def test_small_cards_hold_as_many_trials_as_fit_in_their_free_memory():
    """10 GiB a trial on two cards with 24 GiB free: one on each (0.85 x 24 / 10.6 = 1.9)."""
    cards = Hardware(32, (Gpu("NVIDIA L4", 24 * GIB, 24 * GIB),) * 2)
    placed = resources.place(options(), cards, step(10))
    assert (placed.workers, placed.gpus_per_trial, placed.cpus_per_trial) == (2, 1, 16)
    assert gpu_share.trials_fitting(24 * GIB, 10 * GIB) == 1
    busy = Hardware(32, (Gpu("NVIDIA L4", 24 * GIB, 4 * GIB),))  # another process holds most of it
    assert resources.place(options(), busy, step(10)).workers == 1  # never none: the trial says so if it fails


def test_workers_and_shares_asked_for_win():
    machine = Hardware(16, (H200,))
    assert resources.place(options(workers=3), machine, step(2)).workers == 3
    assert resources.place(options(cpus_per_trial=4), machine, step(2)).workers == 3  # (16 - 1) // 4
    halves = resources.place(options(gpus_per_trial=0.5), machine, step(2))
    assert (halves.workers, halves.gpus_per_trial) == (2, 0.5)


def test_a_failed_measurement_puts_one_trial_on_each_gpu_and_says_why():
    placed = resources.place(options(), Hardware(16, (H200, H200)), step(None))
    assert (placed.workers, placed.gpus_per_trial) == (2, 1)
    assert "one trial a GPU, unmeasured: a training step at batch 32 x 128 tokens failed (CUDA out of memory. Tried " \
           "to allocate 9.00 GiB)" in placed.note


def test_a_ray_cluster_runs_one_trial_per_gpu_and_warns_when_its_gpus_would_go_unused():
    current = resources.place(options(ray_address="10.0.0.1:6379"), Hardware(2), step(None))
    assert (current.workers, current.gpus_per_trial) == (1, 0)
    placed, warning = resources.cluster_placement(False, False, {"CPU": 64.0, "GPU": 4.0}, current)
    assert (placed.workers, placed.gpus_per_trial, warning) == (4, 1, "")
    assert placed.note.startswith("4 workers: the Ray cluster's 4 GPUs, one a trial")
    kept, warning = resources.cluster_placement(True, False, {"CPU": 64.0, "GPU": 4.0}, current)
    assert kept == current and warning == ("the Ray cluster has 4 GPUs but each trial asks for none: pass "
                                           "--gpus-per-trial (1, or a share) to train on them")
    assert resources.cluster_placement(False, False, {"CPU": 64.0}, current) == (current, "")


def test_the_plan_holds_the_workers_the_hardware_gave_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_share, "measure_trial_bytes", lambda *a, **k: 2 * GIB)
    asked = SearchOptions(task="rte", storage=f"sqlite:///{tmp_path}/study.db", out=str(tmp_path / "out"),
                          space=str(fakes.SPACE), data_dir=str(GLUE_DIR), baselines=False, portfolio="none",
                          budget=20)
    plan = prepare(asked, Hardware(16, (H200,)))
    assert (plan.options.workers, plan.cpus_per_trial, plan.workers_given) == (15, 1, False)
    assert plan.gpu_note.startswith("15 workers on 16 CPU cores, 1 GPU (NVIDIA H200")
    assert plan.finalists == 6  # 3 rounded up to a round of 15 workers, at most a third of the 20 trials
    assert prepare(asked, Hardware(2)).options.workers == 1


def test_a_plan_on_a_ray_cluster_takes_one_trial_per_gpu_it_has(tmp_path, monkeypatch, caplog):
    """The cluster as `ray.cluster_resources()` describes it (the probe of a cluster); the finalists follow the
    workers (3 rounded up to a round of 4)."""
    from autopelt.search import ray_backend

    monkeypatch.setattr(ray_backend.ray, "cluster_resources", lambda: {"CPU": 64.0, "GPU": 4.0})

    def plan(**given):
        return prepare(SearchOptions(task="rte", storage=f"sqlite:///{tmp_path}/study.db", out=str(tmp_path / "out"),
                                     space=str(fakes.SPACE), data_dir=str(GLUE_DIR), baselines=False,
                                     portfolio="none", budget=20, ray_address="10.0.0.1:6379", **given), Hardware(2))

    placed = ray_backend.on_cluster(plan())
    assert (placed.options.workers, placed.gpus_per_trial, placed.cpus_per_trial, placed.finalists) == (4, 1, 1, 4)
    assert placed.gpu_note.startswith("4 workers: the Ray cluster's 4 GPUs, one a trial") and not caplog.records
    asked = ray_backend.on_cluster(plan(workers=2))
    assert (asked.options.workers, asked.gpus_per_trial) == (2, 0)
    assert [r.getMessage() for r in caplog.records] == [
        "the Ray cluster has 4 GPUs but each trial asks for none: pass --gpus-per-trial (1, or a share) to train on "
        "them"]

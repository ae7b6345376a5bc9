"""`autopelt search --pack on` (and `auto`): the finalists of a real search on the tiny model train as one packed Ray
trial, each recorded as its own Optuna trial with the result it has when trained alone (`--pack off`), within the
packed core's float rounding (docs/packed.md, tests/test_packed.py); under `auto` packed only where the pack's
measured step pays, else each alone in that Ray trial."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import optuna
import pytest
from tinymodels import sst2_dir, tiny_model_dir  # noqa: F401  (fixtures)

from autopelt.errors import UserError
from autopelt.search import packs
from autopelt.search.options import SearchOptions, check_numbers
from autopelt.search.run import run_search
from autopelt.study.record import read_all

ray = pytest.importorskip("ray")
optuna.logging.set_verbosity(optuna.logging.WARNING)

TOLERANCE = 2e-5  # the packed core's: packed trials equal trials alone within it after two epochs in fp32
SPACE = """methods:
  lora:
    rank: {choice: [1, 2]}
train:
  learning_rate: {choice: [1e-3, 1e-2]}
  epochs: 2
  batch_size: 4
"""


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=1, include_dashboard=False, logging_level=logging.WARNING)
    yield
    ray.shutdown()


def _search(root: Path, model: Path, data: Path, pack: str):
    space = root / "lora_tiny.yaml"
    root.mkdir(parents=True)
    space.write_text(SPACE)
    options = SearchOptions(task="sst2", model=str(model), data_dir=str(data), space=str(space), budget=6,
                            finalists=2, workers=1, cpus_per_trial=1, baselines=False, portfolio="none",
                            sampler="random", early_stopping=False, precision="fp32", max_length=32,
                            storage=f"sqlite:///{root}/study.db", out=str(root / "out"), pack=pack)
    outcome = run_search(options, echo=lambda line: None)
    finalists = [r for r in read_all(outcome.study) if r.finalist_of]
    results = {r.number: json.loads((root / "out" / f"trial-{r.number:05d}" / "result.json").read_text())
               for r in finalists}
    for number, result in results.items():
        result["attrs"] = outcome.study.trials[number].user_attrs
    tune_trials = list((root / "out" / "ray").glob("run-*/trial_*"))
    return finalists, results, tune_trials


def _attrs(result: dict) -> dict:
    """A trial's study attributes (`attrs` of its result, as `_search` puts them there) but its timings, memory and folder (and its dev metric: compared within
    rounding)."""
    varying = {"seconds", "train_seconds", "eval_seconds", "examples_per_second", "peak_memory_mb", "result_dir",
               "dev", "dev_metric", "intermediate"}
    return {key: value for key, value in result["attrs"].items() if key not in varying}


@pytest.mark.slow
@pytest.mark.parametrize("pack", ["on", "auto"])
def test_packed_finalists_record_what_they_record_alone_and_train_in_one_tune_trial(
        pack, tmp_path, tiny_model_dir, sst2_dir, local_ray):  # noqa: F811
    alone, alone_results, alone_trials = _search(tmp_path / "off", tiny_model_dir, sst2_dir, "off")
    packed, packed_results, packed_trials = _search(tmp_path / pack, tiny_model_dir, sst2_dir, pack)

    assert [r.finalist_of for r in packed] == [r.finalist_of for r in alone] and len(packed) == 2
    assert [r.number for r in packed] == [4, 5] and all(r.state.name == "COMPLETE" for r in packed)
    for one, other in zip(packed, alone):
        assert one.values[0] == pytest.approx(other.values[0], abs=TOLERANCE)
        assert one.intermediate.keys() == other.intermediate.keys()
        assert one.spec == other.spec and one.learning_rate == other.learning_rate
        assert one.full_fidelity and one.fidelity == other.fidelity
        losses = [[entry["dev_loss"] for entry in results[one.number]["history"]]
                  for results in (packed_results, alone_results)]
        assert len(losses[0]) == 2 and losses[0] == pytest.approx(losses[1], abs=TOLERANCE)
        assert packed_results[one.number].keys() - {"packed"} == alone_results[other.number].keys()
        assert _attrs(packed_results[one.number]) == _attrs(alone_results[other.number])
    said = [packed_results[n]["packed"] for n in (4, 5)]
    if pack == "auto":  # measured: packed where it paid, else alone (either way the trial it is alone)
        steps = [entry.pop("step") for entry in said]
        assert steps[0] == steps[1] and steps[0]["packed_s"] > 0
        assert all(entry.pop("unpacked", "").startswith("its measured step did not pay") == (steps[0]["ratio"] > 0.9)
                   for entry in said)
    assert said == [{"members": 2, "member": 0}, {"members": 2, "member": 1}]
    assert not any("packed" in result for result in alone_results.values())
    assert (len(alone_trials), len(packed_trials)) == (6, 5)  # four searched trials, then the finalists


def test_pack_is_off_on_or_auto():
    check_numbers(SearchOptions(task="rte", pack="auto"))
    check_numbers(SearchOptions(task="rte", pack="on"))
    with pytest.raises(UserError, match="--pack must be off, on or auto"):
        check_numbers(SearchOptions(task="rte", pack="always"))


class _Controller:
    """Hands out the given tickets in order, then DONE; records what it is told."""

    def __init__(self, tickets):
        self.tickets, self.told = list(tickets), []

    def next_trial(self):
        from autopelt.search.controller import DONE

        return self.tickets.pop(0) if self.tickets else DONE

    def report(self, number, event):
        self.told.append(("report", number, event))

    def finish(self, number, result):
        self.told.append(("finish", number, result))


def _ticket(number: int, method: str, finalist: bool = True):
    from autopelt.search.controller import Ticket
    from autopelt.train import TrialSettings

    settings = TrialSettings(task="sst2", spec={"methods": [{"method": method}]}, learning_rate=1e-3, seed=1000)
    return Ticket(number, settings, stoppable=not finalist, finalist=finalist)


def test_a_pack_leaves_no_worker_idle():
    assert [packs.most(3, workers) for workers in (1, 2, 3, 4)] == [3, 2, 1, 1]
    assert packs.most(5, 2) == 3 and packs.most(0, 2) == 1


def test_the_searcher_packs_finalists_holds_the_next_ticket_and_sends_each_member_its_own():
    from autopelt.search.ray_backend import (EVENT_KEY, MEMBER_KEY, PACK_KEY, RESULT_KEY, TICKET_KEY,
                                             ControllerSearcher)

    def searcher(pack: str, tickets):
        return ControllerSearcher(_Controller(tickets), max_concurrent=2, pack=pack)

    auto = searcher("auto", [_ticket(4, "lora"), _ticket(5, "ia3"), _ticket(6, "prefix"), _ticket(7, "lora")])
    first = json.loads(auto.suggest("t1")[TICKET_KEY])
    assert [member["number"] for member in first["pack"]] == [4, 5] and auto.numbers == {"t1": [4, 5]}
    assert first["measure"] is True  # auto: packed where its measured step pays
    assert json.loads(auto.suggest("t2")[TICKET_KEY])["settings"]["spec"]["methods"][0]["method"] == "prefix"
    assert auto.suggest("t3") is None  # two Tune trials at most, however many tickets they hold
    auto.on_trial_result("t1", {EVENT_KEY: json.dumps({"epoch": 1}), MEMBER_KEY: 5})
    auto.on_trial_complete("t1", {PACK_KEY: True, RESULT_KEY: json.dumps({"4": {"r": 4}, "5": {"r": 5}})})
    assert auto.controller.told == [("report", 5, {"epoch": 1}), ("finish", 4, {"r": 4}), ("finish", 5, {"r": 5})]
    assert auto.numbers == {"t2": [6]}

    capped = ControllerSearcher(_Controller([_ticket(i, "lora") for i in (4, 5, 6)]), max_concurrent=2, pack="auto",
                                pack_most=packs.most(3, 2))
    assert [m["number"] for m in json.loads(capped.suggest("t1")[TICKET_KEY])["pack"]] == [4, 5]
    assert "settings" in json.loads(capped.suggest("t2")[TICKET_KEY])  # finalist 6 alone: no worker left idle
    assert capped.numbers == {"t1": [4, 5], "t2": [6]}

    on = searcher("on", [_ticket(4, "lora"), _ticket(5, "ia3")])
    assert json.loads(on.suggest("t1")[TICKET_KEY])["measure"] is False and on.numbers == {"t1": [4, 5]}
    off = searcher("off", [_ticket(4, "lora"), _ticket(5, "lora")])
    assert "settings" in json.loads(off.suggest("t1")[TICKET_KEY]) and off.numbers == {"t1": [4]}
    searched = searcher("auto", [_ticket(1, "lora", finalist=False), _ticket(2, "lora", finalist=False)])
    assert "settings" in json.loads(searched.suggest("t1")[TICKET_KEY]) and searched.numbers == {"t1": [1]}

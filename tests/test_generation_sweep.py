"""A generation trial given no learning rate sweeps one on dev loss (train/generate.py, sweep_generation_rate): the
winner goes on exactly as a run given its rate from the start, the sweep walks the ladder while its best sits at an
edge, a candidate whose loss diverges loses, and the trial records what the sweep chose."""

from __future__ import annotations

import json
import math

import pytest
import torch
from generationdata import make_tiny_lm_folder, write_e2e_like
from test_generation import train_args

from autopelt import cli, delta
from autopelt.train import generate
from autopelt.train.loop import NonFiniteLoss

pytest.importorskip("sacrebleu")
LORA = ("--method", "lora", "--rank", "4")


@pytest.fixture(scope="module")
def lm_dir(tmp_path_factory):
    return make_tiny_lm_folder(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_e2e_like(tmp_path_factory.mktemp("gen"))


def _sweep_args(args: list[str]) -> list[str]:
    """train_args without its --lr: the trial sweeps."""
    at = args.index("--lr")
    return args[:at] + args[at + 2:]


def test_the_winner_trains_as_a_run_given_its_rate_from_the_start(lm_dir, data_dir, tmp_path):
    assert cli.main(_sweep_args(train_args(lm_dir, data_dir, tmp_path / "swept", *LORA))) == 0
    swept = json.loads((tmp_path / "swept" / "result.json").read_text())
    assert swept["status"] == "ok", swept["reason"]
    choice = swept["lr_choice"]
    assert choice["how"] == "sweep" and len(choice["candidates"]) >= 3 and swept["learning_rate"] == choice["rate"]
    losses = {float(r): c["dev_loss"] for r, c in choice["candidates"].items()}
    assert choice["rate"] == min(losses, key=lambda r: math.inf if losses[r] is None else losses[r])

    given = train_args(lm_dir, data_dir, tmp_path / "given", *LORA)
    given[given.index("--lr") + 1] = repr(choice["rate"])
    assert cli.main(given) == 0
    plain = json.loads((tmp_path / "given" / "result.json").read_text())
    assert [e["dev_loss"] for e in swept["history"]] == [e["dev_loss"] for e in plain["history"]]
    from safetensors.torch import load_file

    a, b = (load_file(str(tmp_path / run / "delta" / "delta.safetensors")) for run in ("swept", "given"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


class _Scripted:
    """A run whose dev loss after its first epoch is `table(rate)` (None: the training loss diverges)."""

    def __init__(self, table):
        self.table, self.tried = table, []

    def install(self, monkeypatch):
        real = generate.GenerationRun._epoch

        def epoch(run):
            first = not run.history
            real(run)
            if first:
                rate = run.optimiser.defaults["lr"]
                self.tried.append(rate)
                loss = self.table(rate)
                if loss is None:
                    raise NonFiniteLoss("diverged")
                run.history[-1].update(dev_loss=loss, dev_metric=-loss, dev={"loss": loss})

        monkeypatch.setattr(generate.GenerationRun, "_epoch", epoch)


def _sweep(lm_dir, monkeypatch, table):
    from autopelt.models import load_language_model
    from autopelt.train import TrialSettings

    scripted = _Scripted(table)
    scripted.install(monkeypatch)
    model = delta.apply_delta(load_language_model(str(lm_dir)), {"methods": [{"method": "lora", "rank": 2}]})
    rows = [{"input_ids": [5, 6, 7, 8], "labels": [-100, -100, 7, 8]}] * 8
    settings = TrialSettings(task="e2e", spec={}, model=str(lm_dir), epochs=2, batch_size=4, threads=1)
    winner, choice = generate.sweep_generation_rate(model, rows, rows, settings, 0, torch.device("cpu"), None)
    return scripted.tried, winner, choice


def test_the_sweep_walks_down_the_ladder_while_the_lowest_rate_is_best(lm_dir, monkeypatch):
    tried, winner, choice = _sweep(lm_dir, monkeypatch, lambda rate: abs(math.log10(rate) - math.log10(1e-4)))
    assert tried == [3e-4, 1e-3, 3e-3, 1e-4, 3e-5]  # the start, then down while the lowest is best
    assert choice["rate"] == 1e-4 and winner.optimiser.defaults["lr"] == 1e-4 and winner.step == 2


def test_a_diverging_rate_loses_and_a_sweep_where_every_rate_diverges_fails(lm_dir, monkeypatch):
    tried, _, choice = _sweep(lm_dir, monkeypatch, lambda rate: None if rate >= 3e-3 else 1.0 / rate)
    assert choice["rate"] == 1e-3 and choice["candidates"]["0.003"]["dev_loss"] is None
    assert tried == [3e-4, 1e-3, 3e-3]  # the best inside the grid: no walk
    monkeypatch.undo()
    with pytest.raises(NonFiniteLoss, match="every rate of the sweep"):
        _sweep(lm_dir, monkeypatch, lambda rate: None)

"""A generation trial given no learning rate sweeps one on dev loss (train/lr_sweep.py, its GENERATION plan): the
winner goes on exactly as a run given its rate from the start, the sweep walks the ladder while its best sits at an
edge, a candidate whose loss diverges loses, equal losses go to the lowest rate, and the trial records what the
sweep chose."""

from __future__ import annotations

import json
import math

import pytest
import torch
from generationdata import make_tiny_lm_folder, write_e2e_like
from test_generation import train_args

from autopelt import cli, delta
from autopelt.train import generate, lr_sweep
from autopelt.train.loop import Evaluation, NonFiniteLoss

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
    """Runs whose first dev evaluation at a rate says `table(rate)` (None: the loss diverged); later ones are real."""

    def __init__(self, table):
        self.table, self.tried = table, []

    def install(self, monkeypatch):
        real = generate.Generation.evaluate

        def evaluate(objective, settings):
            evaluation = real(objective, settings)
            rate = settings.learning_rate
            if rate in self.tried:
                return evaluation
            self.tried.append(rate)
            loss = self.table(rate)
            if loss is None:
                raise NonFiniteLoss("diverged")
            return Evaluation({"loss": loss}, -loss, loss)

        monkeypatch.setattr(generate.Generation, "evaluate", evaluate)


def _sweep(lm_dir, monkeypatch, table):
    """(the rates tried in order, the winner's outcome trained to the end, the choice) on 8 rows, 2 epochs of 2
    steps."""
    from autopelt.models import load_language_model
    from autopelt.train import TrialSettings

    scripted = _Scripted(table)
    scripted.install(monkeypatch)
    model = delta.apply_delta(load_language_model(str(lm_dir)), {"methods": [{"method": "lora", "rank": 2}]})
    rows = [{"input_ids": [5, 6, 7, 8], "labels": [-100, -100, 7, 8]}] * 8
    settings = TrialSettings(task="e2e", spec={}, model=str(lm_dir), epochs=2, batch_size=4, threads=1)
    objective = generate.Generation(model, rows, rows, 0, torch.device("cpu"))
    outcome, choice = lr_sweep.train_at_chosen_rate(objective, settings, lr_sweep.GENERATION)
    return scripted.tried, outcome, choice.to_dict()


def test_the_sweep_walks_down_the_ladder_while_the_lowest_rate_is_best(lm_dir, monkeypatch):
    tried, outcome, choice = _sweep(lm_dir, monkeypatch, lambda rate: abs(math.log10(rate) - math.log10(1e-4)))
    assert tried == [3e-4, 1e-3, 3e-3, 1e-4, 3e-5]  # the start, then down while the lowest is best
    assert choice["rate"] == 1e-4 and choice["steps"] == 2
    assert outcome.history[0]["dev_loss"] == 0.0 and outcome.steps == 4  # 1e-4's own first epoch, then the second
    assert choice["candidates"]["0.0003"] == {"dev_loss": round(math.log10(3), 5)}


def test_equal_dev_losses_go_to_the_lowest_rate(lm_dir, monkeypatch):
    tried, outcome, choice = _sweep(lm_dir, monkeypatch, lambda rate: 1.0 if rate <= 3e-4 else 2.0)
    assert tried == [3e-4, 1e-3, 3e-3, 1e-4]  # 3e-4 at the lower edge, then 1e-4 as good: not an edge any more
    assert choice["rate"] == 1e-4


def test_a_diverging_rate_loses_and_a_sweep_where_every_rate_diverges_fails(lm_dir, monkeypatch):
    tried, _, choice = _sweep(lm_dir, monkeypatch, lambda rate: None if rate >= 3e-3 else 1.0 / rate)
    assert choice["rate"] == 1e-3 and choice["candidates"]["0.003"]["dev_loss"] is None
    assert tried == [3e-4, 1e-3, 3e-3]  # the best inside the grid: no walk
    monkeypatch.undo()
    with pytest.raises(NonFiniteLoss, match=r"every learning rate tried \(3e-05, 0.0001, 0.0003, 0.001, 0.003\)"):
        _sweep(lm_dir, monkeypatch, lambda rate: None)  # walked down while every rate failed, five at most

"""Packed trials (train/packed.py): trials trained together in one backbone pass equal the same trials alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from autopelt.data import pad_batch
from autopelt.delta.packing import pack_deltas, packing_refusal
from autopelt.errors import UserError
from autopelt.train import TrialSettings, run_packed
from autopelt.train.packed import refusal
from autopelt.train.trial import run_trial
from conftest import moved, tiny_batch, tiny_model
from tinymodels import tiny_model_dir  # noqa: F401  (a fixture)

# Rounding differs between a matmul over one trial's rows and over the pack's, and between paddings: measured
# differences after two epochs were at most 8e-6 (rsLoRA's), most below 3e-7.
ATOL, RTOL = 2e-5, 1e-4

MIXED = [  # (spec, learning rate, seed, batch size, epochs): three methods, rates, seeds, batch sizes, lengths
    ({"methods": [{"method": "lora", "rank": 4}]}, 1e-3, 0, 4, 2),
    ({"methods": [{"method": "ia3"}]}, 3e-3, 1, 4, 2),
    ({"methods": [{"method": "pfeiffer", "bottleneck": 8}]}, 1e-2, 2, 8, 3),
]


def _settings(model_dir, glue_dir, cache, out, spec, rate, seed, batch_size, epochs, **overrides):
    values = dict(task="sst2", spec=spec, model=str(model_dir), data_dir=str(glue_dir), cache_dir=str(cache),
                  protocol=16, dev_size=32, data_seed=0, seed=seed, epochs=epochs, batch_size=batch_size,
                  learning_rate=rate, max_length=64, eval_batch_size=64, threads=1, attention="eager",
                  precision="fp32", out_dir=str(out))
    return TrialSettings(**{**values, **overrides})


def _weights(result) -> dict[str, torch.Tensor]:
    return load_file(Path(result["delta_dir"]) / "delta.safetensors")


def _assert_same_trial(alone: dict, packed: dict) -> None:
    assert alone["status"] == packed["status"] == "ok", (alone["reason"], packed["reason"])
    assert [h["step"] for h in packed["history"]] == [h["step"] for h in alone["history"]]
    for ours, theirs in zip(packed["history"], alone["history"]):
        assert ours["dev"] == pytest.approx(theirs["dev"], abs=ATOL)
        assert ours["dev_loss"] == pytest.approx(theirs["dev_loss"], abs=ATOL, rel=RTOL)
    assert packed["best_epoch"] == alone["best_epoch"] and packed["stopped_by"] == alone["stopped_by"]
    ours, theirs = _weights(packed), _weights(alone)
    assert ours.keys() == theirs.keys()
    for name in theirs:
        torch.testing.assert_close(ours[name], theirs[name], atol=ATOL, rtol=RTOL, msg=name)


def test_packed_trials_equal_the_same_trials_alone(tiny_model_dir, glue_dir, tmp_path):
    """LoRA, (IA)3 and a Pfeiffer adapter at their own rates, seeds, batch sizes and epochs, on real SST-2 rows:
    packed, each has the dev history, early stop and final delta of its trial alone. The second stops at its first
    evaluation (its report says so) and leaves the pack; the third's schedule ends before the first's."""
    stop_first = lambda entry: True  # noqa: E731  (a scheduler's stop)
    reports = [None, stop_first, None]
    make = lambda name, i, t: _settings(tiny_model_dir, glue_dir, tmp_path / "cache",  # noqa: E731
                                        tmp_path / f"{name}{i}", *t)
    alone = [run_trial(make("alone", i, t), reports[i]) for i, t in enumerate(MIXED)]
    packed = run_packed([make("packed", i, t) for i, t in enumerate(MIXED)], reports)
    for i, (one, together) in enumerate(zip(alone, packed)):
        assert together["packed"] == {"members": 3, "member": i}
        _assert_same_trial(one, together)
    assert [r["stopped_by"] for r in packed] == [None, "scheduler", None]
    assert [r["steps"] for r in packed] == [8, 4, 6]  # 16 train rows: each left the pack at its own step


@pytest.mark.parametrize("spec, pooling", [
    ({"methods": [{"method": "lora", "rank": 4, "dora": True}]}, "mean"),
    ({"methods": [{"method": "houlsby", "bottleneck": 8}]}, "cls"),
    ({"methods": [{"method": "bitfit"}]}, "cls"),
    ({"methods": [{"method": "lora", "rank": 4}, {"method": "ia3"}]}, "mean"),
    ({"methods": [{"method": "lora", "rank": 4, "rslora": True}, {"method": "bitfit"}]}, "cls"),
    ({"methods": [{"method": "vera", "rank": 16}]}, "mean"),
    ({"methods": [{"method": "compacter", "bottleneck": 8}]}, "cls"),
])
def test_more_methods_pack_exactly(spec, pooling, tiny_model_dir, glue_dir, tmp_path):
    """DoRA, Houlsby, BitFit (the shared model's biases, its own copies), LoRA under (IA)3, rsLoRA with BitFit, VeRA
    and Compacter, each packed beside a plain LoRA (which takes the base-once path where the other has no module of
    its own, or one that adds an update): equal to alone."""
    trials = [({"methods": [{"method": "lora", "rank": 4}], "pooling": pooling}, 3e-3, 0, 8, 2),
              ({**spec, "pooling": pooling}, 3e-3, 1, 8, 2)]
    make = lambda name, i, t: _settings(tiny_model_dir, glue_dir, tmp_path / "cache",  # noqa: E731
                                        tmp_path / f"{name}{i}", *t)
    alone = [run_trial(make("alone", i, t)) for i, t in enumerate(trials)]
    packed = run_packed([make("packed", i, t) for i, t in enumerate(trials)])
    for one, together in zip(alone, packed):
        _assert_same_trial(one, together)


def test_members_rows_go_through_their_own_deltas_only():
    """One pass of a pack on two members' rows gives each member's rows its own model's logits; the shared model's
    frozen tensors are the members' (one copy)."""
    model = tiny_model(seed=0)
    specs = [{"methods": [{"method": "lora", "rank": 4}]}, {"methods": [{"method": "houlsby", "bottleneck": 4}]}]
    pack = pack_deltas(model, specs, [0, 1])
    for member in pack.members:
        moved(member)  # a new delta is the identity: move it as training would
    first, second = tiny_batch(3, 7, seed=1), tiny_batch(2, 5, seed=2)
    batch = {k: torch.cat([first[k], torch.nn.functional.pad(second[k], (0, 2))]) for k in first}
    pack.rows.assign([(0, 3), (1, 2)])
    for m in (pack.model, *pack.members):
        m.eval()
    with torch.no_grad():
        together = pack.model(**batch).logits
        alone = [pack.members[0](**first).logits, pack.members[1](**second).logits]
    torch.testing.assert_close(together, torch.cat(alone), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(alone[0][:2], pack.members[1](**{k: v[:2] for k, v in first.items()}).logits)
    shared = {id(p) for p in model.parameters() if not p.requires_grad}
    frozen = [p for p in pack.members[1].parameters() if not p.requires_grad]
    assert frozen and all(id(p) in shared for p in frozen)
    assert not any(p.requires_grad for p in model.parameters() if id(p) in shared)


def test_every_member_model_moves_to_the_packs_device(tiny_model_dir, glue_dir, tmp_path):
    """A member evaluates alone and is tested through its own model, whose modules away from the sites are copies
    of the shared model's holding its tensors: moving the pack to its device moves their buffers too (BERT's
    position ids), else a member's own pass on a GPU reads a CPU tensor. The meta device stands in for a GPU."""
    from autopelt.data import get_task
    from autopelt.models import load_tokenizer
    from autopelt.train import packed
    from autopelt.train.trial_data import prepare_data

    trials = [({"methods": [{"method": "lora", "rank": 4}]}, 1e-3, 0, 8, 1), ({"methods": [{"method": "ia3"}]},
                                                                              3e-3, 1, 8, 1)]
    settings = [_settings(tiny_model_dir, glue_dir, tmp_path / "cache", tmp_path / str(i), *t)
                for i, t in enumerate(trials)]
    task = get_task("sst2")
    data = prepare_data(settings[0], load_tokenizer(str(tiny_model_dir)), task)
    members = [packed._Member(trial, None, i, 2) for i, trial in enumerate(settings)]
    pack, *_ = packed._build(members, task, str(tiny_model_dir), data, torch.device("meta"), {})
    for member in pack.members:
        assert {buffer.device.type for buffer in member.buffers()} == {"meta"}


@pytest.mark.parametrize("spec, reason", [
    ({"methods": [{"method": "prefix", "length": 4}]}, "prefix cannot train packed: its keys and values"),
    ({"methods": [{"method": "prompt", "length": 4}]}, "prompt cannot train packed: its tokens lengthen"),
    ({"methods": [{"method": "adamix", "experts": 2}]}, "adamix cannot train packed: its experts"),
    ({"methods": [{"method": "lora", "rank": 4, "gate": True}]}, "a gated lora cannot train packed"),
])
def test_methods_that_cannot_pack_are_refused_with_their_reason(spec, reason):
    assert packing_refusal(spec).startswith(reason)
    with pytest.raises(UserError, match=reason.split(":")[0]):
        pack_deltas(tiny_model(), [{"methods": [{"method": "lora"}]}, spec], [0, 0])


def test_a_refused_trial_runs_alone_and_says_why(tiny_model_dir, glue_dir, tmp_path):
    """A prefix trial among packable ones trains alone (its result: `packed.refused`), exactly as run_trial; a
    trial without a learning rate is refused too (no rate sweep in a pack)."""
    lora = ({"methods": [{"method": "lora", "rank": 4}]}, 1e-3, 0, 8, 1)
    prefix = ({"methods": [{"method": "prefix", "length": 4, "reparam_hidden": 8}]}, 1e-2, 0, 8, 1)
    make = lambda name, t: _settings(tiny_model_dir, glue_dir, tmp_path / "cache",  # noqa: E731
                                     tmp_path / name, *t)
    results = run_packed([make("lora", lora), make("prefix", prefix)])
    assert results[1]["packed"] == {"refused": packing_refusal(prefix[0])}
    assert "packed" not in results[0]  # the one packable trial had no other to pack with: run_trial's result
    written = json.loads((tmp_path / "prefix" / "result.json").read_text())
    assert written["packed"] == results[1]["packed"]
    _assert_same_trial(run_trial(make("prefix-alone", prefix)), results[1])
    assert "learning rate" in refusal(make("sweep", lora).replace(learning_rate=None))
    # one pass draws one dropout mask for the whole pack, from one member's seed: a trial with it trains alone
    assert "backbone dropout" in refusal(make("dropout", lora).replace(backbone_dropout="model"))
    assert refusal(make("no-dropout", lora)) is None


def test_a_member_whose_delta_does_not_fit_fails_alone(tiny_model_dir, glue_dir, tmp_path):
    """A LoRA on a layer the 2-layer model lacks fails with its trial's reason; the two others train packed."""
    trials = [({"methods": [{"method": "lora", "rank": 4}]}, 1e-3, 0, 8, 1),
              ({"methods": [{"method": "lora", "rank": 4, "layers": [5]}]}, 1e-3, 0, 8, 1),
              ({"methods": [{"method": "ia3"}]}, 3e-3, 0, 8, 1)]
    results = run_packed([_settings(tiny_model_dir, glue_dir, tmp_path / "cache", tmp_path / str(i), *t)
                          for i, t in enumerate(trials)])
    assert [r["status"] for r in results] == ["ok", "failed", "ok"]
    assert "layer" in results[1]["reason"] and results[1]["steps"] == 0
    assert results[0]["steps"] == results[2]["steps"] > 0


def test_a_member_whose_report_or_save_fails_fails_alone(tiny_model_dir, glue_dir, tmp_path, monkeypatch):
    """A report that raises fails its trial, as run_trial's would, and a delta that cannot be saved fails its
    trial: the other members train, are saved and are ok (not the whole pack failed, nor a trial `ok` without its
    delta)."""
    from autopelt.train import packed

    def broken(entry):
        raise RuntimeError("the scheduler is gone")

    real_save = packed.save

    def save(result, settings, *args):
        if settings.out_dir.endswith("2"):
            raise OSError("no space left on device")
        real_save(result, settings, *args)

    monkeypatch.setattr(packed, "save", save)
    trials = [({"methods": [{"method": "lora", "rank": 4}]}, 1e-3, 0, 8, 1),
              ({"methods": [{"method": "ia3"}]}, 3e-3, 1, 8, 1),
              ({"methods": [{"method": "lora", "rank": 4}]}, 3e-3, 2, 8, 1),
              ({"methods": [{"method": "ia3"}]}, 1e-3, 3, 8, 1)]
    results = run_packed([_settings(tiny_model_dir, glue_dir, tmp_path / "cache", tmp_path / f"out{i}", *t)
                          for i, t in enumerate(trials)], [None, broken, None, None])
    assert [r["status"] for r in results] == ["ok", "failed", "failed", "ok"]
    assert "the scheduler is gone" in results[1]["reason"] and "no space" in results[2]["reason"]
    assert results[0]["delta_dir"] and results[3]["delta_dir"] and results[2]["delta_dir"] is None
    assert results[0]["steps"] == results[3]["steps"] == 2


def test_a_pack_that_runs_out_of_memory_trains_its_members_alone(tiny_model_dir, glue_dir, tmp_path, monkeypatch):
    """Out of memory in the pack's steps: each member trains again alone (with a trial's own retries) and is the
    trial it would have been alone, its result saying so; any other failure of the whole pack fails each member
    with its reason."""
    from autopelt.train import packed

    def run_out(pack, members, *args):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    trials = [({"methods": [{"method": "lora", "rank": 4}]}, 1e-3, 0, 8, 1),
              ({"methods": [{"method": "lora", "rank": 2}]}, 3e-3, 1, 8, 1)]
    make = lambda name, i, t: _settings(tiny_model_dir, glue_dir, tmp_path / "cache",  # noqa: E731
                                        tmp_path / f"{name}{i}", *t)
    alone = [run_trial(make("alone", i, t)) for i, t in enumerate(trials)]
    monkeypatch.setattr(packed, "_steps", run_out)
    results = run_packed([make("packed", i, t) for i, t in enumerate(trials)])
    for i, (one, result) in enumerate(zip(alone, results)):
        assert result["packed"] == {"members": 2, "member": i, "unpacked": "the pack ran out of memory; trained alone"}
        assert result["history"] == one["history"] and result["status"] == "ok"
        assert json.loads((tmp_path / f"packed{i}" / "result.json").read_text())["packed"] == result["packed"]

    def broken(pack, members, *args):
        raise RuntimeError("a broken pass")

    monkeypatch.setattr(packed, "_steps", broken)
    results = run_packed([make("broken", i, t) for i, t in enumerate(trials)])
    assert [r["status"] for r in results] == ["failed", "failed"]
    assert all("a broken pass" in r["reason"] and "unpacked" not in r["packed"] for r in results)


MEASURED = [({"methods": [{"method": "lora", "rank": 4, "dropout": 0.1}]}, 1e-3, 0, 8, 1),  # its own random draws
            ({"methods": [{"method": "ia3"}]}, 3e-3, 1, 4, 1)]


def test_measuring_a_pack_that_pays_leaves_no_trace(tiny_model_dir, glue_dir, tmp_path, monkeypatch):
    """A measured pack whose step pays trains to the last digit as the same pack unmeasured (no optimizer step, the
    gradients cleared, the random state of LoRA's dropout put back); each member's result holds the measurement."""
    from autopelt.train import packed

    monkeypatch.setattr(packed, "PAYS", float("inf"))  # whatever the clock says, it pays
    make = lambda name, i, t: _settings(tiny_model_dir, glue_dir, tmp_path / "cache",  # noqa: E731
                                        tmp_path / f"{name}{i}", *t)
    plain = run_packed([make("plain", i, t) for i, t in enumerate(MEASURED)])
    measured = run_packed([make("measured", i, t) for i, t in enumerate(MEASURED)], measure=True)
    for one, other in zip(plain, measured):
        step = other["packed"].pop("step")
        assert other["packed"] == one["packed"] and step.keys() == {"packed_s", "alone_s", "ratio", "steps"}
        assert step["packed_s"] > 0 and step["alone_s"] > 0 and "measured step" in other["phase_seconds"]
        assert other["history"] == one["history"] and other["status"] == one["status"] == "ok"
        ours, theirs = _weights(other), _weights(one)
        assert ours.keys() == theirs.keys() and all(torch.equal(ours[name], theirs[name]) for name in theirs)


def test_a_measured_pack_whose_step_does_not_pay_trains_its_members_alone(tiny_model_dir, glue_dir, tmp_path,
                                                                            monkeypatch):
    """Each member is then the trial it is alone, its result saying why and what was measured."""
    from autopelt.train import packed

    monkeypatch.setattr(packed, "PAYS", 0.0)  # whatever the clock says, it does not pay
    make = lambda name, i, t: _settings(tiny_model_dir, glue_dir, tmp_path / "cache",  # noqa: E731
                                        tmp_path / f"{name}{i}", *t)
    alone = [run_trial(make("alone", i, t)) for i, t in enumerate(MEASURED)]
    results = run_packed([make("packed", i, t) for i, t in enumerate(MEASURED)], measure=True)
    for i, (one, result) in enumerate(zip(alone, results)):
        assert result["packed"]["unpacked"].startswith("its measured step did not pay (packed ")
        assert result["packed"]["step"]["ratio"] > 0 and result["packed"]["member"] == i
        assert result["history"] == one["history"] and result["status"] == "ok"
        assert json.loads((tmp_path / f"packed{i}" / "result.json").read_text())["packed"] == result["packed"]


def test_a_measured_pack_times_the_steps_it_will_train_after_one_that_warms_up(tiny_model_dir, glue_dir, tmp_path,
                                                                               monkeypatch):
    """The measured passes are the pack's first training steps (its members' rows, padded together), the first
    untimed: a first batch alone misreads a run."""
    from autopelt.train import packed

    monkeypatch.setattr(packed, "PAYS", float("inf"))
    seen: list[list[int]] = []

    def spy(features, indices):
        seen.append([int(i) for i in indices])
        return pad_batch(features, indices)

    monkeypatch.setattr(packed, "pad_batch", spy)
    make = lambda name, i, t: _settings(tiny_model_dir, glue_dir, tmp_path / "cache",  # noqa: E731
                                        tmp_path / f"{name}{i}", *t)
    trials = [(spec, rate, seed, 2, epochs) for spec, rate, seed, _, epochs in MEASURED]  # 8 steps an epoch
    run_packed([make("plain", i, t) for i, t in enumerate(trials)])
    trained, seen[:] = list(seen), []
    [first, _] = run_packed([make("measured", i, t) for i, t in enumerate(trials)], measure=True)
    steps = first["packed"]["step"]["steps"]
    assert steps == packed.MEASURED_STEPS
    passes = len(trials) + 1  # a round: the pack, then each member alone
    assert [seen[r * passes] for r in range(steps + 1)] == trained[:steps + 1]
    assert seen[(steps + 1) * passes:][:steps + 1] == trained[:steps + 1]  # then it trains those steps

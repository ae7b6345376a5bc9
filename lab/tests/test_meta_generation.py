"""A generation portfolio learned by the lab's pipeline (metalearning generation), then searched."""
from __future__ import annotations

import json

import pytest
from test_generation import TASK, data_dir, lm_dir  # noqa: F401  (fixtures: the product's generation tests')

from autopelt.errors import UserError


def test_a_generation_portfolio_is_learned_from_dev_loss_and_a_search_trains_its_members_first(lm_dir, data_dir,
                                                                                                tmp_path, capsys):
    """`metalearning generation` collects the design on a generation task and ranks it by mean dev loss over the
    seeds (a configuration missing a seed is left out); `--portfolio FILE` on a generation search queues those
    members after the baselines, as a classification search queues its portfolio's."""
    from support import fakes

    from autopelt.models import model_name
    from autopelt.search.controller import Controller
    from autopelt.search.plan import SearchOptions, prepare
    from autopelt.search.resume import open_study
    from autopelt.study.record import baseline_of, portfolio_of
    from autopelt.train import run_trial
    from metalearning import generation

    task = {"task": "e2e", "data_dir": str(data_dir), "input_column": "mr", "target_column": "ref", "k": 20}
    results = tmp_path / "gen.jsonl"
    names = ["lora-r8-qv@3e-3", "ia3@1e-2", "prefix-10@3e-3"]
    assert generation.collect(task, results, str(lm_dir), names, [0], device="cpu", precision="fp32", threads=1,
                              say=lambda line: None) == 3
    records = [json.loads(line) for line in results.read_text().splitlines()]
    assert all(r["status"] == "ok" and set(r["test"]) == {"bleu", "rouge_l"} and len(r["epochs"]) == 3
               for r in records), records
    loss = {"ia3@1e-2": 0.5, "prefix-10@3e-3": 0.7, "lora-r8-qv@3e-3": 0.9}  # set, to check the order
    records = [{**r, "seed": seed, "dev_loss": loss[r["config"]] + 0.01 * seed} for seed in (0, 1) for r in records]
    records.append({**records[0], "config": "houlsby-16@1e-3", "seed": 1, "dev_loss": 0.1})  # seed 0 lacks it
    results.write_text("".join(json.dumps(r) + "\n" for r in records))
    ranked = generation.ranking(records)
    assert [name for name, _, _ in ranked] == ["ia3@1e-2", "prefix-10@3e-3", "lora-r8-qv@3e-3"]
    assert ranked[0][1:] == (pytest.approx(0.505), 2)
    file = tmp_path / "portfolio.json"
    generation.build(results, file, "another-model", size=4)
    assert json.loads(file.read_text())["task_kind"] == "generation"

    options = dict(task="e2e", custom_task={"input_column": "mr", "target_column": "ref"}, model=str(lm_dir),
                   data_dir=str(data_dir), storage=f"sqlite:///{tmp_path / 'study.db'}", out=str(tmp_path / "out"),
                   budget=4, epochs=1, cpus_per_trial=1, sampler="tpe")  # the member, then draws
    with pytest.raises(UserError, match="learned on model 'another-model'"):
        prepare(SearchOptions(**options, portfolio=str(file)))
    data = json.loads(file.read_text())
    data["model"] = model_name(str(lm_dir))
    file.write_text(json.dumps(data))
    plan = prepare(SearchOptions(**options, portfolio=str(file)))
    assert [m.name for m in plan.portfolio.members][:1] == ["ia3@1e-2"]
    study = open_study(plan)
    control = Controller(study, plan)
    control.start()
    assert fakes.run_serially(control, lambda settings, report: run_trial(settings.replace(threads=1), report)) == 4
    member = [t for t in study.trials if portfolio_of(t).get("name")]
    assert [portfolio_of(t)["name"] for t in member] == ["ia3@1e-2"] and member[0].state.name == "COMPLETE"
    sampled = [t.number for t in study.trials if not portfolio_of(t) and not baseline_of(t)]
    assert sampled and member[0].number < min(sampled)  # the member before any draw of the sampler

"""The study record: studies written before it had a module of its own read the same, new trials hold the same
attributes, and every reader names the same best trial.

tests/fixtures/study-891b8c1.db holds two studies written by commit 891b8c1 (tests/fixtures/make_old_study.py
says which trials they hold).
"""

from __future__ import annotations

import shutil
import types
from pathlib import Path

import optuna
import pytest
from conftest import GLUE_DIR
from optuna.trial import TrialState, create_trial
from support import fakes

from autopelt.dashboard import best_line
from autopelt.export.export import pick_trials
from autopelt.report.contents import collect
from autopelt.search.budget import parse_max_params
from autopelt.search.controller import Controller
from autopelt.search.plan import SearchOptions, prepare
from autopelt.search.resume import open_study
from autopelt.search.summary import summary_lines
from autopelt.search.view import LiveView
from autopelt.study import answers, record
from autopelt.study.info import read_study
from autopelt.study.record import TrialKind
from autopelt.study.storage import load_study, open_existing

optuna.logging.set_verbosity(optuna.logging.WARNING)
FIXTURE = Path(__file__).parent / "fixtures" / "study-891b8c1.db"
TIED = 4  # #3, #4 and #6 tie on the dev metric; #4 is the smallest (LoRA rank 1), #3 the earliest


@pytest.fixture
def old_url(tmp_path) -> str:
    shutil.copy(FIXTURE, tmp_path / "old.db")  # readers write nothing, but a copy keeps the fixture safe anyway
    return f"sqlite:///{tmp_path / 'old.db'}"


def old_study(url: str, name: str = "single") -> optuna.Study:
    return load_study(open_existing(url), name, url)


def test_an_old_study_reads_as_records(old_url):
    records = {r.number: r for r in record.read_all(old_study(old_url))}
    assert [n for n, r in records.items() if r.is_answer] == [1, 3, 4, 6, 9, 10, 11]
    tie = records[TIED]
    assert (tie.spec, tie.summary, tie.methods) == ({"methods": [{"method": "lora", "rank": 1}]}, "lora r1", ("lora",))
    assert (tie.params_stored, tie.params_trainable, tie.params_pct) == (1010, 1010, pytest.approx(0.101))
    assert (tie.fidelity, tie.max_fidelity, tie.full_fidelity) == (3, 3, True)
    assert tie.dev == {"accuracy": 0.8} and tie.test_value("accuracy") == pytest.approx(0.79)
    assert tie.hparams["quality"] == 0.8 and tie.params == {"lora.rank": 1, "quality": 0.8}
    assert tie.result_dir.endswith("trial-00004") and set(tie.controller) == {"host", "pid", "start"}
    assert tie.seconds is not None and tie.train_seconds == 0.0 and tie.baseline is None and tie.refines == {}
    assert records[1].baseline == "adapter" and records[1].label == "#1 [adapter] adapter b48"
    assert records[5].fail_reason == "dev metric is nan (not a finite number)" and not records[5].full_fidelity
    assert records[7].fail_reason.startswith("over parameter budget") and records[7].fidelity is None
    pruned = records[12]
    assert (pruned.state, pruned.stopped_by, pruned.fidelity_text) == (TrialState.PRUNED, "early stopping", "1/3")
    assert pruned.intermediate == {1: 0.25} and pruned.dev_value == 0.25 and not pruned.is_answer
    assert records[13].fail_reason == "interrupted" and records[14].retry_of == 13


def test_a_multi_objective_study_keeps_its_epochs_in_an_attribute(old_url):
    records = {r.number: r for r in record.read_all(old_study(old_url, "pareto"))}
    assert records[12].intermediate == {1: 0.25} and records[12].dev_value == 0.25
    assert records[TIED].values == (0.8, pytest.approx(0.101))
    front = answers.pareto_front(records.values())
    assert [r.number for r in front] == [TIED]  # 0.8 at 0.101%: no other answer is as good or as small
    info = read_study(old_study(old_url, "pareto"))
    assert (info.task, info.metric, info.space, info.epochs) == ("rte", "accuracy", "fake", 3)
    assert info.objectives == ("dev accuracy", "stored params %") and info.protocol == {"name": "full"}


def plan_of(study: optuna.Study, storage: str):
    """What the summary reads of a search's plan."""
    return types.SimpleNamespace(study_name=study.study_name, metric="accuracy", dev_label="accuracy", storage=storage,
                                 param_limit=parse_max_params("5k"))


@pytest.mark.parametrize("name", ["single", "pareto"])
def test_ties_break_the_same_way_in_summary_export_report_and_dashboard(old_url, name):
    """Dev metric, then fewer stored parameters, then the earlier trial (the summary used to keep the earliest)."""
    study = old_study(old_url, name)
    summary = summary_lines(study, plan_of(study, old_url), seconds=1.0)
    assert f"best: #{TIED} lora r1 (0.101% params): dev accuracy 0.8000, test accuracy 0.7900" in summary
    assert [t.number for t in pick_trials(study, None, pareto=False)] == [TIED]  # what `autopelt export` writes
    assert collect(study).header.best.number == TIED  # the report's headline
    assert collect(study).top[0].number == TIED
    assert best_line(study) == f"best trial: #{TIED} lora r1 (dev accuracy 0.8000)"  # autopelt dashboard --study
    view = LiveView(study, plan_of(study, old_url), echo=lambda line: None)
    assert view._best() == f"0.8000 (#{TIED})"  # the live view's best so far


def test_equal_size_ties_go_to_the_earlier_trial():
    study = optuna.create_study(study_name="ties", direction="maximize")
    for pct in (0.5, 0.2, 0.2, 0.1):
        value = 0.6 if pct == 0.1 else 0.7
        study.add_trial(create_trial(value=value, user_attrs={"full_fidelity": True, "params_pct": pct,
                                                              "summary": f"size {pct}"}))
    assert answers.best(record.read_all(study)).number == 1
    assert [r.number for r in answers.ranked(record.read_all(study))] == [1, 2, 0, 3]
    assert collect(study).header.best.number == 1 and best_line(study).startswith("best trial: #1 size 0.2")
    assert [t.number for t in pick_trials(study, None, pareto=False)] == [1]


# attributes trials gained after that study was written: the rate a trial trained at and how it was chosen, the
# precision, and the seconds its evaluations took (a refinement's expected time, refine.expected_seconds)
ADDED_SINCE = {"learning_rate", "lr_choice", "lr_from", "precision", "eval_seconds"}


def test_new_trials_hold_the_attributes_old_ones_hold(old_url, tmp_path):
    """Same study contents: a trial of each kind, recorded now, carries the attribute names it carried then."""
    fakes.script(tmp_path / "out", trials={3: {"mode": "nan"}})
    options = SearchOptions(task="rte", storage=f"sqlite:///{tmp_path}/new.db", out=str(tmp_path / "out"),
                            space=str(fakes.SPACE), data_dir=str(GLUE_DIR), budget=4, max_params="300k",
                            cpus_per_trial=1, baselines=False, finalists=0)
    plan = prepare(options)
    new = open_study(plan)
    control = Controller(new, plan)
    control.start()
    new.enqueue_trial({"lora.rank": 1, "learning_rate": 0.5})  # #0 completes
    new.enqueue_trial({}, user_attrs=record.queued_baseline("adapter"))  # #1 a baseline, completes
    new.enqueue_trial({"lora.rank": 64, "learning_rate": 0.5})  # #2 over --max-params
    new.enqueue_trial({"lora.rank": 1, "learning_rate": 0.5})  # #3 NaN
    new.enqueue_trial({"lora.rank": 1, "learning_rate": 0.5})  # #4 stopped early
    new.enqueue_trial({"lora.rank": 1, "learning_rate": 0.5})  # #5 interrupted (queued: a drawn one may be refused)
    fakes.run_serially(control, stop_after=3)
    ticket = control.next_trial()
    control.report(ticket.number, {"epoch": 1, "dev_metric": 0.25})
    control.stop_early(ticket.number)
    control.next_trial()  # #5 interrupted, queued again as #6
    control.close()

    def keys(study, number):
        return set(study.trials[number].user_attrs)

    old = old_study(old_url)
    # complete, baseline, refused, NaN, stopped early, interrupted, its re-run
    for now, then in [(0, TIED), (1, 1), (2, 7), (3, 5), (4, 12), (5, 13), (6, 14)]:
        assert keys(new, now) - ADDED_SINCE == keys(old, then), (now, then)
    assert {"learning_rate", "lr_choice"} <= keys(new, 0) and {"learning_rate", "lr_choice"} <= keys(new, 1)


def test_only_the_record_modules_touch_the_study_attributes_by_name():
    """record.py (the trials') and info.py (the study's own) alone know the attribute names: no other module of
    the package reads, tests or sets a user or system attribute itself."""
    import re

    import autopelt

    package = Path(autopelt.__file__).parent
    own = {package / "study" / "record.py", package / "study" / "info.py"}
    raw = re.compile(r"\.user_attrs\b|set_user_attr\(|system_attrs")
    found = [f"{path.relative_to(package)}:{number}: {line.strip()}" for path in sorted(package.rglob("*.py"))
             if path not in own for number, line in enumerate(path.read_text().splitlines(), 1) if raw.search(line)]
    assert found == []


def test_an_attribute_name_the_record_does_not_know_is_refused():
    assert record.attrs(fidelity=2, fail_reason="x") == {"fidelity": 2, "fail_reason": "x"}
    with pytest.raises(KeyError, match="'fidelty' is not a trial attribute"):
        record.attrs(fidelty=2)


def test_an_interrupted_finalist_runs_again_as_a_finalist():
    frozen = create_trial(state=TrialState.FAIL, user_attrs={"confirms": {"trial": 3, "seed": 1000},
                                                             "fail_reason": "interrupted"})
    frozen.number = 7
    assert record.requeued(frozen) == {"retry_of": 7, "confirms": {"trial": 3, "seed": 1000}}
    assert record.read(frozen).finalist_of == {"trial": 3, "seed": 1000} and not record.read(frozen).is_answer


def test_a_finalist_is_stored_under_the_name_studies_were_always_written_with():
    """`finalist_of` is the attribute `confirms`: a finalist of a study an earlier autopelt wrote reads as one, and
    one written now reads in that autopelt, so a study resumes and reports across the rename."""
    again = {"trial": 3, "seed": 1000}
    assert record.attrs(finalist_of=again) == {"confirms": again}
    earlier = create_trial(state=TrialState.COMPLETE, value=0.82, user_attrs={"confirms": again, "full_fidelity": True})
    earlier.number = 9
    assert record.kind_of(earlier) is TrialKind.FINALIST and record.finalist_of(earlier) == again
    assert record.read(earlier).finalist_of == again and record.read(earlier).label.startswith("#9 [#3 again")


def test_an_interrupted_portfolio_member_runs_again_as_that_member():
    """Its retry trains the member at the member's rate, and the portfolio is not queued a second copy of it."""
    tag = {"name": "pfeiffer-48@3e-3", "rank": 1, "drawn": True}
    frozen = create_trial(state=TrialState.FAIL, user_attrs={"portfolio": tag, "fail_reason": "interrupted"})
    frozen.number = 2
    assert record.requeued(frozen) == {"retry_of": 2, "portfolio": tag}

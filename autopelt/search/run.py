"""`run_search`: the whole search from Python — check inputs, open the study, run trials on Ray, summarise.

    from autopelt.search.run import SearchOptions, run_search
    outcome = run_search(SearchOptions(task="rte", budget=10))
    outcome.best  # the best trial's TrialRecord (autopelt/study/record.py), or None
    outcome.ensemble  # the ensemble of its finished trials (autopelt/ensemble/study.py); .answers: it answers

Every input is checked before the study exists (`plan.prepare`); a bad one raises UserError and leaves the
database as it was.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import optuna

from autopelt.ensemble.study import StudyEnsemble, of_study, with_test
from autopelt.errors import UserError
from autopelt.search.controller import Controller, SearchStopped
from autopelt.search.budget_fit import fit_time_budget
from autopelt.search.options import SearchOptions
from autopelt.search.plan import SearchPlan, prepare
from autopelt.search.recovery import Heartbeat
from autopelt.search.resume import check_existing, open_study
from autopelt.search.summary import summary_lines
from autopelt.search.view import LiveView
from autopelt.study import answers
from autopelt.study.info import floors_of, write_answer, write_floors
from autopelt.study.record import TrialRecord, read_all

__all__ = ["SearchOptions", "SearchOutcome", "SearchStopped", "run_search"]


@dataclass
class SearchOutcome:
    study: optuna.Study
    plan: SearchPlan
    best: TrialRecord | None  # the best answer trial (autopelt/study/answers.py); its dev_value is the value it
    #                           was ranked by, as the summary, the report and the dashboard show it (dev_of says which)
    pareto: list[TrialRecord]  # multi-objective studies only: the Pareto front, smallest delta first
    ensemble: StudyEnsemble | None  # the ensemble of the study's finished trials, beside `best` (`.answers`: it
    #                                 answers instead, by the margin); None where no trial kept dev predictions
    recorded: int  # trained trials this process recorded
    rejected: int  # deltas over --max-params this process refused
    interrupted: bool  # stopped before its budget (Ctrl-C); the next run resumes
    seconds: float


def run_search(options: SearchOptions, *, echo: Callable[[str], None] = print, hardware=None) -> SearchOutcome:
    """Run (or resume) the search `options` describe. Raises UserError for bad input, SearchStopped when the
    search cannot go on (every trial failing, every delta over --max-params). `hardware`: this machine as
    `plan.prepare` takes it (default: probed)."""
    started = time.monotonic()
    plan = prepare(options, hardware)
    plan, records = check_existing(plan)  # a resumed study's trial options, where this run leaves them out
    plan = fit_time_budget(plan, records)  # before the study: a budget too short is bad input too
    from autopelt.search.ray_backend import on_cluster, ray_session, run_trials  # Ray once every input is sound

    with ray_session(plan):  # before the study: an unreachable cluster is bad input too
        plan = on_cluster(plan)
        study = open_study(plan)
        view = LiveView(study, plan, echo)
        controller = Controller(study, plan, on_record=view.on_record, on_progress=view.on_progress)
        queued = controller.start()
        view.header(queued, controller.requeued, controller.portfolio_queued)
        interrupted = False
        try:
            with Heartbeat(study, controller.recorder.running_trial_ids):
                run_trials(controller, plan)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            interrupted = interrupted or bool(controller.recorder.running and not _time_up(controller))
            controller.close()
    if not interrupted:
        from autopelt.study.answer_scores import score_answers

        best = answers.best(read_all(study))
        if best is not None and not best.test:  # a generation task generates for every test input: minutes
            echo(f"scoring the answer, #{best.number}, on the test split from its saved delta …")
        score_answers(study)  # the answer's test, from its saved delta (its trial trained without it)
    records = read_all(study)
    best = answers.best(records)
    write_answer(study, best, plan.metric)  # the dashboard's copy of the answer the summary prints
    record_floors(study, plan)
    ensemble = None if plan.generation else of_study(study)
    if ensemble is not None and len(ensemble.members) > 1 and not interrupted:
        try:  # read after every choice: test never chooses a member or a weight
            ensemble = with_test(ensemble, echo)
        except UserError as error:
            echo(f"the ensemble's test was not scored: {error}")
    seconds = time.monotonic() - started
    for line in summary_lines(study, plan, seconds, controller.recorder.rejected, ensemble=ensemble):
        echo(line)
    if controller.recorder.error:
        raise SearchStopped(controller.recorder.error)
    return SearchOutcome(
        study=study, plan=plan, best=best, ensemble=ensemble,
        pareto=answers.pareto_front(records) if len(study.directions) > 1 else [],
        recorded=len(controller.recorder.finished), rejected=controller.recorder.rejected, interrupted=interrupted,
        seconds=seconds,
    )


def record_floors(study, plan: SearchPlan) -> None:
    """Each split's one-class floor (autopelt/study/floors.py) as the study attribute `floors`, once: the summary,
    the report and `export` show it beside dev and test. A generation study has none."""
    from autopelt.study import floors

    if plan.generation or floors_of(study):
        return
    settings = plan.trial_settings({"methods": []}, {}, plan.out_dir)
    try:
        write_floors(study, floors.of_settings(settings).to_dict())
    except (UserError, OSError, ValueError):  # data that cannot be read again here: the summary goes without it
        return


def _time_up(controller: Controller) -> bool:
    left = controller.time_left()
    return left is not None and left <= 0

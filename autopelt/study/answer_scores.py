"""Test scores where they are read. A searched trial trains without scoring test (`TrialSettings.score_test`):
no decision of the search reads test, and on a generation task scoring it means generating for every test input.
Baselines and the finalists' re-runs score it as they train (the summary sets them beside the answer); the
trials that answer the study (the best; in a multi-objective study, the Pareto front) are scored once, from
their saved deltas, when the search ends, and so is any trial `autopelt export` writes."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from autopelt.errors import UserError
from autopelt.files import write_atomic
from autopelt.study import answers, record
from autopelt.study.record import read_all

log = logging.getLogger(__name__)


def score_answers(study) -> list[int]:
    """Score on test each answer trial that has no test scores yet; the trial numbers scored. A trial that cannot
    be scored (its outputs are gone) is logged and left unscored: the search's result stands without it."""
    records = read_all(study)
    maximize = answers.maximizes(study)
    wanted = answers.pareto_front(records, maximize) if len(study.directions) > 1 else []
    best = answers.best(records, maximize)
    scored = []
    for trial in ([best] if best else []) + [t for t in wanted if t is not best]:
        if trial.test or not trial.result_dir:
            continue
        try:
            test, extra = score_result_dir(trial.result_dir)
        except (UserError, OSError, ValueError) as error:
            log.warning("trial %d was not scored on test: %s", trial.number, error)
            continue
        record.add_later_test(study, trial.number, test, extra)
        scored.append(trial.number)
    return scored


def score_result_dir(result_dir) -> tuple[dict, dict]:
    """(test, extra_tests) of the trial in `result_dir`, scored from its saved delta and written into its
    result.json (atomically) so that an export reads them."""
    from autopelt.train.saved import RESULT_FILE, score_saved

    path = Path(result_dir) / RESULT_FILE
    try:
        result = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise UserError(f"cannot read {path} ({error})") from None
    if result.get("test"):
        return result["test"], result.get("extra_tests") or {}
    test, extra = score_saved(result)
    result.update(test=test, extra_tests=extra, test_scored="from the saved delta, after training")
    write_atomic(path, json.dumps(result, indent=2, default=str))
    return test, extra

"""The study's own user attributes: what it was made for (`StudyInfo`), the answer it gave, and each split's
one-class floor. With record.py (each trial's attributes), the only module that knows the names a study stores.
Every attribute is optional when read, so a study written by an older autopelt reads the same way."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from autopelt.study.attr_values import as_integer, as_mapping, as_text
from autopelt.study.record import TrialRecord

ANSWER = "answer"  # the trial that answers the study, as the search's summary names it
FLOORS = "floors"  # each split's one-class floor (autopelt/study/floors.py, `Floors.to_dict`)


@dataclass(frozen=True)
class StudyInfo:
    """What the study was made for. Unknown fields read as None."""

    task: str | None = None
    model: str | None = None  # its name, as shown (all-MiniLM-L6-v2); older studies hold the path here
    model_path: str | None = None  # what the trials load: a hub id or a folder
    space: str | None = None
    space_fingerprint: str | None = None
    metric: str | None = None
    direction: str | None = None
    objectives: tuple[str, ...] = ()
    protocol: Any = None  # {"name": "k-shot", "k": 1000} as a search writes it
    epochs: int | None = None
    baseline_pooling: str | None = None  # what its baselines' head reads (SearchPlan.pooling); older studies: "cls"
    trial_options: dict | None = None  # what every trial was given: {"batch_size", "max_length", "quantize"}, each
    #                                    None where the trials keep their own; older studies: None (all their own)

    def to_attrs(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}
        out["objectives"] = list(self.objectives)
        return out


def read_study(study) -> StudyInfo:
    a = study.user_attrs
    return StudyInfo(
        task=as_text(a.get("task")), model=as_text(a.get("model")), model_path=as_text(a.get("model_path")),
        space=as_text(a.get("space")),
        space_fingerprint=as_text(a.get("space_fingerprint")), metric=as_text(a.get("metric")),
        direction=as_text(a.get("direction")), objectives=tuple(a.get("objectives") or ()),
        protocol=a.get("protocol") if a.get("protocol") is not None else None, epochs=as_integer(a.get("epochs")),
        baseline_pooling=as_text(a.get("baseline_pooling")),
        trial_options=as_mapping(a.get("trial_options")) if a.get("trial_options") is not None else None,
    )


def write_study(study, info: StudyInfo) -> None:
    """Record what a new study is made for (a resumed one is compared with it: search/resume.py)."""
    for key, value in info.to_attrs().items():
        study.set_user_attr(key, value)


def write_answer(study, best: TrialRecord | None, metric: str) -> dict | None:
    """Record the study's answer as a study attribute, so that the dashboard shows the numbers the summary, the
    report and the API show: {"trial", "label", "dev" (the value it was ranked by), "dev_of" ("mean of 2 seeds" or
    "one seed"), "test", "metric"}; None while no trial answers. Returns what it wrote."""
    answer = None if best is None else {
        "trial": best.number, "label": best.label, "dev": best.dev_value, "dev_of": best.dev_of or "one seed",
        "test": best.test_value(metric), "metric": metric,
    }
    study.set_user_attr(ANSWER, answer)
    return answer


def floors_of(study) -> dict:
    """Each split's one-class floor as recorded (`Floors.to_dict`; `Floors.from_dict` reads it); {} before."""
    return as_mapping(study.user_attrs.get(FLOORS))


def write_floors(study, floors: dict) -> None:
    """Record each split's one-class floor (`Floors.to_dict`), once per study."""
    study.set_user_attr(FLOORS, floors)

"""The study's ensemble as the report shows it beside the single answer (autopelt/ensemble/study.py `of_study`):
chosen from the trial folders' dev predictions, its test read from the predictions the members kept (the report
computes nothing: where one member kept none, the test stays unscored and the page says so)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class EnsembleView:
    members: list[tuple[str, float, float]]  # (summary, weight, dev), heaviest first
    metric: str
    dev: float  # on the dev rows that chose its members, as `single_dev`
    single: str  # the single answer's summary
    single_dev: float
    answers: bool  # it beats the single answer's dev by more than `margin`
    margin: float
    test: float | None = None  # None: not scored (a member kept no test predictions)
    single_test: float | None = None
    left_out: list[str] = field(default_factory=list)

    @property
    def forward_passes(self) -> int:
        return len(self.members)


def ensemble_view(study) -> EnsembleView | None:
    """The study's ensemble, or None where no trial folder here holds dev predictions (a generation study's
    trials keep none; a study read on another machine than its trials' folders)."""
    from autopelt.ensemble.study import of_study, with_test
    from autopelt.errors import UserError

    chosen = of_study(study)
    if chosen is None:
        return None
    try:
        chosen = with_test(chosen, compute=False)
    except UserError:  # a member's predictions became unreadable since: its test stays unscored
        pass
    return EnsembleView(
        members=[(m.summary, w, m.dev) for m, w in zip(chosen.members, chosen.weights)], metric=chosen.metric,
        dev=chosen.dev, single=chosen.single.summary, single_dev=chosen.single_dev, answers=chosen.answers,
        margin=chosen.margin, test=chosen.test, single_test=chosen.single_test, left_out=list(chosen.left_out))

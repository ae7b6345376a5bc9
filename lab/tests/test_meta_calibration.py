"""The shipped portfolio's calibration, as the lab's meta-dataset computes it."""
from __future__ import annotations



from autopelt.portfolio.portfolio import load
from metalearning import build as meta_build
from metalearning import metadata

MEMBERS = ("lora-r8-qv@3e-3", "lora-r8-qv-b16@2e-3", "pfeiffer-48@1e-3")
CALIBRATION = {"a": 1e-3, "b": 4e-3}  # the reference: their geometric mean, 2e-3


def test_the_shipped_portfolios_calibration_is_loras_simulated_sweep_on_every_task():
    meta = metadata.shipped()
    from autopelt.portfolio.portfolio import SHIPPED

    portfolio = load(SHIPPED)
    assert portfolio.calibration == meta_build.calibration(meta, meta.tasks)
    assert set(portfolio.calibration) == set(meta.tasks)
    assert {portfolio.calibration[t] for t in ("clinc150", "hwu64", "trec_fine")} == {1e-2}  # many classes

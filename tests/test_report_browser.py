"""The report in a real headless Chromium: every figure draws its data, nothing is fetched, no console errors.

Needs Debian's chromium and chromium-driver (`bash .ci/chromium.sh`) and selenium (autopelt[dev]).
"""

from __future__ import annotations

import argparse

import pytest

optuna = pytest.importorskip("optuna")
pytest.importorskip("plotly")

from autopelt.report import command as report_command  # noqa: E402
from support import browser as report_browser  # noqa: E402
from support import example_study as example  # noqa: E402
from autopelt.report.contents import collect  # noqa: E402

missing = report_browser.available()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(missing is not None, reason=str(missing))]


@pytest.fixture(scope="module")
def browser():
    with report_browser.chromium() as driver:
        yield driver


def write_report(tmp_path, study: str, url: str):
    out = tmp_path / f"{study}.html"
    args = argparse.Namespace(study=study, storage=url, out=out, top=10)
    assert report_command.run(args) == 0
    return out


def severe_console_entries(driver) -> list[dict]:
    return [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def test_every_figure_draws_with_no_console_error(browser, tmp_path):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    example.build(url, extra=30)
    report_browser.open_report(browser, write_report(tmp_path, "example", url))
    figures = browser.execute_script(report_browser.FIGURES_JS)
    assert [f["id"].split("-", 2)[2] for f in figures] == [
        "history", "pareto", "baselines", "importances", "gates", "gates"]
    expected = int(browser.execute_script(
        "return document.querySelector('meta[name=autopelt-figures]').content"))
    assert expected == len(figures)
    for figure in figures:
        assert figure["drawn"] and figure["traces"] > 0, figure
        assert figure["points"] + figure["heatmaps"] > 0, figure  # markers, bars or a heat map on screen
    by_name = {f["id"].split("-", 2)[2]: f for f in figures}
    assert by_name["baselines"]["points"] == 7  # the best searched trial and six baselines
    assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0
    assert severe_console_entries(browser) == []
    best = collect(optuna.load_study(study_name="example", storage=url)).header.best
    text = browser.find_element("tag name", "header").text
    assert f"Best trial #{best.number}" in text and f"dev accuracy {best.dev:.4f}" in text


def test_a_study_without_trials_renders_notes(browser, tmp_path):
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    optuna.create_study(study_name="empty", storage=url)
    report_browser.open_report(browser, write_report(tmp_path, "empty", url))
    assert browser.execute_script(report_browser.FIGURES_JS) == []
    body = browser.find_element("tag name", "body").text
    assert "No trial has completed at full fidelity yet." in body and "no trial has finished yet" in body
    assert severe_console_entries(browser) == []


def test_the_console_check_sees_a_script_error(browser, tmp_path):
    """The check above can fail: a page whose script throws leaves a SEVERE entry."""
    page = tmp_path / "broken.html"
    page.write_text("<!DOCTYPE html><html><body><script>undefinedFunction()</script></body></html>")
    browser.get(page.as_uri())
    assert any("undefinedFunction" in entry["message"] for entry in severe_console_entries(browser))

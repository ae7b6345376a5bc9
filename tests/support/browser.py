"""A report opened in a real headless Chromium (Debian's, installed by .ci/chromium.sh), driven by selenium.

Used by tests/test_report_browser.py (every figure drew, no console errors, nothing fetched) and by
scripts/report_screenshot.py (docs/report.png). Not needed to write or read a report.
"""

from __future__ import annotations

import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
         "--hide-scrollbars")

# Per plotly figure on the page: its data traces and what it drew (scatter/bar points, heat map images).
FIGURES_JS = """
return Array.from(document.querySelectorAll('.plotly-graph-div')).map(gd => ({
  id: gd.id,
  drawn: gd.classList.contains('js-plotly-plot') && gd.querySelectorAll('.main-svg').length > 0,
  traces: (gd.data || []).length,
  points: gd.querySelectorAll('.point').length,
  heatmaps: gd.querySelectorAll('.hm image').length,
}));
"""
# true once the page loaded and plotly drew every figure (Plotly.newPlot adds .main-svg)
READY_JS = """
return document.readyState === 'complete' && typeof Plotly !== 'undefined' &&
  Array.from(document.querySelectorAll('.plotly-graph-div')).every(gd => gd.querySelector('.main-svg'));
"""


def available() -> str | None:
    """None when Chromium, its driver and selenium are installed; else what is missing."""
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if missing:
        return f"{' and '.join(missing)} missing: run `bash .ci/chromium.sh` (installs chromium, chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium missing: pip install selenium (in autopelt[dev])"
    return None


@contextmanager
def chromium(width: int = 1280, height: int = 1000):
    """A selenium driver of headless Chromium with a fresh profile, reading the browser console."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="autopelt-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in FLAGS + (f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def open_report(driver, path: Path, timeout: float = 60) -> None:
    """Load the report's file and wait until plotly drew every figure."""
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(path.resolve().as_uri())
    WebDriverWait(driver, timeout, poll_frequency=0.2).until(lambda d: d.execute_script(READY_JS))


def screenshot_full_page(driver, out: Path) -> None:
    """A PNG of the whole page, not only the window (Chrome DevTools' captureBeyondViewport)."""
    import base64

    size = driver.execute_script(
        "return [document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
    shot = driver.execute_cdp_cmd("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": True,
        "clip": {"x": 0, "y": 0, "width": size[0], "height": size[1], "scale": 1},
    })
    out.write_bytes(base64.b64decode(shot["data"]))

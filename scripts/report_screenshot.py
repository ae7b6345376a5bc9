"""Write docs/report.png, the README's picture of `autopelt report`, and print what it measured.

    python scripts/report_screenshot.py [--out docs/report.png] [--extra 30] [--width 1280]
    python scripts/report_screenshot.py --storage sqlite:///work/bench.db --study bench-tpe-asha   # a real study

Writes the report of a study with `autopelt report`, opens it in headless Chromium (.ci/chromium.sh installs
it) and saves a PNG of the whole page. Without --storage, the study is the synthetic example
(tests/support/example_study.py, plus `--extra` searched trials) in a temporary SQLite file.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "report.png")
    parser.add_argument("--extra", type=int, default=30, help="searched trials beyond the example's core ones")
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--storage", help="a real study's database URL (with --study)")
    parser.add_argument("--study", help="the study's name")
    args = parser.parse_args()
    if bool(args.storage) != bool(args.study):
        parser.error("--storage and --study go together")

    import optuna

    sys.path.insert(0, str(ROOT / "tests"))  # the example study and the browser driver are test support
    from support import browser as report_browser
    from support import example_study as report_example

    from autopelt.report import command as report_command

    missing = report_browser.available()
    if missing:
        print(missing, file=sys.stderr)
        return 1
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="autopelt-screenshot-") as scratch:
        url, study = args.storage, args.study
        if not url:
            url, study = f"sqlite:///{scratch}/example.db", report_example.STUDY
            report_example.build(url, extra=args.extra)
        html = Path(scratch) / "report.html"
        started = time.monotonic()
        report_command.run(argparse.Namespace(study=study, storage=url, out=html, top=10))
        render_seconds = time.monotonic() - started
        with report_browser.chromium(width=args.width) as driver:
            started = time.monotonic()
            report_browser.open_report(driver, html)
            draw_seconds = time.monotonic() - started
            # plotly shows its tool bars on hover with a mouse, always without one (headless): hide them
            driver.execute_script("document.querySelectorAll('.modebar-container')"
                                  ".forEach(bar => bar.style.display = 'none')")
            report_browser.screenshot_full_page(driver, args.out)
        print(f"report: {html.stat().st_size / 1e6:.2f} MB written in {render_seconds:.2f}s, "
              f"drawn by Chromium in {draw_seconds:.2f}s; screenshot {args.out} ({args.out.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

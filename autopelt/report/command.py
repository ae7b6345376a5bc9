"""`autopelt report`: write a study's report (history, Pareto front, baselines, importances, gates, top trials)
as one self-contained HTML file that opens offline in any browser."""

from __future__ import annotations

import argparse
import time
from datetime import datetime, timezone
from pathlib import Path

from autopelt.errors import UserError
from autopelt.study.storage import DEFAULT_STORAGE


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--study", required=True, help="the study's name (as `autopelt search` printed it)")
    parser.add_argument("--storage", default=DEFAULT_STORAGE,
                        help=f"where the study lives: an SQLAlchemy URL (default: {DEFAULT_STORAGE})")
    parser.add_argument("--out", type=Path, default=None, help="the HTML file to write (default: STUDY.html)")
    parser.add_argument("--top", type=int, default=10, help="how many trials the table lists (default: 10)")


def run(args: argparse.Namespace) -> int:
    out = Path(args.out).expanduser() if args.out is not None else Path(args.study.replace("/", "_") + ".html")
    if not out.parent.is_dir():
        raise UserError(f"--out: folder {out.parent} does not exist")
    if out.is_dir():
        raise UserError(f"--out: {out} is a folder; give a file name such as {out / (args.study + '.html')}")
    if args.top < 1:
        raise UserError("--top must be at least 1")
    _check_plotly()
    import optuna

    from autopelt.report.contents import collect
    from autopelt.files import write_atomic
    from autopelt.report.page import render
    from autopelt.study.storage import hide_password, load_study, open_existing

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    started = time.monotonic()
    study = load_study(open_existing(args.storage), args.study, args.storage)
    contents = collect(study, top=args.top)
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    footer = f"study {args.study} in {hide_password(args.storage)} · written {stamp} by autopelt report"
    page = render(contents, footer=footer)
    write_atomic(out, page)
    trials = sum(contents.header.states.values())
    print(f"wrote {out} ({len(page.encode()) / 1e6:.1f} MB, {trials} trials, "
          f"{time.monotonic() - started:.1f}s)")
    return 0


def _check_plotly() -> None:
    try:
        import plotly  # noqa: F401
    except ImportError:
        raise UserError("the report needs plotly: pip install 'autopelt[report]'") from None

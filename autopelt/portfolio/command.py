"""`autopelt portfolio build`: a portfolio learned from your own finished studies, one task each.

    autopelt portfolio build --storage URL [--study NAME ...] --out portfolio.json [--size 16]

The shipped prior (a meta-dataset over 21 tasks and the task-aware portfolio built from it) is made by the
pipeline in the repository's lab/metalearning/ folder, which this package never imports.
"""

from __future__ import annotations

from autopelt.errors import UserError


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    build = sub.add_parser("build", help="greedily choose a portfolio from your studies (one task each)")
    build.add_argument("--storage", required=True, help="an SQLAlchemy URL of your studies: one task each")
    build.add_argument("--study", action="append", help="a study of --storage to learn from (repeat; default: all)")
    build.add_argument("--out", required=True, help="the portfolio file to write")
    build.add_argument("--size", type=int, default=16, help="configurations in the portfolio (default 16)")


def run(args) -> int:
    from autopelt.portfolio import build

    if args.size < 1:
        raise UserError("--size must be at least 1")
    data = build.from_studies(args.storage, args.study, args.size, args.out)
    print_portfolio(args.out, data)
    return 0


def print_portfolio(out: str, data: dict) -> None:
    print(f"{out}: {len(data['members'])} configurations learned on {data['model']} from "
          f"{len(data['built_from']['tasks'])} tasks")
    for rank, member in enumerate(data["members"], 1):
        print(f"  {rank:2d}. {member['name']}")

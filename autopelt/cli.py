"""The `autopelt` command. Each subcommand lives in its own module, imported only when it runs.

A command module defines `add_arguments(parser)` and `run(args) -> int`, and imports anything heavy
(torch, ray, plotly) inside `run`, so `autopelt --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from autopelt.errors import UserError

# name -> (module, one-line help)
COMMANDS = {
    "methods": ("autopelt.delta.command", "list every delta method with its parameters and defaults"),
    "train": ("autopelt.train.command", "train and evaluate one delta on a task"),
    "search": ("autopelt.search.command", "search for the best delta for a task"),
    "export": ("autopelt.export.command", "export a study's best delta"),
    "predict": ("autopelt.export.predict_command", "run an exported delta on text"),
    "dashboard": ("autopelt.dashboard", "open optuna-dashboard on a study's storage"),
    "report": ("autopelt.report.command", "write a study's plotly report as one HTML file"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="autopelt", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name != module_name:
                raise
            continue  # not built yet
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(command_parser)
        command_parser.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except UserError as error:
        print(f"autopelt: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("autopelt: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

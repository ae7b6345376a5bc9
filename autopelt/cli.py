"""The `autopelt` command. Each subcommand lives in its own module, imported only when it runs.

A command module defines `add_arguments(parser)` and `run(args) -> int`, and imports anything heavy
(torch, ray, plotly) inside `run`, so `autopelt --help` and `autopelt COMMAND --help` stay fast. The top-level
help needs only the names and one-line helps below; only the command named on the line is imported.
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
    "portfolio": ("autopelt.portfolio.command", "build a portfolio from your own studies"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Every command by name; the flags of `command` only (its module is the one imported)."""
    parser = argparse.ArgumentParser(prog="autopelt", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:
            module = importlib.import_module(module_name)
            module.add_arguments(command_parser)
            command_parser.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    command = next((word for word in argv if not word.startswith("-")), None)  # autopelt has no option of its own
    args = build_parser(command).parse_args(argv)
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

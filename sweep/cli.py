"""The `sweep` command line: one subcommand per module in `sweep.commands`.

Each command module exposes `register(subparsers)`, which adds its parser and sets `func`
to a callable taking the parsed arguments and returning an exit code. Bad input surfaces as a
`workers.errors.InputError` (or a missing file): one line on stderr, exit code 2; a model that
cannot deliver its attention (`ExtractionError`): one line, exit code 1.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from workers.errors import ExtractionError, InputError

COMMANDS = ("check", "baseline", "extract", "plan", "run", "status", "report")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sweep",
        description="Measure when the layerwise Dobrushin bound on attention rollout is tight.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"sweep.commands.{name}")
        except ModuleNotFoundError as error:
            if error.name == f"sweep.commands.{name}":
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (InputError, FileNotFoundError, IsADirectoryError, PermissionError) as error:
        message = " ".join(str(error).split())
        print(f"sweep {args.command}: error: {message}", file=sys.stderr)
        return 2
    except ExtractionError as error:
        message = " ".join(str(error).split())
        print(f"sweep {args.command}: extraction failed: {message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"sweep {args.command}: interrupted", file=sys.stderr)
        return 130

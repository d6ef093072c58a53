"""The `sweep` command line: one subcommand per module in `sweep.commands`.

Each command module exposes `register(subparsers)`, which adds its parser (its one-line summary
comes from `COMMANDS`) and sets `func` to a callable taking the parsed arguments and returning
an exit code. Every fault is one line on stderr with an exit code by cause (`sweep.faults`):
1 a model that cannot deliver its attention, 2 bad input, 3 the environment (read-only or full
disk, a missing device), 4 a damaged store, 130 Ctrl-C. docs/faults.md lists them.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from sweep.faults import classify
from sweep.interrupts import remember_sigint, restore_sigint

# Command name -> one-line summary. Only the chosen command's module is imported (they pull in
# torch, numba, dask...), so `sweep --help` and every command start fast.
COMMANDS: dict[str, str] = {
    "check": "test whether the Dobrushin bound is tight for stochastic matrices in a .npy file",
    "baseline": "tightness rate of random stochastic matrices per null and size (95%% Wilson)",
    "extract": "extract head-averaged attention of a model on some inputs into an .npz",
    "plan": "dry run: inputs, shards, tasks, store size and work of a sweep config",
    "run": "run a sweep config into its Zarr store (resumes an existing store)",
    "status": "done/pending/failed shards of a store, per model and stage",
    "report": "tables and figures of a sweep store",
}


class _Summaries:
    """Subparsers proxy that gives each command its summary from COMMANDS."""

    def __init__(self, subparsers: argparse._SubParsersAction) -> None:
        self._subparsers = subparsers

    def add_parser(self, name: str, **kwargs) -> argparse.ArgumentParser:
        return self._subparsers.add_parser(name, help=COMMANDS[name], **kwargs)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; `command` (default: all) names the subcommands whose modules are loaded."""
    parser = argparse.ArgumentParser(
        prog="sweep",
        description="Measure when the layerwise Dobrushin bound on attention rollout is tight.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        if command in (None, name):
            importlib.import_module(f"sweep.commands.{name}").register(_Summaries(sub))
        else:
            sub.add_parser(name, help=COMMANDS[name])
    return parser


def joined_negative_values(words: list[str]) -> list[str]:
    """`--opt -1e-9` as `--opt=-1e-9`: argparse takes a word that starts with `-` for an option
    unless it looks like `-1` or `-.5`, so a negative number in exponent form
    (`--tol -1e-9`) read as a missing value."""
    out: list[str] = []
    for word in words:
        if out and out[-1].startswith("--") and "=" not in out[-1] and word.startswith("-"):
            try:
                float(word)
            except ValueError:
                pass
            else:
                out[-1] = f"{out[-1]}={word}"
                continue
        out.append(word)
    return out


def main(argv: list[str] | None = None) -> int:
    words = joined_negative_values(sys.argv[1:] if argv is None else argv)
    argv = words
    chosen = next((word for word in words if not word.startswith("-")), None)
    remember_sigint()
    try:
        args = build_parser(chosen if chosen in COMMANDS else "").parse_args(argv)
    except KeyboardInterrupt:
        print(f"sweep {chosen or ''}: interrupted: while starting, nothing done".replace(
            "sweep :", "sweep:"), file=sys.stderr)
        return 130
    restore_sigint()  # in case an import replaced it (dask_jobqueue: a silent exit(0))
    try:
        return int(args.func(args) or 0)
    except BaseException as error:  # noqa: BLE001 - every fault gets one line, by cause
        fault = classify(error)
        if fault is None:
            raise
        code, label, message = fault
        print(f"sweep {args.command}: {label}: {message}", file=sys.stderr)
        return code

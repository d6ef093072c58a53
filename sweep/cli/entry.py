"""The `sweep` command line: one subcommand per module in `sweep.cli.commands`.

Each command module exposes `register(subparsers)`, which adds its parser (its one-line summary
comes from `COMMANDS`) and sets `func` to a callable taking the parsed arguments and returning
an exit code. Every fault is one line on stderr with an exit code by cause
(`sweep.terminal.faults`): 1 a model that cannot deliver its attention, 2 bad input, 3 the
environment (read-only or full disk, a missing device), 4 a damaged store, 130 Ctrl-C.
docs/faults.md lists them.

Ctrl-C exits 130 wherever it lands once `main` runs: the handler is installed before any import
of this package's commands, and imports cannot replace it
(`sweep.terminal.interrupts.sigint_pinned`). This module imports nothing heavy at the top so that
`main` starts within milliseconds.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import sys
import traceback
from typing import NoReturn

from sweep.terminal.interrupts import remember_sigint, restore_sigint, sigint_pinned

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
    "compare": "two sweep stores side by side: rates, their difference, cells that differ",
    "show": "one input up close: per layer its verdict and the pair of tokens attaining kappa",
    "precision": "re-extract a sample of a store's inputs at a lower dtype: verdicts that flip",
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
            importlib.import_module(f"sweep.cli.commands.{name}").register(_Summaries(sub))
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


def run_command() -> NoReturn:
    """The `sweep` command: `main`, then leave without finalizing the interpreter (flushed
    first). A request the object-store client (obstore's tokio runtime) still has in flight
    after a command gave up on it (wrong credentials: zarr asks for several keys at once) can
    finish on a runtime thread while Python finalizes, and that aborts the process (SIGABRT or
    SIGBUS after the right one-line message, about 1 `sweep status` in 20). Every store, lock
    and cluster is closed by then: `main`'s commands close them in their own `with` blocks."""
    try:
        code = main(own_process=True)
    except SystemExit as stop:  # argparse's usage errors and --help
        code = stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1
        if isinstance(stop.code, str):
            print(stop.code, file=sys.stderr)
    except KeyboardInterrupt:
        code = 130
    except BaseException:  # noqa: BLE001 - a bug: its traceback, then exit 1 like Python's
        traceback.print_exc()
        code = 1
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def main(argv: list[str] | None = None, *, own_process: bool = False) -> int:
    """Run the command `argv` names (default: the process's arguments); its exit code.
    `own_process`: the process ends with the command (`run_command`), so what it silences for
    its close (Dask's loggers) may stay silenced."""
    remember_sigint()  # first: Ctrl-C raises KeyboardInterrupt from here on
    restore_sigint()
    words = joined_negative_values(sys.argv[1:] if argv is None else argv)
    argv = words
    chosen = next((word for word in words if not word.startswith("-")), None)
    try:
        with sigint_pinned():  # the command's imports (dask_jobqueue) cannot swap the handler
            from sweep.terminal.faults import classify
            from sweep.terminal.printable import printable

            args = build_parser(chosen if chosen in COMMANDS else "").parse_args(argv)
    except KeyboardInterrupt:
        print(f"sweep {chosen or ''}: interrupted: while starting, nothing done".replace(
            "sweep :", "sweep:"), file=sys.stderr)
        return 130
    try:
        args.own_process = own_process
        return int(args.func(args) or 0)
    except BaseException as error:  # noqa: BLE001 - every fault gets one line, by cause
        fault = classify(error)
        if fault is None:
            raise
        code, label, message = fault
        print(f"sweep {args.command}: {label}: {printable(message)}", file=sys.stderr)
        return code

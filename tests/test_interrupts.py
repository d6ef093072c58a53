"""Ctrl-C exits 130 wherever it lands once `sweep.cli.entry.main` runs, even inside an import that
tries to swap the SIGINT handler; Ctrl-C swallowed inside a callback (llvmlite's object cache
while numba compiles) is remembered for the run to act on between tasks, and prints no
traceback; other unraisable errors are still reported.

Each test sets the SIGINT disposition it means (Python's own handler) and puts back the one it
found: a pytest started as a background job of a script inherits SIGINT ignored."""

from __future__ import annotations

import importlib
import os
import signal
import sys

import pytest

from sweep.cli import entry as cli
from sweep.terminal import interrupts


@pytest.fixture
def python_sigint(monkeypatch):
    """SIGINT with Python's own handler, as a process started from a terminal has it; the
    handler found is put back afterwards, and `interrupts` forgets what it remembered."""
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    monkeypatch.setattr(interrupts, "_started_with", [])
    monkeypatch.setattr(interrupts, "_received", interrupts.threading.Event())
    monkeypatch.setattr(sys, "unraisablehook", sys.__unraisablehook__)
    yield
    signal.signal(signal.SIGINT, previous)


def ctrl_c() -> None:
    """Deliver SIGINT to this process now (the handler runs before the next bytecode)."""
    os.kill(os.getpid(), signal.SIGINT)


def test_ctrl_c_inside_an_import_that_swaps_the_handler_exits_130(python_sigint, monkeypatch,
                                                                    capsys):
    """dask_jobqueue's import installs `lambda *_: sys.exit()` (exit 0); a Ctrl-C landing in
    that import, after the swap, must still stop the command with 130."""
    real_import, real_signal, imported = importlib.import_module, signal.signal, []

    def swapping_import(name, *args):
        if name == "sweep.cli.commands.status":
            signal.signal(signal.SIGINT, lambda *_: sys.exit())  # what dask_jobqueue does
            imported.append(name)
            ctrl_c()
        return real_import(name, *args)

    monkeypatch.setattr(importlib, "import_module", swapping_import)
    assert cli.main(["status", "no-such-store"]) == 130
    assert imported == ["sweep.cli.commands.status"]
    assert capsys.readouterr().err.strip() == (
        "sweep status: interrupted: while starting, nothing done")
    assert signal.getsignal(signal.SIGINT) is interrupts._on_sigint  # not the import's lambda
    assert signal.signal is real_signal  # the pin is lifted


def test_the_handler_is_installed_before_the_command_is_imported(python_sigint, monkeypatch):
    seen = []

    def spy(name, *args):
        seen.append(signal.getsignal(signal.SIGINT))
        raise KeyboardInterrupt  # Ctrl-C during the first import: nothing ran yet

    monkeypatch.setattr(importlib, "import_module", spy)
    assert cli.main(["report", "x"]) == 130
    assert seen == [interrupts._on_sigint]


def test_sigint_pinned_refuses_only_sigint(python_sigint):
    before = signal.getsignal(signal.SIGUSR1)
    with interrupts.sigint_pinned():
        assert signal.signal(signal.SIGINT, signal.SIG_IGN) is signal.default_int_handler
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        assert signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN
    signal.signal(signal.SIGUSR1, before)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # outside the block: allowed again
    assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN


def test_a_process_started_with_sigint_ignored_keeps_ignoring_it(python_sigint):
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # nohup cmd & from a script
    interrupts.remember_sigint()
    interrupts.restore_sigint()
    assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN


class RaisesWhenCollected:
    """An error raised where Python cannot pass it on (`__del__`), as in a compiler callback."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __del__(self) -> None:
        raise self.error


def unraisable(error: BaseException) -> None:
    RaisesWhenCollected(error)  # collected at once: Python calls sys.unraisablehook


def test_a_swallowed_ctrl_c_is_remembered_without_a_traceback(python_sigint, capsys):
    interrupts.remember_sigint()
    interrupts.restore_sigint()
    assert sys.unraisablehook is interrupts._quiet_swallowed_interrupt
    interrupts._received.set()  # what _on_sigint does when the signal arrives
    unraisable(KeyboardInterrupt())
    assert capsys.readouterr().err == ""
    unraisable(ValueError("a real problem"))
    assert "ValueError: a real problem" in capsys.readouterr().err


def test_an_llvmlite_object_the_interrupt_left_half_built_is_finalised_without_a_traceback(
        python_sigint, capsys):
    """Ctrl-C inside an llvmlite ObjectRef's __init__ (numba compiling) leaves it without
    `_as_parameter_`; its finaliser's AttributeError is noise once Ctrl-C has arrived, and
    reported as ever before."""
    from llvmlite.binding import ffi

    interrupts.remember_sigint()
    interrupts.restore_sigint()
    ffi.ObjectRef.__new__(ffi.ObjectRef)  # __init__ never ran: collected at once
    assert "has no attribute '_as_parameter_'" in capsys.readouterr().err
    interrupts._received.set()
    ffi.ObjectRef.__new__(ffi.ObjectRef)
    assert capsys.readouterr().err == ""


def test_importing_dask_jobqueue_for_slurm_leaves_ctrl_c_alone(python_sigint, monkeypatch):
    """The real import (forgotten first, so that it runs again) inside `_jobqueue`, which pins
    the handler: dask_jobqueue's `lambda *_: sys.exit()` is never installed."""
    from sweep.clusters import slurm

    for name in [name for name in sys.modules if name.startswith("dask_jobqueue")]:
        monkeypatch.delitem(sys.modules, name)
    slurm._jobqueue()
    assert "dask_jobqueue.runner" in sys.modules  # the module that swaps the handler ran
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler

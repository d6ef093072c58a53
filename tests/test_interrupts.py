"""Ctrl-C swallowed inside a callback (llvmlite's object cache while numba compiles) is
remembered for the run to act on between tasks, and prints no traceback; other unraisable
errors are still reported."""

from __future__ import annotations

import signal
import sys

from sweep import interrupts


class RaisesWhenCollected:
    """An error raised where Python cannot pass it on (`__del__`), as in a compiler callback."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def __del__(self) -> None:
        raise self.error


def unraisable(error: BaseException) -> None:
    RaisesWhenCollected(error)  # collected at once: Python calls sys.unraisablehook


def test_a_swallowed_ctrl_c_is_remembered_without_a_traceback(monkeypatch, capsys):
    monkeypatch.setattr(sys, "unraisablehook", sys.__unraisablehook__)
    monkeypatch.setattr(interrupts, "_received", interrupts.threading.Event())
    previous = signal.getsignal(signal.SIGINT)
    try:
        interrupts.restore_sigint()
        assert sys.unraisablehook is interrupts._quiet_swallowed_interrupt
        interrupts._received.set()  # what _on_sigint does when the signal arrives
        unraisable(KeyboardInterrupt())
        assert capsys.readouterr().err == ""
        unraisable(ValueError("a real problem"))
        assert "ValueError: a real problem" in capsys.readouterr().err
    finally:
        signal.signal(signal.SIGINT, previous)


def test_an_llvmlite_object_the_interrupt_left_half_built_is_finalised_without_a_traceback(
        monkeypatch, capsys):
    """Ctrl-C inside an llvmlite ObjectRef's __init__ (numba compiling) leaves it without
    `_as_parameter_`; its finaliser's AttributeError is noise once Ctrl-C has arrived, and
    reported as ever before."""
    from llvmlite.binding import ffi

    monkeypatch.setattr(sys, "unraisablehook", sys.__unraisablehook__)
    monkeypatch.setattr(interrupts, "_received", interrupts.threading.Event())
    previous = signal.getsignal(signal.SIGINT)
    try:
        interrupts.restore_sigint()
        ffi.ObjectRef.__new__(ffi.ObjectRef)  # __init__ never ran: collected at once
        assert "has no attribute '_as_parameter_'" in capsys.readouterr().err
        interrupts._received.set()
        ffi.ObjectRef.__new__(ffi.ObjectRef)
        assert capsys.readouterr().err == ""
    finally:
        signal.signal(signal.SIGINT, previous)

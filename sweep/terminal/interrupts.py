"""Ctrl-C that stops the sweep: the SIGINT handler the process started with, installed first
thing and pinned while imports run.

`dask_jobqueue.runner` installs `signal.signal(SIGINT, lambda *_: sys.exit())` when imported, so
Ctrl-C would raise `SystemExit(None)` (exit 0, no message). `sweep.cli.entry.main` calls
`remember_sigint()` and `restore_sigint()` before anything else and imports the command inside
`sigint_pinned()` (so does `sweep.clusters.slurm` around its lazy import of dask_jobqueue), where
an attempt to replace the SIGINT handler is refused: there is no moment after `main` starts at
which Ctrl-C does anything but raise KeyboardInterrupt, which `main` turns into one line and exit
code 130. A process started with SIGINT ignored (`nohup cmd &` from a script, whose background
jobs start with SIGINT ignored) keeps ignoring it: a test that means to interrupt a child sets
the child's disposition itself. `Interrupted` carries
the one-line summary of what finished. A KeyboardInterrupt raised inside a callback that cannot
pass it on (llvmlite's object cache while numba compiles) is remembered and acted on between
tasks; Python's report of it ("Exception ignored in ...", a traceback) is left out, and so is
the report of llvmlite's finaliser of an object the interrupt left half-built.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, with a one-line summary of what finished before it (`str(error)`)."""


_started_with: list[Any] = []  # the handler `remember_sigint` saw, once
_received = threading.Event()  # a SIGINT arrived (even if its KeyboardInterrupt was swallowed)


def _on_sigint(signum: int, frame: Any) -> None:
    """Python's own handler, remembering the signal: a KeyboardInterrupt raised inside a
    callback that swallows exceptions (numba's compiler, ctypes callbacks) is not lost."""
    _received.set()
    signal.default_int_handler(signum, frame)


def _quiet_swallowed_interrupt(unraisable: Any) -> None:
    """sys.unraisablehook: once Ctrl-C has arrived (`_received`), no traceback for a
    KeyboardInterrupt that a callback swallowed (already remembered) nor for an llvmlite
    finaliser failing on an object whose construction the interrupt cut short (an ObjectRef
    without its `_as_parameter_`); everything else goes to the hook this one replaced."""
    if _received.is_set() and (issubclass(unraisable.exc_type, KeyboardInterrupt)
                               or _llvmlite_finaliser(unraisable.object)):
        return
    _quiet_swallowed_interrupt.previous(unraisable)


def _llvmlite_finaliser(obj: Any) -> bool:
    """Whether the object an unraisable error came from is a function of llvmlite's."""
    return str(getattr(obj, "__module__", None) or "").startswith("llvmlite.")


_quiet_swallowed_interrupt.previous = sys.__unraisablehook__


def raise_if_interrupted() -> None:
    """KeyboardInterrupt if Ctrl-C arrived and was swallowed where it was raised (call between
    tasks)."""
    if _received.is_set():
        raise KeyboardInterrupt


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def remember_sigint() -> None:
    """Note the SIGINT handler the process has now (call before importing dask_jobqueue)."""
    if _main_thread() and not _started_with:
        _started_with.append(signal.getsignal(signal.SIGINT))


def restore_sigint() -> None:
    """Put back the remembered SIGINT handler (Python's KeyboardInterrupt by default); a no-op
    outside the main thread."""
    if not _main_thread():
        return
    handler = _started_with[0] if _started_with else signal.default_int_handler
    if not callable(handler) and handler != signal.SIG_IGN:
        handler = signal.default_int_handler  # SIG_DFL or None: Python's own
    if handler is signal.default_int_handler:
        handler = _on_sigint
        if sys.unraisablehook is not _quiet_swallowed_interrupt:
            _quiet_swallowed_interrupt.previous = sys.unraisablehook
            sys.unraisablehook = _quiet_swallowed_interrupt
    signal.signal(signal.SIGINT, handler)


@contextmanager
def sigint_pinned() -> Iterator[None]:
    """Within the block, `signal.signal(SIGINT, ...)` leaves the SIGINT handler as it is (and
    returns it): an import cannot swap Ctrl-C for its own handler, not even for an instant. Other
    signals are untouched; a no-op outside the main thread."""
    if not _main_thread():
        yield
        return
    real = signal.signal

    def refuse_sigint(signum: int, handler: Any) -> Any:
        if signum == signal.SIGINT:
            return signal.getsignal(signal.SIGINT)
        return real(signum, handler)

    signal.signal = refuse_sigint
    try:
        yield
    finally:
        signal.signal = real

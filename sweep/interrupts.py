"""Ctrl-C that stops the sweep: Python's own SIGINT handler, restored after imports replace it.

`dask_jobqueue.runner` installs `signal.signal(SIGINT, lambda *_: sys.exit())` when imported, so
Ctrl-C would raise `SystemExit(None)` (exit 0, no message). `restore_sigint()` puts back
`signal.default_int_handler` (KeyboardInterrupt), which `sweep.cli.main` turns into one line
and exit code 130. `Interrupted` carries the one-line summary of what finished.
"""

from __future__ import annotations

import signal
import threading


class Interrupted(KeyboardInterrupt):
    """Ctrl-C, with a one-line summary of what finished before it (`str(error)`)."""


def restore_sigint() -> None:
    """Make SIGINT raise KeyboardInterrupt again (main thread only; a no-op elsewhere)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)

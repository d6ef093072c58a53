"""One line and an exit code per fault: how `sweep.cli.entry.main` reports what stopped a command.

Exit codes (documented in docs/faults.md):

- 0: done; 1: tasks failed or pending (`run`, `status`), or a model could not deliver attention;
- 2: bad input (a config, a file, a value): `InputError`, a missing file or folder, an
  `OSError` a library raised about a file it was given (no errno, no path: `is_library_report`);
- 3: the environment (read-only or full disk, a path that is a file, a missing device):
  `EnvironmentFault` or any other `OSError`;
- 4: a damaged or half-created store (`StoreDamagedError`): rerun `sweep run` to repair;
- 130: interrupted (Ctrl-C).
"""

from __future__ import annotations

import errno

from storage.errors import EnvironmentFault, ExtractionError, InputError, StoreDamagedError
from storage.location import redact_url

EXIT_FAILED, EXIT_INPUT, EXIT_ENVIRONMENT, EXIT_DAMAGED, EXIT_INTERRUPTED = 1, 2, 3, 4, 130

# errno -> what to do about it
FIXES = {
    errno.EROFS: "the file system is read-only; choose a writable path",
    errno.ENOSPC: "the disk is full; free space or choose a path on another disk",
    errno.EDQUOT: "the disk quota is exhausted; free space or choose another path",
    errno.EACCES: "permission denied; choose a path you can write to",
    errno.EPERM: "operation not permitted; choose a path you can write to",
    errno.ENOTDIR: "a part of the path is a file, not a folder; choose another path",
    errno.EEXIST: "something already exists there; remove it or choose another path",
    errno.EISDIR: "that path is a folder; give a file path",
}


def one_line(text: str) -> str:
    """`text` with every run of whitespace (newlines included) collapsed to one space, and the
    userinfo of any URL in it hidden (`storage.location.redact_url`)."""
    return redact_url(" ".join(str(text).split()))


def os_error_line(error: OSError) -> str:
    """`<path>: <reason>; <fix>` for an OSError, naming the path it was about when known (the
    error's own message when it has no errno: a library's, not the system's)."""
    where = error.filename if error.filename is not None else "(unknown path)"
    if error.filename2 is not None:
        where = f"{where} -> {error.filename2}"
    reason = error.strerror or str(error) or type(error).__name__
    fix = FIXES.get(error.errno, "check the path and the disk, then rerun")
    return f"{where}: {reason}; {fix}"


# OSError subclasses that stand for the system even without an errno (a network that does not
# answer, a process, a permission)
SYSTEM_ERRORS = (ConnectionError, TimeoutError, PermissionError, BlockingIOError,
                 ChildProcessError, InterruptedError, ProcessLookupError)


def is_library_report(error: OSError) -> bool:
    """Whether an OSError is a library's report on a file it was given rather than a failed
    system call: it carries no errno and no path (transformers raises `OSError("... does not
    appear to have a file named preprocessor_config.json")`, PIL `OSError("image file is
    truncated")`), and is none of the kinds that stand for the system (SYSTEM_ERRORS). Such
    an error is the user's input (exit 2) and its message is the cause: before issue 28 it was
    reported as `environment fault: (unknown path): OSError`, exit 3, the message lost."""
    return error.errno is None and error.filename is None and bool(str(error)) \
        and not isinstance(error, SYSTEM_ERRORS)


TASK_FAILURE = "sweep_task_key"  # attribute set on a task's exception re-raised by --in-process


def classify(error: BaseException) -> tuple[int, str, str] | None:
    """(exit code, label, one-line message) for a fault `main` reports, or None to re-raise
    (unknown errors: a bug keeps its traceback, as does a task's own unknown exception
    re-raised by `sweep run --in-process`; a task's known fault is one line like any other)."""
    if isinstance(error, KeyboardInterrupt):
        return EXIT_INTERRUPTED, "interrupted", one_line(str(error)) or "stopped by Ctrl-C"
    if isinstance(error, (InputError, FileNotFoundError, IsADirectoryError)):
        return EXIT_INPUT, "error", one_line(str(error))
    if isinstance(error, ExtractionError):
        return EXIT_FAILED, "extraction failed", one_line(str(error))
    if isinstance(error, StoreDamagedError):
        return EXIT_DAMAGED, "damaged store", one_line(str(error))
    if isinstance(error, EnvironmentFault):
        return EXIT_ENVIRONMENT, "environment fault", one_line(str(error))
    if isinstance(error, OSError) and is_library_report(error):
        return EXIT_INPUT, "error", one_line(str(error))
    if isinstance(error, OSError):
        return EXIT_ENVIRONMENT, "environment fault", one_line(os_error_line(error))
    return None  # also for a task's exception (TASK_FAILURE set): its traceback is the point

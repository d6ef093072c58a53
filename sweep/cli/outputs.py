"""What a command outputs: the `--format` names every command shares, and output paths
checked before the work that fills them (a file where a folder is needed, a read-only or
unwritable place; refusals raise before anything is created)."""

from __future__ import annotations

import argparse
import errno
import os
from pathlib import Path

from storage.errors import InputError

FORMATS = ("text", "json", "csv")
"""`--format` values, the same on every command: `text` for a reader (a table; Markdown for
`sweep report` and `sweep precision`), the default everywhere; `json` for a program; `csv` where
the output is one table."""
FORMAT_ALIASES = {"md": "text", "markdown": "text"}
"""Older or other names kept working (`sweep report --format md` before the names were one
scheme): each reads as the format it names."""


def format_name(value: str) -> str:
    """A `--format` value with its alias resolved (`md` -> `text`); others unchanged."""
    return FORMAT_ALIASES.get(value, value)


def add_format_argument(parser: argparse.ArgumentParser, formats: tuple[str, ...],
                        help: str = "", default: str | None = "text") -> None:
    """`--format` with `formats` (FORMATS that the command writes, `text` among them), their
    aliases (FORMAT_ALIASES) and `help` after the list of choices."""
    if not set(formats) <= set(FORMATS) or "text" not in formats:
        raise ValueError(f"--format {formats}: give some of {FORMATS}, text among them")
    parser.add_argument("--format", type=format_name, choices=formats, default=default,
                        help=(help or f"default {default}") + "; md reads as text (the same "
                        "--format names on every command)")


def first_existing(path: Path) -> Path:
    """`path` itself or its nearest existing ancestor."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_writable_folder(folder: Path, what: str) -> None:
    """InputError if `folder` (or the ancestor it would be created in) is a file; OSError
    (EROFS/EACCES, naming the folder) if it cannot be written. Creates nothing."""
    if folder.exists() and not folder.is_dir():
        raise InputError(f"{what} {folder}: a file, not a folder; give a folder path")
    base = first_existing(folder)
    if not base.is_dir():
        raise InputError(f"{what} {folder}: {base} is a file, not a folder; choose another path")
    if not os.access(base, os.W_OK | os.X_OK):
        code = errno.EROFS if _read_only(base) else errno.EACCES
        raise OSError(code, os.strerror(code), str(base))


def _read_only(path: Path) -> bool:
    return bool(os.statvfs(path).f_flag & os.ST_RDONLY)


def npz_path(out: Path) -> Path:
    """Where `numpy.savez(out, ...)` writes: `out`, with `.npz` appended unless it ends so."""
    return out if out.suffix == ".npz" else out.with_name(out.name + ".npz")

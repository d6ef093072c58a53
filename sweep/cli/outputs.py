"""Output paths checked before the work that fills them: a file where a folder is needed, a
read-only or unwritable place. Refusals raise before anything is created."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from storage.errors import InputError


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

"""What `sweep report` computed from a store, kept for the next rendering of the same store.

An entry's key hashes everything its output depends on: every object of the store (its key, size
and version: mtime locally, ETag on object storage), the report's options, and the source of the
code that builds it. Any write, deletion or addition in the store, or any edit of the code,
changes the key, so an entry is never stale; it can only be missed. (A local chunk rewritten to
the same size with its mtime set back goes unseen, as it does for `sweep run` without --verify.)

Entries live in the project's cache folder (`cache_root`: $SWEEP_CACHE_DIR, else
$DOBRUSHIN_CACHE/reports, else the user cache folder by platformdirs), never in the store: a
report only reads its store. The newest MAX_ENTRIES are kept.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from storage.location import Location

MAX_ENTRIES = 32
PACKAGES = ("storage", "workers", "sweep")
"""The code a report depends on: every module of these packages is hashed into the key."""


def cache_root() -> Path:
    """The folder of every entry: $SWEEP_CACHE_DIR, else `reports` in the project's cache folder
    ($DOBRUSHIN_CACHE, else the platform's user cache folder, as
    `workers.exact.numba_cache.cache_home`, which this module does not import: it loads numba)."""
    configured = os.environ.get("SWEEP_CACHE_DIR")
    if configured:
        return Path(configured)
    home = os.environ.get("DOBRUSHIN_CACHE")
    if home is not None:
        return Path(home).expanduser() / "reports"
    import platformdirs

    return Path(platformdirs.user_cache_dir("dobrushin-sweep")) / "reports"


def code_digest() -> str:
    """sha256 over the source of every module of PACKAGES (relative path and bytes)."""
    root = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256()
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            digest.update(path.relative_to(root).as_posix().encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def store_digest(location: Location) -> str:
    """sha256 over every object of the store: key, size and version, sorted by key."""
    digest = hashlib.sha256()
    for key, info in sorted(location.listing().items()):
        digest.update(f"{key}\0{info.size}\0{info.version}\n".encode())
    return digest.hexdigest()


LIBRARIES = ("numpy", "pandas", "scipy", "xarray", "zarr", "matplotlib", "markdown-it-py")
"""Libraries whose version is part of the key (their output could change with them)."""


def library_versions() -> dict[str, str | None]:
    """The installed version of each of LIBRARIES (None if absent)."""
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str | None] = {}
    for name in LIBRARIES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def entry_key(location: Location, options: Mapping[str, Any]) -> str:
    """The key of the report of the store at `location` with `options` (JSON-able), by the
    code and libraries as they are now."""
    parts = {"store": store_digest(location), "code": code_digest(),
             "libraries": library_versions(), "options": dict(options)}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


class ReportCache:
    """One entry's folder: named artifacts (bytes) and pickled objects, written atomically."""

    def __init__(self, key: str, root: Path | None = None) -> None:
        self.root = cache_root() if root is None else root
        self.folder = self.root / key

    def read(self, name: str) -> bytes | None:
        """The artifact `name`, or None when this entry lacks it (or it cannot be read)."""
        try:
            return (self.folder / name).read_bytes()
        except OSError:
            return None

    def write(self, name: str, data: bytes) -> None:
        """Keep `data` as `name` (best effort: a cache that cannot be written is skipped)."""
        with contextlib.suppress(OSError):
            self.folder.mkdir(parents=True, exist_ok=True)
            handle, staged = tempfile.mkstemp(dir=self.folder, prefix=f".{name}.")
            with os.fdopen(handle, "wb") as out:
                out.write(data)
            os.replace(staged, self.folder / name)
            os.utime(self.folder)
            self.prune()

    def load(self, name: str) -> Any | None:
        """The object pickled as `name`, or None (absent, or from another library version)."""
        data = self.read(name)
        if data is None:
            return None
        try:
            return pickle.loads(data)  # noqa: S301 - the user's own cache folder
        except Exception:  # noqa: BLE001 - an unreadable entry is a miss
            return None

    def dump(self, name: str, value: Any) -> None:
        self.write(name, pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))

    def prune(self) -> None:
        """Remove the oldest entries beyond MAX_ENTRIES."""
        entries = sorted((p for p in self.root.iterdir() if p.is_dir()),
                         key=lambda p: p.stat().st_mtime_ns, reverse=True)
        for stale in entries[MAX_ENTRIES:]:
            shutil.rmtree(stale, ignore_errors=True)

"""What `sweep report` computed from a store, kept for the next rendering of the same store.

An entry's key hashes everything its output depends on: every object of the store (its key, size
and version: mtime locally, ETag on object storage), the report's options, and the source of the
code that builds it. Any write, deletion or addition in the store, or any edit of the code,
changes the key, so an entry is never stale; it can only be missed. (A local chunk rewritten to
the same size with its mtime set back goes unseen, as it does for `sweep run` without --verify.)

Anyone who can list a store can compute its key, so an entry is trusted for what it holds, never
for where it lies: entries are data, never code (the rendered texts, and the `Report` as JSON:
`encode_value`, each table's columns with their dtypes, read back without pickle), and every
file of an entry carries an HMAC-SHA256 of its key, its kind and its bytes under a per-user
secret (`SECRET`, 32 random bytes created 0600 beside the entries). A file copied from another
key, of another kind, or written by anyone without the secret is a miss.

Entries live in a folder of the tool's own (`cache_root`: `dobrushin-sweep-reports` inside
$SWEEP_CACHE_DIR, else $DOBRUSHIN_CACHE/reports, else `reports` in the user cache folder by
platformdirs), never in the store: a report only reads its store. The folder is created 0700 and
is not used (one stderr line, the report computed and nothing kept) when it is a link, is not
the user's own, or others may write to it. The newest MAX_ENTRIES entries are kept, and pruning
removes only entry folders this cache made (a key's name holding a stamp under the secret):
nothing else in the folder or around it is ever deleted.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import re
import secrets
import shutil
import stat
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any

from storage.location import Location

MAX_ENTRIES = 32
PACKAGES = ("storage", "workers", "sweep")
"""The code a report depends on: every module of these packages is hashed into the key."""
OWN_FOLDER = "dobrushin-sweep-reports"  # inside $SWEEP_CACHE_DIR: the cache's folder of its own
SECRET = "secret"  # the per-user key of every entry's HMAC, in the cache's folder
STAMP = "entry"  # the file that says an entry folder is this cache's
MAGIC = b"dobrushin-sweep-report-cache 1"
KEY_NAME = re.compile(r"[0-9a-f]{64}")


def cache_root() -> Path:
    """The cache's own folder: `dobrushin-sweep-reports` in $SWEEP_CACHE_DIR, else `reports` in
    the project's cache folder ($DOBRUSHIN_CACHE, else the platform's user cache folder, as
    `workers.exact.numba_cache.cache_home`, which this module does not import: it loads numba)."""
    configured = os.environ.get("SWEEP_CACHE_DIR")
    if configured:
        return Path(configured).expanduser() / OWN_FOLDER
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


# --- the folder of the cache's own, and its secret ----------------------------------------------

def _private(path: Path, kind: int) -> bool:
    """Whether `path` is a `kind` (stat.S_IFDIR, S_IFREG) itself (not a link), this user's,
    and writable by nobody else."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    own = not hasattr(os, "getuid") or info.st_uid == os.getuid()
    return stat.S_IFMT(info.st_mode) == kind and own and not info.st_mode & 0o022


def _folder(path: Path) -> bool:
    """Create `path` (0700) if absent; whether it is a private folder (`_private`)."""
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir(mode=0o700, exist_ok=True)
    return _private(path, stat.S_IFDIR)


def _secret(root: Path) -> bytes | None:
    """The per-user secret of the cache at `root` (created on first use), None when it cannot
    be made or is not private."""
    path = root / SECRET
    if not os.path.lexists(path):
        with contextlib.suppress(OSError):  # whole or not at all: linked into place once written
            handle, staged = tempfile.mkstemp(dir=root, prefix=f".{SECRET}.")  # 0600
            try:
                with os.fdopen(handle, "wb") as out:
                    out.write(secrets.token_bytes(32))
                with contextlib.suppress(FileExistsError):  # another process made it first
                    os.link(staged, path)
            finally:
                os.unlink(staged)
    if not _private(path, stat.S_IFREG) or os.lstat(path).st_mode & 0o077:
        return None
    try:
        data = path.read_bytes()
    except OSError:
        return None
    return data if len(data) == 32 else None


_WARNED: set[Path] = set()


def cache_secret(root: Path) -> bytes | None:
    """The secret of the cache folder `root`, made private if new; None (and one stderr line
    per folder and process) when the folder cannot be used."""
    secret = _secret(root) if _folder(root) else None
    if secret is None and root not in _WARNED:
        _WARNED.add(root)
        print(f"sweep: warning: report cache {root}: not a folder of this user's that only it "
              f"can write (or it cannot be created); nothing is kept or read there (set "
              f"SWEEP_CACHE_DIR to a folder of yours)", file=sys.stderr)
    return secret


# --- entries ------------------------------------------------------------------------------------

class ReportCache:
    """One entry's folder: named artifacts (bytes) and JSON-encoded objects, each file written
    atomically and authenticated (see the module)."""

    def __init__(self, key: str, root: Path | None = None) -> None:
        if not KEY_NAME.fullmatch(key):
            raise ValueError(f"not a cache key: {key!r}")
        self.key = key
        self.root = cache_root() if root is None else root
        self.folder = self.root / key
        self._secret: bytes | None | bool = False  # False: not looked at yet

    @property
    def secret(self) -> bytes | None:
        if self._secret is False:
            self._secret = cache_secret(self.root)
        return self._secret  # type: ignore[return-value]

    def _tag(self, key: str, kind: str, data: bytes) -> bytes:
        message = key.encode() + b"\0" + kind.encode() + b"\0" + data
        return hmac.new(self.secret or b"", message, hashlib.sha256).hexdigest().encode()

    def _open(self, path: Path, key: str, kind: str) -> bytes | None:
        """The payload of the file at `path` if it is this cache's `kind` of entry `key`."""
        if self.secret is None or not _private(path, stat.S_IFREG):
            return None
        try:
            head, _, data = path.read_bytes().partition(b"\n")
        except OSError:
            return None
        magic, _, tag = head.rpartition(b" ")
        if magic != MAGIC or not hmac.compare_digest(tag, self._tag(key, kind, data)):
            return None
        return data

    def read(self, name: str) -> bytes | None:
        """The artifact `name`, or None when this entry lacks it, or it is not this cache's
        `name` of this key (a copy, another kind, a forgery), or it cannot be read."""
        return self._open(self.folder / name, self.key, name)

    def write(self, name: str, data: bytes) -> None:
        """Keep `data` as `name` (best effort: a cache that cannot be written is skipped)."""
        if self.secret is None or not _folder(self.folder):
            return
        with contextlib.suppress(OSError):
            stamp = self.folder / STAMP
            if self._open(stamp, self.key, STAMP) is None:
                self._put(stamp, STAMP, b"")
            self._put(self.folder / name, name, data)
            os.utime(self.folder)
            self.prune()

    def _put(self, path: Path, kind: str, data: bytes) -> None:
        handle, staged = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(handle, "wb") as out:
            out.write(MAGIC + b" " + self._tag(self.key, kind, data) + b"\n" + data)
        os.replace(staged, path)

    def load(self, name: str, cls: type) -> Any | None:
        """The dataclass `cls` kept as `name` (`dump`), or None (absent, unreadable, not this
        cache's, or of another shape)."""
        data = self.read(name)
        if data is None:
            return None
        try:
            value = decode_value(json.loads(data))
            return cls(**value) if isinstance(value, dict) else None
        except (ValueError, TypeError, KeyError):
            return None

    def dump(self, name: str, value: Any) -> bool:
        """Keep the dataclass `value` as JSON under `name` when it reads back identical
        (`encode_value`); whether it was kept."""
        encoded = encode_dataclass(value)
        if encoded is None:
            return False
        self.write(name, encoded)
        return True

    def prune(self) -> None:
        """Remove the oldest of this cache's entries beyond MAX_ENTRIES; nothing else."""
        entries = []
        for path in self.root.iterdir():
            if KEY_NAME.fullmatch(path.name) and _private(path, stat.S_IFDIR) and \
                    self._open(path / STAMP, path.name, STAMP) is not None:
                entries.append((path.lstat().st_mtime_ns, path))
        for _, stale in sorted(entries, reverse=True)[MAX_ENTRIES:]:
            shutil.rmtree(stale, ignore_errors=True)


# --- values as JSON -----------------------------------------------------------------------------

class Unencodable(TypeError):
    """A value the cache's JSON does not represent exactly."""


def encode_value(value: Any) -> Any:
    """`value` as JSON data that `decode_value` turns back into an equal value of the same
    types: None, bool, int, float (NaN and infinities too), str, lists, tuples, dicts, numpy
    scalars and pandas DataFrames (columns with their dtypes, a plain or range index);
    Unencodable for anything else. Every JSON object is a tagged value."""
    import numpy as np
    import pandas as pd

    kind = type(value)
    if value is None or kind in (bool, int, float, str):
        return value
    if isinstance(value, np.generic) and value.dtype.kind in "biufU":
        return {"numpy": [value.dtype.str, value.item()]}
    if kind is list:
        return [encode_value(v) for v in value]
    if kind is tuple:
        return {"tuple": [encode_value(v) for v in value]}
    if kind is dict:
        return {"dict": [[encode_value(k), encode_value(v)] for k, v in value.items()]}
    if kind is pd.DataFrame:
        return {"frame": {
            "columns": _encode_index(value.columns), "index": _encode_index(value.index),
            "dtypes": [str(dtype) for dtype in value.dtypes], "attrs": encode_value(value.attrs),
            "data": [[encode_value(v) for v in value.iloc[:, i].tolist()]
                     for i in range(value.shape[1])]}}
    raise Unencodable(f"{kind.__name__} is not kept by the report cache")


def _encode_index(index: Any) -> Any:
    import pandas as pd

    if type(index) is pd.RangeIndex:
        return {"range": [index.start, index.stop, index.step], "name": encode_value(index.name)}
    if type(index) is pd.Index:
        return {"values": [encode_value(v) for v in index.tolist()], "dtype": str(index.dtype),
                "name": encode_value(index.name)}
    raise Unencodable(f"{type(index).__name__} is not kept by the report cache")


def decode_value(data: Any) -> Any:
    """The value `encode_value` encoded as `data` (ValueError, TypeError or KeyError if `data`
    is not such an encoding)."""
    import numpy as np
    import pandas as pd

    if data is None or type(data) in (bool, int, float, str):
        return data
    if type(data) is list:
        return [decode_value(v) for v in data]
    (tag, body), = data.items()
    if tag == "numpy":
        dtype, item = body
        if not isinstance(dtype, str) or np.dtype(dtype).kind not in "biufU":
            raise ValueError(f"not a numpy scalar type: {dtype!r}")
        return np.dtype(dtype).type(item)
    if tag == "tuple":
        return tuple(decode_value(v) for v in body)
    if tag == "dict":
        return {decode_value(k): decode_value(v) for k, v in body}
    if tag == "frame":
        columns = [pd.Series([decode_value(v) for v in values], dtype=dtype)
                   for values, dtype in zip(body["data"], body["dtypes"], strict=True)]
        index = _decode_index(body["index"])
        frame = pd.DataFrame({i: column.set_axis(index) for i, column in enumerate(columns)},
                             index=index)
        frame.columns = _decode_index(body["columns"])
        frame.attrs = decode_value(body["attrs"])
        return frame
    raise ValueError(f"not an encoded value: {tag!r}")


def _decode_index(data: dict) -> Any:
    import pandas as pd

    if "range" in data:
        return pd.RangeIndex(*data["range"], name=decode_value(data["name"]))
    return pd.Index([decode_value(v) for v in data["values"]], dtype=data["dtype"],
                    name=decode_value(data["name"]))


def _same(a: Any, b: Any) -> bool:
    """Whether `b` (decoded) is `a`: the same encoding, and frames equal exactly (dtypes,
    categories, index and column types included)."""
    import pandas as pd

    if isinstance(a, pd.DataFrame):
        try:
            pd.testing.assert_frame_equal(a, b, check_exact=True, check_index_type=True,
                                          check_column_type=True, check_frame_type=True)
        except AssertionError:
            return False
        return True
    return True


def encode_dataclass(value: Any) -> bytes | None:
    """A dataclass instance's fields as JSON bytes (`encode_value`), or None when one of them
    does not read back identical (then it is not kept)."""
    if not is_dataclass(value) or isinstance(value, type):
        return None
    try:
        fields_ = {f.name: getattr(value, f.name) for f in fields(value)}
        encoded = {"dict": [[name, encode_value(v)] for name, v in fields_.items()]}
        text = json.dumps(encoded, allow_nan=True)
        back = decode_value(json.loads(text))
    except (Unencodable, ValueError, TypeError, KeyError):
        return None
    again = json.dumps({"dict": [[name, encode_value(v)] for name, v in back.items()]},
                       allow_nan=True)
    if again != text or not all(_same(v, back[name]) for name, v in fields_.items()):
        return None
    return text.encode()

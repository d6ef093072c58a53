"""Where numba keeps this version's compiled kernels on disk.

numba checks only a cached function's own source file, so after an upgrade a kernel whose callee
changed in another module would load stale machine code from `__pycache__`. `configure` points
numba's cache (unless `NUMBA_CACHE_DIR` is set) at a folder named by the digest of every module
with cached kernels, so any change among them starts a fresh cache. `workers.exact.kernel`, which
every other cached module imports first, calls it before its kernels are defined.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numba

NUMBA_MODULES = (
    "center_bound.py", "kernel.py", "pruned.py", "radius.py", "readings.py",
    "restrict_kernel.py",
)
"""The modules whose numba functions are cached on disk (`cache=True`); they call one another."""


def cache_home() -> Path:
    """The project's cache folder: $DOBRUSHIN_CACHE, else the platform's user cache folder
    (platformdirs: `~/.cache/dobrushin-sweep` on Linux without $XDG_CACHE_HOME)."""
    configured = os.environ.get("DOBRUSHIN_CACHE")
    if configured is not None:
        return Path(configured).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("dobrushin-sweep"))


def cache_dir(package: Path = Path(__file__).parent) -> Path:
    """`<cache_home()>/numba/<digest of the NUMBA_MODULES sources in package>`."""
    digest = hashlib.sha256()
    for name in NUMBA_MODULES:
        digest.update(name.encode() + b"\0" + (package / name).read_bytes())
    return cache_home() / "numba" / digest.hexdigest()[:16]


def configure() -> None:
    """Cache kernels compiled from now on under `cache_dir()`; nothing when NUMBA_CACHE_DIR is
    set (the user's choice) or the folder cannot be made (numba's default, beside the sources)."""
    if os.environ.get("NUMBA_CACHE_DIR"):
        return
    path = cache_dir()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return
    numba.config.CACHE_DIR = str(path)

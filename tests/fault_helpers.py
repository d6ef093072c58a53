"""Helpers of the fault tests: a tiny text sweep, a checksum of a folder tree, one-line stderr."""

from __future__ import annotations

import hashlib
import os
import signal
from pathlib import Path

REPO = Path(__file__).parents[1]
LINES = [
    "the cat sat on the mat and looked at the door",
    "a quick brown fox jumps over the lazy dog again",
    "rain fell all night on the quiet little town",
    "she opened the window and the cold air came in",
    "numbers add up when you count them carefully",
]


def write_text_sweep(folder: Path, lines: list[str] | None = None, extra: str = "") -> Path:
    """A sweep of tiny-roberta over a 5-line text file, shards of 2 (3 shards), no baseline and
    no matched nulls."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "lines.txt").write_text("\n".join(lines or LINES) + "\n")
    path = folder / "sweep.yaml"
    path.write_text(
        "store: sweep.zarr\nshard_size: 2\nretries: 0\n" + extra + "matched_nulls: null\n"
        + "datasets:\n  lines: {path: lines.txt}\n"
        + "models:\n  rob: {source: tiny-roberta, dataset: lines}\n"
    )
    return path


def tree_digest(path: Path) -> str:
    """sha256 over every entry under `path` (relative names, kinds, file bytes); '' if absent."""
    if not os.path.lexists(path):
        return ""
    digest = hashlib.sha256()
    entries = [path] if not path.is_dir() else [path, *sorted(path.rglob("*"))]
    for entry in entries:
        digest.update(str(entry.relative_to(path.parent)).encode() + b"\0")
        if entry.is_file():
            digest.update(b"f" + entry.read_bytes())
        else:
            digest.update(b"d")
    return digest.hexdigest()


def env() -> dict[str, str]:
    """Environment of a `python -m sweep` subprocess."""
    return {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}


def default_sigint() -> None:
    """`preexec_fn` of a child a test means to Ctrl-C: SIGINT's default disposition, whatever
    this process inherited (a background job of a script, `nohup cmd &`, starts with SIGINT
    ignored, and so would its children: they would run to the end and exit 0)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def one_stderr_line(err: str) -> str:
    """The single stderr line (asserting there is exactly one)."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


def store_arrays(store: Path) -> dict:
    """Every array of every group of the store, by path (numpy values)."""
    import warnings

    import zarr

    root = zarr.open_group(str(store), mode="r")
    with warnings.catch_warnings():  # listing the root meets the bookkeeping folder `.sweep`
        warnings.filterwarnings("ignore", message=".*not recognized as a component")
        return {path: array[:] for path, array in root.members(max_depth=None)
                if isinstance(array, zarr.Array)}

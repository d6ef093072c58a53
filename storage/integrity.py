"""What a done marker vouches for, and whether the store still holds it.

A task that finished records, in its done marker, every chunk file it wrote: the path relative to
the store, its size and its sha256 (or null: a chunk equal to the fill value is not written, as
zarr 3 skips empty chunks). `damaged_chunks` re-reads them: a deleted, truncated or overwritten
chunk (or one that appeared where none was written) no longer matches. `quick=True` compares
existence and size only (a stat per chunk, no read): what `sweep report` checks before it reads.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path

import zarr

Checksums = dict[str, list | None]  # relative path -> [size, sha256] or None (not written)
READ = 1 << 20


def file_checksum(path: Path) -> list | None:
    """[size, sha256 hex] of a file, or None if it does not exist."""
    try:
        with open(path, "rb") as handle:
            digest = hashlib.sha256()
            size = 0
            while block := handle.read(READ):
                digest.update(block)
                size += len(block)
    except FileNotFoundError:
        return None
    return [size, digest.hexdigest()]


def chunk_files(array: zarr.Array, coords: Iterable[tuple[int, ...]]) -> list[str]:
    """Paths, relative to the store root, of `array`'s chunks at `coords`."""
    return [f"{array.path}/{array.metadata.encode_chunk_key(tuple(c))}" for c in coords]


def checksums(store: str | Path, files: Iterable[str]) -> Checksums:
    """Checksum of every file (relative to `store`)."""
    return {name: file_checksum(Path(store) / name) for name in files}


def damaged_chunks(store: str | Path, vouched: Mapping[str, list | None], *,
                   quick: bool = False) -> list[str]:
    """The vouched files that no longer match: missing, truncated, overwritten or new."""
    bad = []
    for name, expected in vouched.items():
        path = Path(store) / name
        if quick:
            size = path.stat().st_size if path.exists() else None
            if (expected is None) != (size is None) or (size is not None
                                                          and size != expected[0]):
                bad.append(name)
        elif file_checksum(path) != (None if expected is None else list(expected)):
            bad.append(name)
    return bad


def variable_of(chunk: str) -> str:
    """`vit/results/kappa` for `vit/results/kappa/c/0/0/0`."""
    return chunk.split("/c/")[0]


def scan_store(store: str | Path, *, quick: bool = False) -> dict[str, list[str]]:
    """Every done marker of the store whose chunks no longer match: marker path -> files."""
    root = Path(store) / ".sweep" / "markers"
    out = {}
    for marker in sorted(root.rglob("*.done")):
        try:
            vouched = json.loads(marker.read_text()).get("chunks")
        except (ValueError, AttributeError):
            vouched = None  # `done` markers from before checksums vouch for nothing to check
        bad = damaged_chunks(store, vouched, quick=quick) if isinstance(vouched, dict) else []
        if bad:
            out[str(marker.relative_to(root))] = bad
    return out


def damage_message(store: str | Path, damaged: dict[str, list[str]]) -> str:
    """One line naming the damaged variables and the fix."""
    variables = sorted({variable_of(f) for files in damaged.values() for f in files})
    return (f"store {store}: damaged chunks in {', '.join(variables)} ({len(damaged)} task(s)); "
            f"rerun `sweep run` with its config to recompute them")

"""What a done marker vouches for, and whether the store still holds it.

A task that finished records, in its done marker, every chunk file it wrote: the path relative to
the store, `[size, "crc32c:<8 hex>", st_mtime_ns]` (`file_checksum`), or null (a chunk equal to
the fill value is not written, as zarr 3 skips empty chunks). Markers written before this format
hold `[size, "<64 hex>"]` (sha256, no mtime) and verify as they always did: the digest's prefix
says which hash to recompute. The threat is accidental damage (truncation, an overwrite, a
deletion, bit rot), not an adversary: CRC32C detects every burst of up to 32 flipped bits and
misses other damage with odds of 2^-32; it is not meant to resist deliberate forgery.

Three depths of check (`damaged_chunks`), each finding a deleted chunk or one that appeared where
none was written:
- `SIZE`: existence and size (a stat per chunk, no read): what `sweep report` checks first;
- `STAT` (`sweep run` at start-up): size and mtime; only a chunk whose mtime differs from the
  marker's (or whose marker has none) is re-hashed, and it is damaged only if its digest differs.
  A same-size overwrite within the file system's timestamp tick of the task's own write, or one
  whose mtime was set back on purpose, is not seen: `sweep run --verify` re-hashes everything;
- `FULL` (`sweep run --verify`, `sweep status --verify`): every chunk re-hashed.

Cost (`PYTHONPATH=. python benchmarks/checksum_bench.py hash`: CPU ms per page-cached file, best
of 5, this project's shared 2-core machine): a ViT-B chunk (1.86 MB) 1.3-1.4 with sha256, 0.2-0.26
with CRC32C; a DINOv2-518 chunk (90 MB) 65-66 with sha256, 11-12 with CRC32C. The start-up check of
2,000 such ViT-B chunks: 3.3 s re-hashing with sha256, 0.07-0.11 s by stat (docs/faults.md).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import google_crc32c
import zarr

Checksums = dict[str, list | None]  # relative path -> [size, digest(, mtime_ns)] or None
READ = 1 << 20
CRC32C = "crc32c:"
SIZE, STAT, FULL = "size", "stat", "full"


def _crc32c(handle) -> str:
    value = 0
    while block := handle.read(READ):
        value = google_crc32c.extend(value, block)
    return f"{CRC32C}{value:08x}"


def _sha256(handle) -> str:
    digest = hashlib.sha256()
    while block := handle.read(READ):
        digest.update(block)
    return digest.hexdigest()


def digest_of(path: Path, like: str = CRC32C) -> str | None:
    """The digest of a file in the format of `like` (`crc32c:<hex>`, or a sha256 hex digest as
    markers from before CRC32C hold), or None if the file does not exist."""
    try:
        with open(path, "rb") as handle:
            return _crc32c(handle) if like.startswith(CRC32C) else _sha256(handle)
    except FileNotFoundError:
        return None


def file_checksum(path: Path) -> list | None:
    """[size, "crc32c:<hex>", st_mtime_ns] of a file, or None if it does not exist."""
    try:
        with open(path, "rb") as handle:
            stat = os.fstat(handle.fileno())
            return [stat.st_size, _crc32c(handle), stat.st_mtime_ns]
    except FileNotFoundError:
        return None


def chunk_files(array: zarr.Array, coords: Iterable[tuple[int, ...]]) -> list[str]:
    """Paths, relative to the store root, of `array`'s chunks at `coords`."""
    return [f"{array.path}/{array.metadata.encode_chunk_key(tuple(c))}" for c in coords]


def checksums(store: str | Path, files: Iterable[str]) -> Checksums:
    """Checksum of every file (relative to `store`)."""
    return {name: file_checksum(Path(store) / name) for name in files}


@dataclass
class ChunkCheck:
    """Outcome of checking a marker's chunks: the damaged files, and the intact ones that were
    re-hashed because their mtime was not the marker's: `[size, digest, mtime_ns]` as they are
    now (what a refreshed marker records, so the next `STAT` check needs no read)."""

    damaged: list[str] = field(default_factory=list)
    rehashed: Checksums = field(default_factory=dict)


def check_chunks(store: str | Path, vouched: Mapping[str, list | None], *,
                 depth: str = FULL) -> ChunkCheck:
    """Check every vouched file at `depth` (`SIZE`, `STAT` or `FULL`, see the module)."""
    out = ChunkCheck()
    for name, expected in vouched.items():
        path = Path(store) / name
        try:
            stat = path.stat()
        except FileNotFoundError:
            stat = None
        if expected is None or stat is None:
            if (expected is None) != (stat is None):
                out.damaged.append(name)
            continue
        if stat.st_size != expected[0]:
            out.damaged.append(name)
            continue
        mtime = expected[2] if len(expected) > 2 else None
        if depth == SIZE or (depth == STAT and mtime == stat.st_mtime_ns):
            continue
        if digest_of(path, str(expected[1])) != expected[1]:
            out.damaged.append(name)
        elif mtime != stat.st_mtime_ns:
            out.rehashed[name] = [stat.st_size, expected[1], stat.st_mtime_ns]
    return out


def damaged_chunks(store: str | Path, vouched: Mapping[str, list | None], *,
                   depth: str = FULL) -> list[str]:
    """The vouched files that no longer match: missing, truncated, overwritten or new."""
    return check_chunks(store, vouched, depth=depth).damaged


def variable_of(chunk: str) -> str:
    """`vit/results/kappa` for `vit/results/kappa/c/0/0/0`."""
    return chunk.split("/c/")[0]


def scan_store(store: str | Path, *, depth: str = FULL) -> dict[str, list[str]]:
    """Every done marker of the store whose chunks no longer match: marker path -> files."""
    root = Path(store) / ".sweep" / "markers"
    out = {}
    for marker in sorted(root.rglob("*.done")):
        try:
            vouched = json.loads(marker.read_text()).get("chunks")
        except (ValueError, AttributeError):
            vouched = None  # `done` markers from before checksums vouch for nothing to check
        bad = damaged_chunks(store, vouched, depth=depth) if isinstance(vouched, dict) else []
        if bad:
            out[str(marker.relative_to(root))] = bad
    return out


def damage_message(store: str | Path, damaged: dict[str, list[str]]) -> str:
    """One line naming the damaged variables and the fix."""
    variables = sorted({variable_of(f) for files in damaged.values() for f in files})
    return (f"store {store}: damaged chunks in {', '.join(variables)} ({len(damaged)} task(s)); "
            f"rerun `sweep run` with its config to recompute them")

"""What a done marker vouches for, and whether the store still holds it.

A task that finished records, in its done marker, every chunk it wrote: the key relative to the
store's root, `[size, "crc32c:<8 hex>", version]` (`checksums`), or null (a chunk equal to the
fill value is not written, as zarr 3 skips empty chunks). The CRC32C is taken from the bytes as
zarr hands them to the store (`storage.recording`); the version is what changes when the object
is rewritten (`storage.location.ObjectInfo`): the file's `st_mtime_ns` in a local folder, the
object's ETag on an object store. Markers written before CRC32C hold `[size, "<64 hex>"]`
(sha256, no version) and verify as they always did: the digest's prefix says which hash to
recompute. The threat is accidental damage (truncation, an overwrite, a deletion, bit rot), not an
adversary: CRC32C detects every burst of up to 32 flipped bits and misses other damage with odds
of 2^-32; it is not meant to resist deliberate forgery.

Three depths of check (`damaged_chunks`), each finding a deleted chunk or one that appeared where
none was written, from one listing of the store (sizes and versions), never a request per chunk:
- `SIZE`: existence and size: what `sweep report` checks first;
- `STAT` (`sweep run` and `sweep status` at start-up): size and version; only a chunk whose
  version differs from the marker's (or whose marker has none) is read and re-hashed, and it is
  damaged only if its digest differs. On a local folder a same-size overwrite within the file
  system's timestamp tick of the task's own write, or one whose mtime was set back on purpose, is
  not seen (an object store gives every rewrite a new ETag): `--verify` re-hashes everything;
- `FULL` (`sweep run --verify`, `sweep status --verify`): every chunk re-read and re-hashed.

Cost (`PYTHONPATH=. python benchmarks/checksum_bench.py`, see benchmarks/README.md): CRC32C runs
at several GB/s; the start-up check of a 2,000-chunk store is one listing on either backend.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import zarr

from storage.layout import BOOKKEEPING_DIR
from storage.location import Location, ObjectInfo, StoreLike, locate
from storage.recording import CRC32C, crc32c_of

Checksums = dict[str, list | None]  # key -> [size, digest(, version)] or None
SIZE, STAT, FULL = "size", "stat", "full"
MARKERS = f"{BOOKKEEPING_DIR}/markers/"


def digest_of(store: StoreLike, key: str, like: str = CRC32C) -> str | None:
    """The digest of an object in the format of `like` (`crc32c:<hex>`, or a sha256 hex digest
    as markers from before CRC32C hold), or None if it does not exist."""
    data = locate(store).read(key)
    if data is None:
        return None
    return crc32c_of(data) if like.startswith(CRC32C) else hashlib.sha256(data).hexdigest()


def chunk_files(array: zarr.Array, coords: Iterable[tuple[int, ...]]) -> list[str]:
    """Keys, relative to the store root, of `array`'s chunks at `coords`."""
    return [f"{array.path}/{array.metadata.encode_chunk_key(tuple(c))}" for c in coords]


def written_by(group: zarr.Group | zarr.Array) -> Mapping[str, list | None]:
    """What the store under `group` recorded writing (`storage.recording`), or {} if its store
    records nothing."""
    return getattr(group.store, "written", {})


def checksums(store: StoreLike, files: Iterable[str],
              written: Mapping[str, list | None] | None = None) -> Checksums:
    """`[size, crc32c, version]` of every key (None if absent): the CRC32C from `written` (what
    the writer's `RecordingStore` saw) where it matches the stored size, else from a read."""
    location = locate(store)
    files = list(files)
    found = location.infos(files)
    out: Checksums = {}
    for name in files:
        info = found[name]
        if info is None:
            out[name] = None
            continue
        seen = (written or {}).get(name)
        digest = seen[1] if seen is not None and seen[0] == info.size else \
            digest_of(location, name)
        out[name] = [info.size, digest, info.version]
    return out


@dataclass
class ChunkCheck:
    """Outcome of checking a marker's chunks: the damaged keys, and the intact ones that were
    re-hashed because their version was not the marker's: `[size, digest, version]` as they are
    now (what a refreshed marker records, so the next `STAT` check needs no read)."""

    damaged: list[str] = field(default_factory=list)
    rehashed: Checksums = field(default_factory=dict)


def check_chunks(store: StoreLike, vouched: Mapping[str, list | None], *, depth: str = FULL,
                 listing: Mapping[str, ObjectInfo] | None = None) -> ChunkCheck:
    """Check every vouched key at `depth` (`SIZE`, `STAT` or `FULL`, see the module) against
    `listing` (the store's keys with sizes and versions, from `Location.listing`; default: one
    look-up per key)."""
    location = locate(store)
    found = listing if listing is not None else location.infos(vouched)
    out = ChunkCheck()
    for name, expected in vouched.items():
        info = found.get(name)
        if expected is None or info is None:
            if (expected is None) != (info is None):
                out.damaged.append(name)
            continue
        if info.size != expected[0]:
            out.damaged.append(name)
            continue
        version = expected[2] if len(expected) > 2 else None
        if depth == SIZE or (depth == STAT and version == info.version):
            continue
        if digest_of(location, name, str(expected[1])) != expected[1]:
            out.damaged.append(name)
        elif version != info.version:
            out.rehashed[name] = [info.size, expected[1], info.version]
    return out


def damaged_chunks(store: StoreLike, vouched: Mapping[str, list | None], *,
                   depth: str = FULL, listing: Mapping[str, ObjectInfo] | None = None
                   ) -> list[str]:
    """The vouched keys that no longer match: missing, truncated, overwritten or new."""
    return check_chunks(store, vouched, depth=depth, listing=listing).damaged


def variable_of(chunk: str) -> str:
    """`vit/results/kappa` for `vit/results/kappa/c/0/0/0`."""
    return chunk.split("/c/")[0]


def data_listing(location: Location) -> dict[str, ObjectInfo]:
    """Every data object of the store (not its bookkeeping) with its size and version: the one
    listing a start-up check compares markers with."""
    return {key: info for key, info in location.listing().items()
            if not key.startswith(f"{BOOKKEEPING_DIR}/")}


def read_done_markers(store: StoreLike) -> dict[str, Checksums | None]:
    """Every done marker of the store (key below `.sweep/markers/` -> its vouched chunks, None
    for a marker that vouches for none), from one listing and one read per marker."""
    location = locate(store)
    keys = [key for key in location.listing(MARKERS) if key.endswith(".done")]
    out = {}
    for key, data in location.read_many(keys).items():
        if data is None:
            continue
        out[key[len(MARKERS):]] = parse_marker(data, key)
    return out


def parse_marker(data: bytes, key: str) -> Checksums | None:
    """The chunks a done marker's text vouches for; None for a plain `done` marker (from before
    checksums); an unreadable marker vouches for itself as damaged, so every check fails."""
    text = data.decode(errors="replace")
    if text.strip() == "done":
        return None
    try:
        return dict(json.loads(text)["chunks"])
    except (ValueError, KeyError, TypeError):
        return {key: [-1, "unreadable"]}


def scan_store(store: StoreLike, *, depth: str = FULL) -> dict[str, list[str]]:
    """Every done marker of the store whose chunks no longer match: marker -> damaged keys."""
    location = locate(store)
    done = read_done_markers(location)
    listing = data_listing(location) if done else {}
    listing.update(location.listing(MARKERS) if done else {})
    out = {}
    for marker, vouched in sorted(done.items()):
        bad = damaged_chunks(location, vouched, depth=depth, listing=listing) if vouched else []
        if bad:
            out[marker] = bad
    return out


def damage_message(store: StoreLike, damaged: dict[str, list[str]]) -> str:
    """One line naming the damaged variables and the fix."""
    variables = sorted({variable_of(f) for files in damaged.values() for f in files})
    return (f"store {store}: damaged chunks in {', '.join(variables)} ({len(damaged)} task(s)); "
            f"rerun `sweep run` with its config to recompute them")

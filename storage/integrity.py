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

A compacted model (`storage.compaction`: its result arrays rewritten as a few objects, vouched for
by its `compact` marker) keeps its test markers, which then vouch for its results no more
(`still_vouched`). Which layout a result array's metadata must have is the marker's word: a
model with a compaction marker, compacted (`sharded_chunk_shape`); one without, per shard. A
document of the other layout (an older copy put back by a sync or a backup) is metadata damage
(`metadata_damage`), never a reason to read the model's values through it.

Cost (`PYTHONPATH=. python benchmarks/checksum_bench.py`, see benchmarks/README.md): CRC32C runs
at several GB/s; the start-up check of a 2,000-chunk store is one listing on either backend.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import zarr

from storage.errors import StoreDamagedError
from storage.layout import (
    BASELINE_GROUP,
    BOOKKEEPING_DIR,
    COMPACT_STAGE,
    LEGACY_ATTENTION_DIMS,
    LEGACY_BASELINE_DIMS,
    LEGACY_RESULT_DIMS,
    NULLS_GROUP,
    OPTIONAL_RESULT_VARS,
    RESULTS_GROUP,
    Shaped,
    baseline_arrays,
    compact_chunks,
    matched_arrays,
    model_arrays,
    zarr_data_type,
)
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
    """`vit/results/kappa` for `vit/results/kappa/c/0/0/0` (and a compacted `.../c.0.0.0`)."""
    return re.split(r"/c(?:/|\.\d)", chunk, maxsplit=1)[0]


def compacted_scopes(marker_keys: Iterable[str]) -> set[str]:
    """The models with a compaction marker among `marker_keys` (keys below MARKERS or the
    store's root: `<model>/compact.done`)."""
    suffix = f"/{COMPACT_STAGE}.done"
    return {key.removeprefix(MARKERS).removesuffix(suffix) for key in marker_keys
            if key.endswith(suffix)}


def still_vouched(marker: str, vouched: Checksums | None, compacted: Container[str]
                  ) -> Checksums | None:
    """What the done marker `marker` (`<scope>/<name>.done`, below MARKERS) still vouches for:
    in a compacted model (`compacted`: `compacted_scopes`), its per-shard result chunks are gone,
    replaced by the objects its compaction marker vouches for (`storage.compaction`)."""
    scope, _, name = marker.rpartition("/")
    if vouched is None or scope not in compacted or name == f"{COMPACT_STAGE}.done":
        return vouched
    results = f"{scope}/{RESULTS_GROUP}/"
    return {key: value for key, value in vouched.items() if not key.startswith(results)}


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
    compacted = compacted_scopes(done)
    for marker, vouched in sorted(done.items()):
        vouched = still_vouched(marker, vouched, compacted)
        bad = damaged_chunks(location, vouched, depth=depth, listing=listing) if vouched else []
        if bad:
            out[marker] = bad
    return out


def damage_message(store: StoreLike, damaged: dict[str, list[str]]) -> str:
    """One line naming the damaged variables and the fix."""
    variables = sorted({variable_of(f) for files in damaged.values() for f in files})
    return (f"store {store}: damaged chunks in {', '.join(variables)} ({len(damaged)} task(s)); "
            f"rerun `sweep run` with its config to recompute them")


# --- metadata: what the layout says each group and array is ----------------------------------

@dataclass(frozen=True)
class MetadataDamage:
    """A metadata document (`key`, a `zarr.json`) that is not what the layout says: `scope` is
    the model (or `baseline`) it belongs to, `group` the group whose arrays it damages (the whole
    group when its own document is the damaged one: its attributes, fingerprint included, are
    gone)."""

    scope: str
    group: str
    key: str
    reason: str
    layout: bool = False  # only its layout disagrees with the compaction marker: its values
    # are where the marker says (`storage.compaction.results` puts the document back)

    @property
    def whole_group(self) -> bool:
        return self.key == f"{self.group}/zarr.json"

    def line(self) -> str:
        return f"{self.key}: {self.reason}"


def _document(data: bytes | None, node_type: str) -> tuple[dict | None, str | None]:
    """(metadata, None), or (None, what is wrong with it)."""
    if data is None:
        return None, "missing"
    try:
        meta = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None, "not valid JSON" if data.strip() else "empty"
    if not isinstance(meta, dict) or meta.get("node_type") != node_type or \
            meta.get("zarr_format") != 3:
        return None, f"not the metadata of a Zarr v3 {node_type}"
    if not isinstance(meta.get("attributes", {}), dict):
        return None, "its attributes are not a mapping"
    return meta, None


def _chunk_shape(meta: dict) -> Any:
    grid = meta.get("chunk_grid")
    return grid.get("configuration", {}).get("chunk_shape") if isinstance(grid, dict) else None


def sharded_chunk_shape(meta: dict) -> Any:
    """The chunk shape inside the shards of an array whose codec is Zarr's sharding codec (a
    compacted result array), else None."""
    codecs = meta.get("codecs")
    first = codecs[0] if isinstance(codecs, list) and codecs else None
    if not isinstance(first, dict) or first.get("name") != "sharding_indexed":
        return None
    configuration = first.get("configuration")
    return configuration.get("chunk_shape") if isinstance(configuration, dict) else None


NOT_COMPACTED = ("the per-shard layout, but the model's compaction marker vouches for compacted "
                 "objects (an older copy of this document? a sweep run expanding the model "
                 "passes through this state)")
NOT_MARKED = ("the compacted layout, but no compaction marker vouches for it (a compaction "
              "stopped before its marker? a sweep run compacting the model passes through "
              "this state)")

LAYOUT_REASONS = (NOT_COMPACTED, NOT_MARKED)


def _array_problem(meta: dict, shaped: Shaped, legacy: tuple[tuple[str, ...], int] | None,
                   compacted: bool | None = None) -> tuple[str | None, bool]:
    """(What differs between an array's metadata and the layout's: data type, shape, chunk
    shape; whether only its layout does). `legacy`: (dims, axis) of the layout from before an
    axis was added (the head, the null), whose arrays lack that axis; `compacted`: for a result
    array, whether its model's compaction marker exists, so that its metadata must be of the
    compacted layout (`storage.layout.compact_chunks`: shards of chunks) or else per shard."""
    problem = _shape_problem(meta, shaped, legacy, compacted is not None)
    if problem is not None or compacted is None:
        return problem, False
    if (sharded_chunk_shape(meta) is not None) != compacted:
        return (NOT_COMPACTED if compacted else NOT_MARKED), True
    return None, False


def _shape_problem(meta: dict, shaped: Shaped, legacy: tuple[tuple[str, ...], int] | None,
                   compactable: bool) -> str | None:
    """What differs between an array's metadata and the layout's, of either layout when
    `compactable` (see `_array_problem`)."""
    var, shape, chunks = shaped
    if legacy is not None and tuple(meta.get("dimension_names") or ()) == legacy[0]:
        axis = legacy[1]
        shape, chunks = shape[:axis] + shape[axis + 1:], chunks[:axis] + chunks[axis + 1:]
    inner = sharded_chunk_shape(meta) if compactable else None
    layout = "the layout's"
    if inner is not None:
        layout = "the compacted layout's"
        chunks, shard = compact_chunks(shape)
        if inner != list(chunks):
            return f"sharded chunk_shape {json.dumps(inner)}, {layout} {list(chunks)}"
        chunks = shard
    expected = {"data_type": zarr_data_type(var), "shape": list(shape),
                "chunk_shape": list(chunks)}
    found = {"data_type": meta.get("data_type"), "shape": meta.get("shape"),
             "chunk_shape": _chunk_shape(meta)}
    wrong = [f"{key} {json.dumps(found[key])}, {layout} {json.dumps(expected[key])}"
             for key in expected if found[key] != expected[key]]
    return "; ".join(wrong) or None


def expected_arrays(kind: str, attrs: dict[str, Any]) -> dict[str, Shaped]:
    """The layout's arrays of a group of `kind` (model, nulls, baseline) from its attributes;
    KeyError/TypeError/ValueError if they lack what sizes them."""
    def chunks_of(a: dict[str, Any]) -> int:
        return -(-int(a["trials"]) // int(a["chunk_trials"]))

    if kind == "model":
        return model_arrays(n_inputs=int(attrs["n_inputs"]), shard_size=int(attrs["shard_size"]),
                            n_layers=int(attrs["n_layers"]), n_heads=int(attrs.get("n_heads", 1)),
                            t_max=int(attrs["t_max"]), n_sets=len(attrs["token_sets"]))
    if kind == NULLS_GROUP:
        return matched_arrays(n_nulls=len(attrs["nulls"]), n_sets=len(attrs["token_sets"]),
                              n_chunks=chunks_of(attrs))
    return baseline_arrays(n_nulls=len(attrs.get("nulls", ["uniform"])),
                           n_sizes=len(attrs["sizes"]), n_chunks=chunks_of(attrs))


def _optional(kind: str, name: str, attrs: dict[str, Any]) -> bool:
    """Whether a group of a store written before `name` existed may lack it."""
    if kind == "model":
        return name in ("input_digest", *(f"{RESULTS_GROUP}/{v}" for v in OPTIONAL_RESULT_VARS)) \
            or (name == "head" and "n_heads" not in attrs)
    return kind == BASELINE_GROUP and name == "null" and "nulls" not in attrs


def _legacy_axis(kind: str, name: str) -> tuple[tuple[str, ...], int] | None:
    """(dims, axis) of an array of an older layout that lacks `axis` (the head, the null)."""
    if kind == "model" and name.startswith(f"{RESULTS_GROUP}/"):
        return LEGACY_RESULT_DIMS, 2
    if kind == "model" and name == "attention":
        return LEGACY_ATTENTION_DIMS, 2
    if kind == BASELINE_GROUP and name in ("holding", "trials", "disagreements"):
        return LEGACY_BASELINE_DIMS, 0
    return None


def _group_problem(kind: str, data: bytes | None) -> tuple[str | None, dict[str, Any] | None]:
    """(what is wrong with a group's document, or None; its attributes when its arrays can be
    checked: a finished group, i.e. one with a fingerprint)."""
    meta, problem = _document(data, "group")
    attrs = (meta or {}).get("attributes", {})
    if problem is not None or "fingerprint" not in attrs:
        return problem, None  # no fingerprint: unfinished, `sweep run` rebuilds it whole
    try:
        expected_arrays(kind, attrs)
    except (KeyError, TypeError, ValueError) as error:
        return f"its attributes lack what sizes its arrays ({error})", None
    return None, attrs


def metadata_damage(store: StoreLike, models: Iterable[str], *, arrays: bool = True
                    ) -> list[MetadataDamage]:
    """Every metadata document of `models`' groups (their results and size-matched nulls groups)
    and of the baseline that is not what `storage.layout` says: unreadable, not a group or an
    array, a group without the attributes that size it, an array whose data type, shape or chunk
    shape differ from the layout's for its group's attributes (stores of an older layout
    accepted), a result array whose layout is not the one its model's compaction marker says
    (`MetadataDamage.layout`). Read-only, a few rounds of concurrent reads; `arrays=False`
    checks the groups' own documents only (the models', their nulls', the baseline's). A group
    whose document is missing is not damage here (a deleted group: `sweep status` calls it
    missing)."""
    location = locate(store)
    out: list[MetadataDamage] = []
    checked: list[tuple[str, str, str, dict[str, Any]]] = []  # (kind, scope, path, attrs)

    def groups(paths: dict[str, tuple[str, str]]) -> None:  # path -> (kind, scope)
        docs = location.read_many(f"{path}/zarr.json" for path in paths)
        for path, (kind, scope) in paths.items():
            data = docs[f"{path}/zarr.json"]
            if data is None:
                continue
            problem, attrs = _group_problem(kind, data)
            if problem is not None:
                out.append(MetadataDamage(scope, path, f"{path}/zarr.json", problem))
            elif attrs is not None:
                checked.append((kind, scope, path, attrs))

    groups({**{name: ("model", name) for name in models},
            BASELINE_GROUP: (BASELINE_GROUP, BASELINE_GROUP)})
    groups({f"{path}/{NULLS_GROUP}": (NULLS_GROUP, scope)
            for kind, scope, path, _ in list(checked) if kind == "model"})
    if not arrays:
        return out
    models_checked = [(scope, path) for kind, scope, path, _ in checked if kind == "model"]
    results = location.read_many(f"{path}/{RESULTS_GROUP}/zarr.json" for _, path in models_checked)
    for scope, path in models_checked:
        key = f"{path}/{RESULTS_GROUP}/zarr.json"
        problem = _document(results[key], "group")[1]
        if problem is not None:
            out.append(MetadataDamage(scope, path, key, problem))
    expected = {(kind, scope, path, f"{path}/{name}/zarr.json", name): (shaped, attrs)
                for kind, scope, path, attrs in checked
                for name, shaped in expected_arrays(kind, attrs).items()}
    docs = location.read_many(key for _, _, _, key, _ in expected)
    marked = location.infos(compact_marker(scope) for scope, _ in models_checked)
    for (kind, scope, path, key, name), (shaped, attrs) in expected.items():
        if docs[key] is None and _optional(kind, name, attrs):
            continue
        meta, problem = _document(docs[key], "array")
        layout = False
        if meta is not None:
            result = kind == "model" and name.startswith(f"{RESULTS_GROUP}/")
            problem, layout = _array_problem(
                meta, shaped, _legacy_axis(kind, name),
                marked[compact_marker(scope)] is not None if result else None)
        if problem is not None:
            out.append(MetadataDamage(scope, path, key, problem, layout))
    return out


def compact_marker(model: str) -> str:
    """The key of `model`'s compaction marker (`storage.compaction`)."""
    return f"{MARKERS}{model}/{COMPACT_STAGE}.done"


def metadata_message(store: StoreLike, damage: list[MetadataDamage]) -> str:
    """One line naming the damaged metadata documents and the fix."""
    shown = "; ".join(d.line() for d in damage[:3]) + ("; ..." if len(damage) > 3 else "")
    fix = "repair it" if all(d.layout for d in damage) else \
        "recreate it and recompute what it held"
    return (f"store {store}: damaged metadata ({len(damage)} document(s)): {shown}; rerun "
            f"`sweep run` with its config to {fix}")


def check_metadata(store: StoreLike, models: Iterable[str]) -> None:
    """StoreDamagedError (one line) if `metadata_damage` finds anything."""
    damage = metadata_damage(store, models)
    if damage:
        raise StoreDamagedError(metadata_message(store, damage))

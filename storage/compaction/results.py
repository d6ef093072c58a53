"""A finished model's result arrays as a few objects: Zarr's sharding codec, written once.

While a model is tested, each result array has one chunk per shard (`storage.layout`): every
test task writes its own chunks, so concurrent writers never share an object. At 50,000 inputs
and `shard_size: 32` that is 1,563 objects per array and about 30,000 per model, which every
listing, `sweep status` and query pays for on an object store. Once every test task of a model
is done, `compact_model` (the driver, holding the store lock, after the run's tasks: no other
writer) rewrites each result array with the sharding codec, chunks and shards of
`storage.layout.compact_chunks` (one object per array up to 8 Mi cells), in this order:

1. per array, its shard objects (keys `c.<i>.0.0.0`, which no per-shard chunk has), then its
   metadata document (one PUT): a reader sees the old layout or the new one, the same values;
2. the marker `.sweep/markers/<model>/compact.done`, vouching for the shard objects like any done
   marker (size, CRC32C, version: `storage.integrity`); from then on it, not the test markers,
   vouches for the model's results (`storage.integrity.still_vouched`);
3. the per-shard chunks are deleted.

A run killed in 1 left no marker: the next run puts the per-shard metadata back (`revert_unmarked`:
the per-shard chunks are all still there, the compacted objects are deleted) and compacts again
from them. Killed in 3: the next run's `compact_model` deletes what is left. So a resumed run
writes the same objects as an uninterrupted one (the encoding is deterministic).

The marker, never a metadata document, says where a model's values are: with it, in the
compacted objects it vouches for (a per-shard document, e.g. an older copy put back by a sync,
gets the compacted metadata back: `restore_compacted`); without it, in the per-shard chunks the
test markers vouch for. Nothing is compacted from per-shard chunks that are not all there
(`unread_results`: zarr would read the missing ones as fill values), and compacted objects no
marker vouches for are deleted only while the per-shard chunks are all there.

A compacted model some of whose shards must be tested again (a damaged compacted object, inputs
changed, attention re-extracted) is expanded before any task runs (`expand_model`): the values of
every shard whose test stays done are written back as per-shard chunks, then the per-shard
metadata, then the marker and the compacted objects are deleted. The test markers of the shards
a damaged object held are cleared first (`lost_shards`), so those shards are tested again. A
run killed while expanding leaves the marker: the next run puts the compacted metadata back and
expands again (or, with no test to rerun, keeps it compacted). At the end of that run the model
is compacted again.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import zarr
from zarr.core.buffer import cpu

from storage.integrity import SIZE, STAT, Checksums, check_chunks, parse_marker, sharded_chunk_shape
from storage.layout import (
    COMPACT_SEPARATOR,
    COMPACT_STAGE,
    RESULT_VARS,
    RESULTS_GROUP,
    compact_chunks,
)
from storage.location import Location, StoreLike, locate
from storage.markers import clear, mark_done, marker_key, vouched_chunks
from storage.recording import crc32c_of
from storage.store import open_root

INDEX_CODECS = [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]
"""The shard index's codecs (zarr's default): a damaged index is found when it is read."""


def result_documents(store: StoreLike, model: str) -> dict[str, dict[str, Any]]:
    """Array path -> metadata document of every result array of `model` that exists and parses."""
    location = locate(store)
    paths = [f"{model}/{RESULTS_GROUP}/{name}" for name in RESULT_VARS]
    docs = location.read_many(f"{path}/zarr.json" for path in paths)
    out = {}
    for path in paths:
        data = docs[f"{path}/zarr.json"]
        try:
            doc = json.loads(data) if data is not None else None
        except ValueError:
            continue  # damaged: `storage.integrity.metadata_damage` names it
        if isinstance(doc, dict) and doc.get("node_type") == "array":
            out[path] = doc
    return out


def is_compacted(doc: dict[str, Any]) -> bool:
    """Whether an array's metadata document is of the compacted layout (sharding codec)."""
    return sharded_chunk_shape(doc) is not None


def compacted_document(doc: dict[str, Any]) -> dict[str, Any]:
    """The metadata of a per-shard result array (`doc`) in the compacted layout: the same data
    type, fill value, attributes, dimension names and chunk codecs, inside shards."""
    chunks, shard = compact_chunks(tuple(doc["shape"]))
    return {**doc,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(shard)}},
            "chunk_key_encoding": {"name": "default",
                                   "configuration": {"separator": COMPACT_SEPARATOR}},
            "codecs": [{"name": "sharding_indexed", "configuration": {
                "chunk_shape": list(chunks), "codecs": doc["codecs"],
                "index_codecs": INDEX_CODECS, "index_location": "end"}}]}


def per_shard_document(doc: dict[str, Any], shard_size: int) -> dict[str, Any]:
    """The inverse of `compacted_document`: one chunk per shard of `shard_size` inputs."""
    return {**doc,
            "chunk_grid": {"name": "regular", "configuration": {
                "chunk_shape": [shard_size, *doc["shape"][1:]]}},
            "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
            "codecs": doc["codecs"][0]["configuration"]["codecs"]}


def _dumps(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, indent=2).encode()


def _encoded(doc: dict[str, Any], blocks: Iterable[tuple[slice, np.ndarray]],
             write_empty: bool) -> Iterator[dict[str, bytes]]:
    """Per block (a region along `input` and its values), the objects (key below the array ->
    bytes) an array of metadata `doc` stores for it, encoded in memory by zarr itself.
    `write_empty`: also the objects equal to the fill value (zarr leaves those out by default,
    as the test tasks' writes did)."""
    memory: dict[str, Any] = {}
    store = zarr.storage.MemoryStore(store_dict=memory)
    memory["zarr.json"] = cpu.Buffer.from_bytes(_dumps(doc))
    array = zarr.open_array(store, mode="r+").with_config({"write_empty_chunks": write_empty})
    for region, values in blocks:
        array[region] = values
        yield {key: memory.pop(key).to_bytes() for key in list(memory) if key != "zarr.json"}


def _put(location: Location, path: str, objects: dict[str, bytes],
         written: dict[str, list]) -> None:
    for key, data in objects.items():
        location.write(f"{path}/{key}", data)
        written[f"{path}/{key}"] = [len(data), crc32c_of(data)]


def _delete_objects(location: Location, path: str, *, compacted: bool) -> None:
    """Delete the chunk objects of the array at `path` of one layout: the compacted ones
    (`c.<i>...`) or the per-shard ones (`c/<i>/...`)."""
    if not compacted:
        location.delete_prefix(f"{path}/c/")
        return
    for key in location.listing(f"{path}/"):
        if key[len(path) + 1:].startswith(f"c{COMPACT_SEPARATOR}"):
            location.delete(key)


def is_marked(store: StoreLike, model: str) -> bool:
    """Whether `model`'s compaction marker exists (its results are vouched for by it)."""
    return locate(store).info(marker_key(model, COMPACT_STAGE)) is not None


def unread_results(store: StoreLike, model: str, test_markers: Iterable[str]) -> list[str]:
    """The test markers of `model` (names, `test-<i>`) whose per-shard result chunks are not all
    in the store at the sizes they record (one listing): what reading them would give is fill
    values, never the results (a marker from before checksums cannot be checked)."""
    location = locate(store)
    names = list(test_markers)
    keys = [marker_key(model, name) for name in names]
    texts = location.read_many(keys)
    prefix = f"{model}/{RESULTS_GROUP}/"
    listing = location.listing(prefix)
    out = []
    for name, key in zip(names, keys, strict=True):
        data = texts[key]
        vouched = (parse_marker(data, key) if data is not None else None) or {}
        results = {k: v for k, v in vouched.items() if k.startswith(prefix)}
        if check_chunks(location, results, depth=SIZE, listing=listing).damaged:
            out.append(name)
    return out


def revert_unmarked(store: StoreLike, model: str, shard_size: int,
                    test_markers: Iterable[str]) -> list[str]:
    """For a model without a compaction marker (a compaction killed before it, or the marker
    lost), put back the per-shard metadata of every result array of the compacted layout, and
    delete its compacted objects only when the per-shard chunks that `test_markers` vouch for
    are all there (a compaction killed before its marker never deleted them): compacted objects
    that no marker vouches for may be the only copy left, so they stay (unread; the next
    compaction overwrites them) while the tests whose chunks are gone run again. Returns the
    arrays reverted."""
    location = locate(store)
    switched = [(path, doc) for path, doc in result_documents(location, model).items()
                if is_compacted(doc)]
    whole = not switched or not unread_results(location, model, test_markers)
    for path, doc in switched:
        location.write(f"{path}/zarr.json", _dumps(per_shard_document(doc, shard_size)))
        if whole:
            _delete_objects(location, path, compacted=True)
    return [path for path, _ in switched]


def restore_compacted(store: StoreLike, model: str) -> list[str]:
    """For a model with a compaction marker, put back the compacted metadata of every result
    array whose document is per shard (an older copy restored, or an expansion killed before
    the marker was cleared): the marker vouches for the compacted objects, which hold its
    values (`lost_shards` checks them). Returns the arrays restored."""
    location = locate(store)
    restored = []
    for path, doc in result_documents(location, model).items():
        if not is_compacted(doc):
            location.write(f"{path}/zarr.json", _dumps(compacted_document(doc)))
            restored.append(path)
    return restored


def compact_model(store: StoreLike, model: str, shard_size: int,
                  test_markers: Sequence[str]) -> bool:
    """Rewrite every result array of `model` (all of its test tasks done: `test_markers`) in
    the compacted layout, mark it, delete the per-shard chunks (see the module); on a model
    already marked, finish what a killed run left (the compacted metadata put back where a
    document is per shard, leftover per-shard chunks deleted). False, and nothing written, when
    a test's per-shard chunks are not all there (`unread_results`): compacting would keep fill
    values in their place. Call under the store lock, with no task running."""
    location = locate(store)
    if is_marked(location, model):
        restore_compacted(location, model)
        for path in result_documents(location, model):
            _delete_objects(location, path, compacted=False)
        return True
    revert_unmarked(location, model, shard_size, test_markers)
    if unread_results(location, model, test_markers):
        return False
    root = open_root(location)
    written: dict[str, list] = {}
    for path, doc in result_documents(location, model).items():
        source = root[path]
        new = compacted_document(doc)
        rows, n = new["chunk_grid"]["configuration"]["chunk_shape"][0], source.shape[0]
        blocks = ((slice(a, min(a + rows, n)), source[a:min(a + rows, n)])
                  for a in range(0, n, rows))
        for objects in _encoded(new, blocks, write_empty=True):
            _put(location, path, objects, written)
        location.write(f"{path}/zarr.json", _dumps(new))
    infos = location.infos(written)
    sums: Checksums = {key: [*written[key], info.version] if info is not None else None
                       for key, info in infos.items()}
    mark_done(location, model, COMPACT_STAGE, sums)
    for path in result_documents(location, model):
        _delete_objects(location, path, compacted=False)
    return True


def lost_shards(store: StoreLike, model: str, shard_size: int, n_inputs: int, *,
                depth: str = STAT, listing: dict | None = None) -> set[int]:
    """The shards of a compacted model whose results a damaged (missing, resized, rewritten)
    compacted object held, checked at `depth` against `listing` (`storage.integrity`); every
    shard if its marker is unreadable. Intact objects re-hashed get their versions refreshed in
    the marker, as `sweep run` does for task markers."""
    location = locate(store)
    vouched = vouched_chunks(location, model, COMPACT_STAGE) or {}
    check = check_chunks(location, vouched, depth=depth, listing=listing)
    n_shards = -(-n_inputs // shard_size)
    lost: set[int] = set()
    for key in check.damaged:
        name = key.rpartition("/")[2]
        if not name.startswith(f"c{COMPACT_SEPARATOR}") or key not in vouched:
            return set(range(n_shards))  # the marker itself does not read
        path = key.rpartition("/")[0]
        rows = compact_chunks(_shape(location, path, n_inputs))[1][0]
        first = int(name.split(COMPACT_SEPARATOR)[1]) * rows
        last = min(first + rows, n_inputs)
        lost.update(range(first // shard_size, -(-last // shard_size)))
    if check.rehashed and not check.damaged:
        mark_done(location, model, COMPACT_STAGE, vouched | check.rehashed)
    return lost


def _shape(location: Location, path: str, n_inputs: int) -> tuple[int, ...]:
    """The shape of the array at `path`, from its metadata (the group's n_inputs by one if that
    is unreadable: the layout's rows per shard depend on the shape's other axes)."""
    data = location.read(f"{path}/zarr.json")
    try:
        return tuple(json.loads(data)["shape"])
    except (TypeError, ValueError, KeyError):
        return (n_inputs,)


def expand_model(store: StoreLike, model: str, shard_size: int, keep: Sequence[int]) -> None:
    """Back to one chunk per shard (see the module): the values of the shards `keep` (whose
    tests stay done) written as per-shard chunks, then the per-shard metadata, then the marker
    and the compacted objects deleted. Under the store lock, before any task runs."""
    location = locate(store)
    restore_compacted(location, model)  # the values are read from the objects the marker
    root = open_root(location)  # vouches for, whatever a document says (a killed expansion)
    for path, doc in result_documents(location, model).items():
        source = root[path]
        n = source.shape[0]
        blocks = ((slice(s * shard_size, min(s * shard_size + shard_size, n)),
                   source[s * shard_size:min(s * shard_size + shard_size, n)]) for s in keep)
        for objects in _encoded(per_shard_document(doc, shard_size), blocks, write_empty=False):
            _put(location, path, objects, {})
        location.write(f"{path}/zarr.json", _dumps(per_shard_document(doc, shard_size)))
    clear(location, model, COMPACT_STAGE)
    for path in result_documents(location, model):
        _delete_objects(location, path, compacted=True)

"""Create a sweep store from its template once, then let tasks write aligned regions.

The driver (holding the store lock) calls `ensure_model` / `ensure_baseline` / `write_root_attrs`
before any task runs: every array exists, with its final shape, before the first chunk is
written. Tasks then write only chunks they own: a shard owns whole `n_tokens`, `token_kind` and
`results` chunks (chunked by `shard_size` inputs) and whole `attention` chunks (one input each,
every layer and head);
a baseline task owns one (size, chunk) cell. A group's `fingerprint` attribute is written last,
so a group without one was never finished and is rebuilt.

Root attributes: `format` and `versions` are written once, at creation; `config`, `models` and
`fingerprint` (per group) are rewritten by the driver, under the lock, before each run's tasks,
so they describe the latest run of a store that grows as models are added.

Consolidated metadata is there for other readers only, and only while no run is changing the
store: `drop_consolidated` removes it from the root's zarr.json at the start of every run (under
the lock, before any group is created or any attribute written), `consolidate` writes it at the
end of a run whose tasks all came back. So plain `xr.open_datatree(store, engine="zarr")` reads
one document instead of listing the root (where the `.sweep` bookkeeping folder is no Zarr node:
zarr warns), and a run killed midway leaves no stale copy, only a store read by listing. Every
reader and writer of this project opens the store with `use_consolidated=False`: it always sees
the metadata as written.
"""

from __future__ import annotations

import asyncio
import json
import warnings
from collections.abc import Callable, Coroutine, Mapping, Sequence
from importlib import metadata
from typing import Any

import numpy as np
import zarr
from zarr.core.buffer import default_buffer_prototype
from zarr.core.common import concurrent_map
from zarr.core.sync import sync

from storage.errors import InputError, StoreDamagedError
from storage.fingerprint import describe_changes, fingerprint
from storage.layout import (
    BASELINE_GROUP,
    BOOKKEEPING_DIR,
    DEVICE_ROLLOUT,
    DEVICE_ROLLOUT_VAR,
    FORMAT,
    LEGACY_ATTENTION_DIMS,
    LEGACY_RESULT_DIMS,
    MEAN_HEAD,
    NULLS_GROUP,
    OPTIONAL_RESULT_VARS,
    RESULT_VARS,
    RESULTS_GROUP,
    Shaped,
    Var,
    baseline_arrays,
    matched_arrays,
    model_arrays,
)
from storage.location import Location, StoreLike, describe_object_error, locate, redact_url
from storage.recording import RecordingStore

VERSIONED = (
    "dobrushin-sweep", "numpy", "zarr", "torch", "transformers", "timm",
    "rtdl_revisiting_models", "distributed", "numba",
)


class StoreMismatchError(InputError):
    """The store was built by a config that gives different results."""


def library_versions() -> dict[str, str]:
    """Installed versions of the libraries that shape the results ('absent' if not installed)."""
    versions = {}
    for name in VERSIONED:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "absent"
    return versions


def open_root(store: StoreLike, mode: str = "r") -> zarr.Group:
    """The store's root group; InputError if `store` is not a sweep store. A writable root
    (`r+`, `a`) records the checksums of what it writes (`storage.integrity.written_by`)."""
    location = locate(store)
    try:
        root = zarr.open_group(_zarr_store(location, mode), mode=mode, zarr_format=3,
                               use_consolidated=False)
    except (FileNotFoundError, zarr.errors.GroupNotFoundError):
        raise InputError(f"{location}: not a sweep store (no Zarr group there)") from None
    except (ValueError, TypeError, KeyError) as error:  # JSON or metadata that does not parse
        raise StoreDamagedError(
            f"{location}: its root metadata zarr.json is corrupt "
            f"({type(error).__name__}); restore it from a backup, or use a new store"
        ) from None
    except Exception as error:  # an object store's endpoint, credentials or bucket
        if location.is_local:
            raise
        raise describe_object_error(location.ref, "zarr.json", error) from None
    if mode in ("r", "r+") and root.attrs.get("format") != FORMAT:
        raise InputError(f"{location}: not a sweep store (root attribute format is not {FORMAT})")
    return root


def _zarr_store(location: Location, mode: str) -> Any:
    """zarr's store for `location`: read-only for `r`, else recording what it writes."""
    if mode == "r":
        return location.zarr_store(read_only=True)
    return RecordingStore(location.zarr_store(), location)


CREATING = f"{BOOKKEEPING_DIR}/creating"
"""Written by the run that creates a store before anything else (`storage.lock`), deleted once
the root's `config` is written (`write_root_attrs`): a store holding it was never finished."""


def unfinished_creation(store: StoreLike, names: Sequence[str]) -> bool:
    """Whether `store` holds only what an interrupted creation of a sweep store leaves (Ctrl-C
    while planning, a cleanup cut short): no root metadata, no done marker, and besides the
    bookkeeping either the creation marker (CREATING) or nothing but the metadata documents
    (`zarr.json`) of groups named `names` (the config's models and the baseline). Such a store
    holds no result: a rerun deletes it and creates it again (`create_root`)."""
    location = locate(store)
    if location.read("zarr.json") is not None:
        return False
    keys = _some_keys(location)
    if any(key.startswith(f"{BOOKKEEPING_DIR}/markers/") and key.endswith(".done")
           for key in keys):
        return False
    data = [key for key in keys if not key.startswith(f"{BOOKKEEPING_DIR}/")]
    if CREATING in keys:
        return True
    groups = {*names, BASELINE_GROUP}
    return bool(data) and all(key.split("/")[0] in groups and key.endswith("/zarr.json")
                              for key in data)


def _data_keys(location: Location) -> list[str]:
    return [key for key in _some_keys(location) if not key.startswith(f"{BOOKKEEPING_DIR}/")]


def create_root(store: StoreLike, names: Sequence[str] = ()) -> zarr.Group:
    """Open the store's root, creating it (format, library versions) when it does not exist;
    what an interrupted creation left (`unfinished_creation`, `names`: the config's models) is
    deleted first."""
    location = locate(store)
    if location.read("zarr.json") is None and _data_keys(location):
        if not unfinished_creation(location, names):
            raise InputError(f"{store}: a folder that is not a sweep store; choose another "
                             f"store path")
        for top in sorted({key.split("/")[0] for key in _data_keys(location)}):
            location.delete_prefix(f"{top}/")
    root = open_root(location, mode="a")
    if "format" not in root.attrs:
        root.attrs.update({"format": FORMAT, "versions": library_versions()})
    elif root.attrs["format"] != FORMAT:
        raise InputError(f"{store}: a Zarr store of another format ({root.attrs['format']})")
    return root


CONSOLIDATED = "consolidated_metadata"  # the root zarr.json's key for it (zarr-python's)


def drop_consolidated(store: StoreLike) -> bool:
    """Remove the consolidated metadata from the root's zarr.json (driver, under the lock, before
    a run changes anything); True if there was some. A store without a root is left alone."""
    location = locate(store)
    raw = location.read("zarr.json")
    if raw is None:
        return False
    document = json.loads(raw)
    if document.get(CONSOLIDATED) is None:
        return False
    del document[CONSOLIDATED]
    location.write("zarr.json", json.dumps(document, indent=2).encode())
    return True


def consolidate(store: StoreLike) -> None:
    """Write the metadata of every group and array into the root's zarr.json (driver, under the
    lock, after a run's tasks): the `.sweep` folder, which is no Zarr node, is left out."""
    location = locate(store)
    with warnings.catch_warnings():  # the `.sweep` folder, and zarr's note that consolidated
        # metadata is not in the v3 specification yet (xarray and zarr read it all the same)
        warnings.filterwarnings("ignore", message=".*not recognized as a component",
                                category=zarr.errors.ZarrUserWarning)
        warnings.filterwarnings("ignore", message="Consolidated metadata is currently not part",
                                category=UserWarning)
        zarr.consolidate_metadata(location.zarr_store(), zarr_format=3)


def _some_keys(location: Location) -> list[str]:
    """The store's keys, for telling an empty place from one holding something else."""
    return list(location.listing()) if location.any_key("") else []


def _create(group: zarr.Group, name: str, var: Var, shape: tuple[int, ...],
            chunks: tuple[int, ...]) -> zarr.Array:
    dtype = str if var.dtype == "str" else var.dtype
    return group.create_array(
        name, shape=shape, chunks=chunks, dtype=dtype, fill_value=var.fill,
        dimension_names=var.dims, attributes={"doc": var.doc},
        **({} if var.compressed else {"compressors": None}),
    )


def _check_fingerprint(store: StoreLike, what: str, group: zarr.Group,
                       inputs: dict[str, Any], key_prefix: str) -> None:
    stored = group.attrs.get("fingerprint_inputs", {})
    if group.attrs["fingerprint"] != fingerprint(inputs):
        changes = "; ".join(f"{key_prefix}{line}" for line in describe_changes(stored, inputs))
        raise StoreMismatchError(
            f"store {store}: {what} was computed with a different config ({changes}); "
            f"restore those settings, or use a new store"
        )


def location_of(group: zarr.Group) -> Location:
    """The `Location` of a group opened writable by `open_root` / `open_model`."""
    location = getattr(group.store, "location", None)
    if location is None:
        raise ValueError(f"group {group.path!r} was not opened for writing by storage.store")
    return location


def _reset_if_unfinished(root: zarr.Group, name: str) -> bool:
    """True if the group is complete; an unfinished one (no fingerprint) is deleted."""
    if name not in root:
        return False
    if "fingerprint" in root[name].attrs:
        return True
    location_of(root).delete_prefix(f"{root.path}/{name}".lstrip("/") + "/")
    return False


def ensure_model(root: zarr.Group, name: str, *, input_ids: Sequence[str], n_layers: int,
                 t_max: int, shard_size: int, token_sets: Sequence[str], attrs: Mapping[str, Any],
                 fingerprint_inputs: dict[str, Any],
                 heads: Sequence[str] = (MEAN_HEAD,), device_rollout: bool = False) -> bool:
    """Create model group `name` with every array, or check the existing one's fingerprint.

    `heads`: the `head` coordinate (`storage.layout.head_labels`), one map per layer and label.
    `device_rollout`: also the DEVICE_ROLLOUT array (`rollout_device: extraction`).
    Returns True if the group was created now. Raises StoreMismatchError naming what changed.
    """
    if _reset_if_unfinished(root, name):
        _check_fingerprint(location_of(root), f"model {name!r}", root[name], fingerprint_inputs,
                           f"models.{name}.")
        return False
    n, h = len(input_ids), len(heads)
    group = root.create_group(name)
    group.create_group(RESULTS_GROUP)
    for path, (var, shape, chunks) in model_arrays(
            n_inputs=n, shard_size=shard_size, n_layers=n_layers, n_heads=h, t_max=t_max,
            n_sets=len(token_sets)).items():
        parent, _, var_name = path.rpartition("/")
        _create(group[parent] if parent else group, var_name, var, shape, chunks)
    group["input_id"][:] = np.asarray(input_ids, dtype=str)
    group["head"][:] = np.asarray(heads, dtype=str)
    if device_rollout:
        s = len(token_sets)
        _create(group, DEVICE_ROLLOUT, DEVICE_ROLLOUT_VAR, (n, n_layers, h, s),
                (shard_size, n_layers, h, s))
    group.attrs.update({
        **attrs,
        "n_layers": n_layers, "n_heads": h, "t_max": t_max, "token_sets": list(token_sets),
        "shard_size": shard_size, "n_inputs": n, "n_shards": -(-n // shard_size),
        "fingerprint_inputs": fingerprint_inputs,
    })
    group.attrs["fingerprint"] = fingerprint(fingerprint_inputs)
    return True


def ensure_baseline(root: zarr.Group, *, sizes: Sequence[int], trials: int, seed: int,
                    chunk_trials: int, n_chunks: int, tol: float,
                    nulls: Sequence[str] = ("uniform",)) -> bool:
    """Create the baseline group (null, size, chunk), or check the existing one's fingerprint.
    True if created now."""
    inputs = {"sizes": list(sizes), "trials": trials, "seed": seed, "chunk_trials": chunk_trials,
              "tol": tol, "nulls": list(nulls)}
    if _reset_if_unfinished(root, BASELINE_GROUP):
        _check_fingerprint(location_of(root), "the baseline", root[BASELINE_GROUP], inputs,
                           "baseline.")
        return False
    group = root.create_group(BASELINE_GROUP)
    for var_name, (var, shape, chunks) in baseline_arrays(
            n_nulls=len(nulls), n_sizes=len(sizes), n_chunks=n_chunks).items():
        _create(group, var_name, var, shape, chunks)
    group["n"][:] = np.asarray(sizes, dtype=np.int64)
    group["null"][:] = np.asarray(nulls, dtype=str)
    group.attrs.update({**inputs, "fingerprint_inputs": inputs})
    group.attrs["fingerprint"] = fingerprint(inputs)
    return True


CONTENT_PAIRS_NULL = "T x T, pairs of |C| full rows"  # how a content-pairs null is drawn


def matched_nulls_inputs(*, nulls: Sequence[str], token_sets: Sequence[str], trials: int,
                         seed: int, chunk_trials: int, tol: float) -> dict[str, Any]:
    """The fingerprint inputs of a model's size-matched nulls group (`ensure_matched_nulls`)."""
    inputs = {"nulls": list(nulls), "token_sets": list(token_sets), "trials": trials,
              "seed": seed, "chunk_trials": chunk_trials, "tol": tol}
    if "content-pairs" in token_sets:  # drawn as read since issue 20: older counts differ
        inputs["content_pairs_null"] = CONTENT_PAIRS_NULL
    return inputs


def ensure_matched_nulls(root: zarr.Group, model: str, *, nulls: Sequence[str],
                         token_sets: Sequence[str], trials: int, seed: int, chunk_trials: int,
                         n_chunks: int, tol: float) -> bool:
    """Create `/<model>/nulls` (null, token_set, chunk), or check its fingerprint. True if
    created now. The model group must exist; its own fingerprint is not touched."""
    inputs = matched_nulls_inputs(nulls=nulls, token_sets=token_sets, trials=trials, seed=seed,
                                  chunk_trials=chunk_trials, tol=tol)
    parent = root[model]
    if _reset_if_unfinished(parent, NULLS_GROUP):
        _check_fingerprint(location_of(root), f"the size-matched nulls of model {model!r}",
                           parent[NULLS_GROUP], inputs, "matched_nulls.")
        return False
    group = parent.create_group(NULLS_GROUP)
    for var_name, (var, shape, chunks) in matched_arrays(
            n_nulls=len(nulls), n_sets=len(token_sets), n_chunks=n_chunks).items():
        _create(group, var_name, var, shape, chunks)
    group["null"][:] = np.asarray(nulls, dtype=str)
    group.attrs.update({**inputs, "fingerprint_inputs": inputs})
    group.attrs["fingerprint"] = fingerprint(inputs)
    return True


def redacted(value: Any) -> Any:
    """`value` (JSON data) with the userinfo of every URL in its strings hidden
    (`storage.location.redact_url`): no credential is written, whatever reached the config."""
    if isinstance(value, str):
        return redact_url(value)
    if isinstance(value, dict):
        return {key: redacted(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [redacted(item) for item in value]
    return value


def write_root_attrs(root: zarr.Group, config: dict[str, Any]) -> None:
    """Record the resolved config (URLs' userinfo hidden: `redacted`), the model names and every
    group's fingerprint (driver only)."""
    config = redacted(config)
    names = list(root.attrs.get("models", []))
    location = getattr(root.store, "location", None)  # None: a group zarr opened (tests)
    before = root.attrs.get("fingerprint", {})
    groups = {name: group_attrs(location, name) if location is not None else
              dict(root[name].attrs) if name in root else None
              for name in dict.fromkeys([*names, *config.get("models", {}), BASELINE_GROUP])}
    names += [name for name in config.get("models", {}) if name not in names and groups[name]]
    # a group whose metadata is unreadable (a model no longer configured) keeps its record
    fingerprints = {name: (groups[name] or {}).get("fingerprint", before.get(name))
                    for name in names}
    if groups[BASELINE_GROUP]:
        fingerprints[BASELINE_GROUP] = groups[BASELINE_GROUP]["fingerprint"]
    root.attrs.update({"config": config, "models": names, "fingerprint": fingerprints})
    if location is not None:
        location.delete(CREATING)  # the store's creation is finished


def group_attrs(store: StoreLike, path: str) -> dict[str, Any] | None:
    """The attributes of the group at `path` (read from its metadata document, not through
    zarr), or None if it is absent or its document is not a group's (damaged metadata:
    `storage.integrity.metadata_damage` names it; `sweep run` recreates it)."""
    data = locate(store).read(f"{path}/zarr.json")
    try:
        meta = json.loads(data.decode("utf-8")) if data is not None else None
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(meta, dict) or meta.get("node_type") != "group":
        return None
    attrs = meta.get("attributes", {})
    return attrs if isinstance(attrs, dict) else None


def recreate_array(group: zarr.Group, path: str, shaped: Shaped,
                   values: np.ndarray | None = None) -> None:
    """Create the array at `path` inside `group` afresh as `shaped` (`storage.layout`) after
    deleting whatever was there (its metadata and chunks), and write `values` (a coordinate
    array's) if given: the repair of an array whose metadata was damaged."""
    location_of(group).delete_prefix(f"{group.path}/{path}".strip("/") + "/")
    parent, _, name = path.rpartition("/")
    array = _create(group[parent] if parent else group, name, *shaped)
    if values is not None:
        array[:] = values


def recreate_group(parent: zarr.Group, name: str) -> zarr.Group:
    """An empty group `name` inside `parent` in place of whatever was there."""
    location_of(parent).delete_prefix(f"{parent.path}/{name}".strip("/") + "/")
    return parent.create_group(name)


def stored_model_attrs(store: StoreLike, model: str) -> dict[str, Any] | None:
    """A finished model group's attributes, or None if the store or the group does not exist
    (or its metadata is unreadable)."""
    if locate(store).read("zarr.json") is None:
        return None
    open_root(store)  # a sweep store, or a one-line refusal
    attrs = group_attrs(store, model)
    return attrs if attrs is not None and "fingerprint" in attrs else None


def open_model(store: StoreLike, model: str, mode: str = "r") -> zarr.Group:
    """A model's group; InputError naming the store's models if there is no such model."""
    root = open_root(store, mode=mode)
    if model not in root.attrs.get("models", []) or model not in root:
        raise InputError(
            f"store {store}: no model {model!r}; it holds {root.attrs.get('models', [])}"
        )
    return root[model]


def write_training_record(store: StoreLike, model: str, record: dict) -> None:
    """Keep a model's JSON-able training record as its group's `training` attribute.

    Written by the model's preparation task alone, before any of its extractions run (they wait
    for it), so it is the group's attributes' only writer while tasks run.
    """
    open_model(store, model, mode="r+").attrs["training"] = record


def _shard_bounds(group: zarr.Group, start: int, stop: int) -> None:
    size, n = group.attrs["shard_size"], group.attrs["n_inputs"]
    if start % size or stop != min(start + size, n):
        raise ValueError(f"[{start}, {stop}) is not one whole shard of size {size} of {n} inputs")


def write_tokens(group: zarr.Group, start: int, n_tokens: np.ndarray,
                 token_kind: np.ndarray) -> None:
    """Write one whole shard's `n_tokens` (n,) and padded `token_kind` (n, t_max)."""
    stop = start + len(n_tokens)
    _shard_bounds(group, start, stop)
    group["n_tokens"][start:stop] = n_tokens
    group["token_kind"][start:stop] = token_kind


def write_device_rollout(group: zarr.Group, start: int, kappa: np.ndarray) -> None:
    """Write one whole shard's rollout kappa (n, layer, head, token_set) computed on the
    extraction device into the DEVICE_ROLLOUT array."""
    stop = start + len(kappa)
    _shard_bounds(group, start, stop)
    group[DEVICE_ROLLOUT][start:stop] = kappa


def write_input_digest(group: zarr.Group, start: int, digests: Sequence[str]) -> None:
    """Write one whole shard's input digests (what its extraction read)."""
    stop = start + len(digests)
    _shard_bounds(group, start, stop)
    group["input_digest"][start:stop] = np.asarray(digests, dtype=str)


def _legacy(array: zarr.Array, legacy_dims: tuple[str, ...]) -> bool:
    """Whether `array` has the layout of a model group from before the head dimension."""
    return tuple(array.metadata.dimension_names or ()) == legacy_dims


def _one_head(values: np.ndarray, what: str) -> np.ndarray:
    """`values` (..., head, x) without its head axis (axis 2), for a model group from before the
    head dimension; ValueError unless there is exactly one head (the head average)."""
    if values.shape[2] != 1:
        raise ValueError(f"{what}: {values.shape[2]} heads for a store written before the head "
                         "dimension (it holds head-averaged maps only)")
    return values[:, :, 0]


ChunkMap = Callable[[Callable[[Any], Any], Sequence[Any]], Any]
"""How `write_attention` maps its chunk writes: (function, items) -> results."""


def write_attention(group: zarr.Group, start: int, attention: np.ndarray,
                    map_chunks: ChunkMap | None = None) -> None:
    """Write the padded attention (b, layer, head, t_max, t_max) of inputs start..start+b: each
    input's chunk as its bytes straight from `attention` (each input's values C-contiguous) where
    the array stores plain bytes (`raw_chunks`: no copy into a chunk of zarr's own, no check against
    the fill value), the same bytes zarr writes; through zarr otherwise. On a local folder the
    chunks are files written by `map_chunks` (a map over them: in order on this thread by default;
    the extraction's last batch spreads them over its cores), no event loop
    (`RecordingStore.file_writer`)."""
    array = group["attention"]
    if _legacy(array, LEGACY_ATTENTION_DIMS):
        attention = _one_head(attention, f"{array.path}")
    elif raw_chunks(array) and attention.dtype == np.dtype("<f4") \
            and attention.shape[1:] == array.shape[1:] and _rows_contiguous(attention):
        _write_raw(array, start, attention, map_chunks or _in_order)
        return
    array[start:start + len(attention)] = attention


def make_attention_folders(group: zarr.Group, start: int, stop: int) -> None:
    """Make the folders that the attention chunks of inputs start..stop go into, in a local
    folder (`RecordingStore.make_folders`; nothing elsewhere), so that writing them makes none:
    an extraction makes a batch's while its forward pass runs, not on the last write's critical
    path. A chunk's key has a level per axis, so each input's chunk needs its own chain of
    folders (four new ones: 0.1-0.2 ms of CPU per input here with no file deleted just before;
    benchmarks/README.md, 2026-12-07, seventh session)."""
    store = group.store_path.store
    if not isinstance(store, RecordingStore) or store.local_root() is None:
        return  # no folders to make: the array's metadata is not even read
    array = group["attention"]
    prefix = f"{array.store_path.path}/" if array.store_path.path else ""
    zeros = (0,) * (array.ndim - 1)
    store.make_folders(prefix + array.metadata.encode_chunk_key((i, *zeros))
                       for i in range(max(start, 0), min(stop, array.shape[0])))


def _rows_contiguous(attention: np.ndarray) -> bool:
    """Whether each input's values (`attention[i]`) are C-contiguous, in order: the rows of a
    C-contiguous array, or of the extraction's buffer, whose rows each start on a page."""
    return attention.flags.c_contiguous or (
        attention[0].flags.c_contiguous and attention.strides[0] >= attention[0].nbytes)


def raw_chunks(array: zarr.Array) -> bool:
    """Whether a chunk of `array` is its values' little-endian bytes, nothing else: Zarr v3, the
    one codec `bytes` (no compressor, no filter, no sharding), float32, one input per chunk
    spanning every other axis (the attention's layout, `storage.layout`)."""
    metadata = array.metadata
    codecs = getattr(metadata, "codecs", ())
    return (metadata.zarr_format == 3 and len(codecs) == 1
            and type(codecs[0]).__name__ == "BytesCodec"
            and getattr(codecs[0].endian, "value", None) == "little"
            and array.dtype == np.dtype("float32")
            and tuple(array.chunks) == (1, *array.shape[1:]))


def _write_raw(array: zarr.Array, start: int, attention: np.ndarray,
               map_chunks: ChunkMap) -> None:
    """Each input's chunk of `attention` (little-endian float32, each input's values C-contiguous,
    one input per chunk: `raw_chunks`) set in `array`'s store, as zarr sets them: as files by
    `map_chunks` on a local folder (`RecordingStore.file_writer`: around the page cache where a
    chunk starts on a page and the file system takes it), else all at once through zarr's event
    loop; a chunk that is all fill value (zero: never a real input's attention, whose rows sum to 1)
    goes through zarr, which skips or deletes it. A store that keeps what it is given (in memory)
    gets copies: `attention` is a buffer the caller reuses."""
    stop = start + len(attention)
    if start < 0 or stop > array.shape[0]:
        raise IndexError(f"inputs {start}..{stop} of an attention array of {array.shape[0]}")
    prefix = f"{array.store_path.path}/" if array.store_path.path else ""
    store, prototype = array.store_path.store, default_buffer_prototype()
    zeros = (0,) * (array.ndim - 1)
    direct = store.file_writer() if isinstance(store, RecordingStore) else None
    keeps = direct is None and _keeps_buffers(store)
    items, empty = [], []
    for offset, values in enumerate(attention):
        if not values[0, 0, 0].any() and not values.any():
            empty.append(offset)
            continue
        key = prefix + array.metadata.encode_chunk_key((start + offset, *zeros))
        chunk = values.reshape(-1).view(np.uint8)
        items.append((key, chunk.copy() if keeps else chunk))
    if items and direct is not None:
        map_chunks(lambda item: direct(*item), items)
    elif items:
        sync(concurrent_map([(key, prototype.buffer.from_array_like(chunk))
                             for key, chunk in items], store.set,
                            limit=zarr.config.get("async.concurrency")))
    for offset in empty:
        array[start + offset:start + offset + 1] = attention[offset:offset + 1]


def _in_order(fn: Callable[[Any], Any], items: Sequence[Any]) -> None:
    """`fn` over `items` on this thread, in order."""
    for item in items:
        fn(item)


def _keeps_buffers(store: object) -> bool:
    """Whether `store` holds on to the buffers it is given instead of writing their bytes out
    (zarr's MemoryStore; an ObjectStore over obstore's MemoryStore), under any wrappers."""
    while isinstance(store, zarr.storage.WrapperStore):
        store = store._store
    if isinstance(store, zarr.storage.MemoryStore):
        return True
    inner = getattr(store, "store", None)
    return type(inner).__name__ == "MemoryStore"


def read_attention(array: zarr.Array, start: int, stop: int,
                   out: np.ndarray | None = None) -> np.ndarray:
    """The padded attention (input, layer, head, query, key) of inputs start..stop from a model
    group's open `attention` array; one `mean` head for a model group from before the head
    dimension. `out`: a C-contiguous float32 array of that shape to read into (and return),
    instead of a fresh one."""
    if _legacy(array, LEGACY_ATTENTION_DIMS):
        attention = array[start:stop][:, :, None]
        if out is None:
            return attention
        out[...] = attention
        return out
    if out is None:
        return array[start:stop]
    array.get_basic_selection(slice(start, stop),
                              out=default_buffer_prototype().nd_buffer.from_numpy_array(out))
    return out


READ_BLOCK_BYTES = 64 << 20  # StoredAttention reads this much attention per store read, at most
# (or one input where one input is larger): one read of a whole ViT-B shard, one input at a time
# for DINOv2 at 518 px (90 MB per input)


class StoredAttention:
    """A shard's attention in the store, read in blocks of inputs of at most READ_BLOCK_BYTES as
    they are asked for in order: `[i]` is input start + i's padded (layer, head, query, key)
    stack (`read_attention`), valid until the next block is read; `shape` is the shard's.
    Memory: one block, not the shard. `buffer(shape)`: where to read a block (a float32 array
    of that shape, e.g. one reused across tasks: a fresh 60 MB array costs page faults that
    rival the read); default a fresh array per block."""

    def __init__(self, group: zarr.Group, start: int, stop: int,
                 buffer: Callable[[tuple[int, ...]], np.ndarray] | None = None) -> None:
        self.start, self.stop = start, stop
        self._buffer = buffer
        self._array = array = group["attention"]  # opened once: its metadata read once
        heads = 1 if _legacy(array, LEGACY_ATTENTION_DIMS) else array.shape[2]
        self.shape = (stop - start, array.shape[1], heads, *array.shape[-2:])
        per_input = 4 * int(np.prod(self.shape[1:]))
        self.block = max(1, READ_BLOCK_BYTES // per_input)
        self._first, self._values = 0, np.empty((0, *self.shape[1:]), dtype=np.float32)

    def __getitem__(self, i: int) -> np.ndarray:
        if not 0 <= i < self.shape[0]:
            raise IndexError(f"input {i} of a shard of {self.shape[0]}")
        if not self._first <= i < self._first + len(self._values):
            self._values = None  # drop the last block before reading the next
            last = min(i + self.block, self.shape[0])
            self._first = i
            out = None if self._buffer is None else self._buffer((last - i, *self.shape[1:]))
            self._values = read_attention(self._array, self.start + i, self.start + last, out)
        return self._values[i - self._first]


def write_results(group: zarr.Group, start: int,
                  results: Mapping[str, np.ndarray]) -> dict[str, zarr.Array]:
    """Write one whole shard's result variables, each (n, layer, head, token_set), all at once
    (zarr's writes of the variables run concurrently); returns the results arrays by name."""
    unknown = set(results) ^ set(RESULT_VARS)
    if unknown:
        raise ValueError(f"results must hold exactly {sorted(RESULT_VARS)}; differs: {unknown}")
    stop = start + len(next(iter(results.values())))
    _shard_bounds(group, start, stop)
    arrays = dict(group[RESULTS_GROUP].arrays())  # the group opened once, members read together
    writes = []
    for name, values in results.items():
        if name in OPTIONAL_RESULT_VARS and name not in arrays:
            continue  # a store written before this variable: it stays without it
        array = arrays[name]
        if array.shards is not None:  # one object holds many shards' values: never a task's
            raise ValueError(f"{array.path} is compacted (storage.compaction): the driver "
                             "expands a model before any of its tests run again")
        if _legacy(array, LEGACY_RESULT_DIMS):
            values = _one_head(values, f"{array.path}")
        writes.append(array.async_array.setitem(slice(start, stop), values))
    sync(_together(writes))  # on zarr's own event loop, as its synchronous API runs one
    return arrays


async def _together(coroutines: Sequence[Coroutine[Any, Any, None]]) -> None:
    """Await zarr coroutines concurrently: a test shard's 17 small chunk writes cost a quarter to
    a third less CPU together than one after another (timed on a 32-input shard)."""
    await asyncio.gather(*coroutines)


def write_baseline(store: StoreLike, size_index: int, chunk: int, holding: int,
                   trials: int, disagreements: int, null_index: int = 0) -> zarr.Group:
    """Write one (null, size, chunk) cell of the baseline counts; returns the group written."""
    group = open_root(store, mode="r+")[BASELINE_GROUP]
    group["holding"][null_index, size_index, chunk] = holding
    group["trials"][null_index, size_index, chunk] = trials
    group["disagreements"][null_index, size_index, chunk] = disagreements
    return group


def write_matched_nulls(store: StoreLike, model: str, null_index: int, chunk: int,
                        counts: Sequence[tuple[int, int, int]]) -> zarr.Group:
    """Write one (null, :, chunk) chunk of a model's size-matched null counts: per token set,
    (trials, holding, disagreements); returns the group written."""
    group = open_model(store, model, mode="r+")[NULLS_GROUP]
    trials, holding, disagreements = (np.asarray(v, dtype=np.int64) for v in zip(*counts,
                                                                                   strict=True))
    group["trials"][null_index, :, chunk] = trials
    group["holding"][null_index, :, chunk] = holding
    group["disagreements"][null_index, :, chunk] = disagreements
    return group

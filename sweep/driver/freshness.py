"""Which done tasks must rerun: inputs edited under the same ids, chunks damaged since.

The driver computes each input's digest (`workers.inputs.digests`: cheap, no image decoded) and
hands a shard's digests to its extraction task, which verifies them and records them in the store's
`input_digest`. On a rerun, a finished shard whose recorded digests differ from today's inputs
is extracted and tested again (only that shard: the others keep their values); a done task whose
chunks no longer match its marker's checksums (`storage.integrity`) runs again. Nothing mixes:
every shard's values come from the inputs its digests name.

Chunks are checked at start-up against one listing of the store (`storage.integrity.STAT`: sizes
and versions, mtimes locally and ETags on an object store): only those whose size or version
differ from the marker's are read and re-hashed; `verify` re-hashes every chunk (`FULL`). A task
whose chunks were re-hashed and found intact gets its marker refreshed with their versions, so
the next start-up reads them no more (markers from before versions are refreshed the same way).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable

import numpy as np
import zarr

from storage import markers
from storage.integrity import (
    FULL,
    MARKERS,
    STAT,
    check_chunks,
    compacted_scopes,
    data_listing,
    expected_arrays,
    metadata_damage,
    parse_marker,
    still_vouched,
)
from storage.layout import BASELINE_GROUP, NULLS_GROUP, RESULTS_GROUP
from storage.store import group_attrs, location_of, open_root, recreate_array, recreate_group
from sweep.config.schema import SweepConfig
from sweep.driver.plan import ExtractTask, SweepPlan, Task
from workers.inputs import Dataset, open_dataset
from workers.inputs.digests import input_digests
from workers.models.extraction import model_dataset
from workers.models.registry import resolve_model, trained_here


def measured_datasets(config: SweepConfig, names: Iterable[str] | None = None
                      ) -> dict[str, Dataset]:
    """Per model (`names`, default all), the inputs it is measured on (`model_dataset`), each
    dataset opened once however many models share it."""
    opened: dict[str, Dataset] = {}
    out = {}
    for name in config.models if names is None else names:
        entry = config.models[name]
        if entry.dataset not in opened:
            opened[entry.dataset] = open_dataset(config.datasets[entry.dataset].to_spec())
        out[name] = model_dataset(resolve_model(entry.source, **entry.options),
                                  opened[entry.dataset])
    return out


def plan_digests(config: SweepConfig, datasets: dict[str, Dataset]) -> dict[str, tuple[str, ...]]:
    """Per model, the digest of every input it is measured on (`datasets`: model name -> its
    measured inputs, as `measured_datasets` opens them), as it is now."""
    out = {}
    done: dict[tuple[int, bool], tuple[str, ...]] = {}  # models sharing a dataset hash it once
    for name, dataset in datasets.items():
        entry = config.models[name]
        whole_table = trained_here(resolve_model(entry.source, **entry.options))
        key = (id(dataset), whole_table)
        if key not in done:
            done[key] = input_digests(dataset, range(len(dataset)), whole_table=whole_table)
        out[name] = done[key]
    return out


def with_digests(plan: SweepPlan, digests: dict[str, tuple[str, ...]]) -> SweepPlan:
    """`plan` whose extraction tasks carry their shard's input digests."""
    tasks = tuple(
        dataclasses.replace(t, digests=digests[t.model][t.start:t.stop])
        if isinstance(t, ExtractTask) and t.model in digests else t
        for t in plan.tasks
    )
    return dataclasses.replace(plan, tasks=tasks)


def stale_extractions(plan: SweepPlan, index: markers.MarkerIndex | None = None
                      ) -> list[ExtractTask]:
    """Done extraction tasks whose recorded input digests differ from the planned ones
    (`index`: the store's markers, listed once; default: listed now)."""
    stale: list[ExtractTask] = []
    stored: dict[str, np.ndarray | None] = {}
    index = index or markers.MarkerIndex(plan.config.store_ref)
    for task in plan.tasks:
        if not isinstance(task, ExtractTask) or not task.digests:
            continue
        if not index.done(task.scope, task.marker):
            continue
        if task.model not in stored:
            group = open_root(task.store)[task.model]
            stored[task.model] = group["input_digest"][:] if "input_digest" in group else None
        recorded = stored[task.model]
        if recorded is None:
            continue  # a store from before digests: nothing to compare with
        shard = [str(d) for d in recorded[task.start:task.stop]]
        if any(shard) and tuple(shard) != task.digests:
            stale.append(task)
            first = next(i for i, (a, b) in enumerate(zip(shard, task.digests, strict=True))
                         if a != b)
            print(f"sweep: model {task.model!r} shard {task.shard}: inputs changed since it ran "
                  f"(first: {task.dataset.path or task.dataset.source} input "
                  f"{task.start + first + 1}); recomputing it", file=sys.stderr)
    return stale


def damaged_tasks(plan: SweepPlan, *, verify: bool = False,
                  index: markers.MarkerIndex | None = None) -> list[Task]:
    """Done tasks whose chunks no longer match their marker's checksums: one listing of the
    store, a read of those whose size or version changed; with `verify`, a read of every chunk.
    Refreshes the marker of a done task whose re-hashed chunks were intact (see the module)."""
    index = index or markers.MarkerIndex(plan.config.store_ref)
    location = index.store
    done = [t for t in plan.tasks if index.done(t.scope, t.marker)]
    if not done:
        return []
    keys = [markers.marker_key(t.scope, t.marker) for t in done]
    texts = location.read_many(keys)
    listing = data_listing(location)
    listing.update(location.listing(MARKERS))
    out = []
    compacted = compacted_scopes(index.keys)  # their results: `storage.compaction` checks them
    for task, key in zip(done, keys, strict=True):
        data = texts[key]
        vouched = None if data is None else parse_marker(data, key)
        vouched = still_vouched(key[len(MARKERS):], vouched, compacted)
        if not vouched:
            continue
        check = check_chunks(location, vouched, depth=FULL if verify else STAT, listing=listing)
        if check.damaged:
            out.append(task)
            print(f"sweep: {task.key}: {len(check.damaged)} damaged chunk(s) "
                  f"({check.damaged[0]}, ...); recomputing", file=sys.stderr)
        elif check.rehashed:
            markers.mark_done(location, task.scope, task.marker, vouched | check.rehashed)
    return out


def repair_metadata(root: zarr.Group, plan: SweepPlan,
                    input_ids: dict[str, tuple[str, ...]]) -> None:
    """Recreate, from the layout and the plan, every metadata document of the planned groups
    that `storage.integrity.metadata_damage` finds damaged, and delete what it held so that
    the tasks whose markers vouch for it rerun (`damaged_tasks`: their chunks are gone): an
    array's document (its data type, shape or chunk shape edited, or unreadable) -> that array
    afresh; a results group's -> every result array; a group's own (its attributes,
    fingerprint included, are gone) -> the whole group, which `ensure_*` then creates as a new
    one. A result array whose only fault is a layout other than its compaction marker's is
    left to `sweep.driver.compaction.settle`, which reads its values where the marker says.
    Run under the lock, after the fingerprints are checked (`input_ids`: each planned model's,
    for its `input_id` array); one stderr line per repair."""
    location = location_of(root)
    models = {model.name: model for model in plan.models}
    for damage in metadata_damage(location, models):
        if damage.layout:  # its values are where the marker says: `sweep.driver.compaction`
            continue
        if damage.whole_group:
            location.delete_prefix(f"{damage.group}/")
            print(f"sweep: {damage.key}: {damage.reason}; the group is recreated and what it "
                  f"held recomputed", file=sys.stderr)
            continue
        kind = BASELINE_GROUP if damage.group == BASELINE_GROUP else NULLS_GROUP \
            if damage.group.endswith(f"/{NULLS_GROUP}") else "model"
        attrs = group_attrs(location, damage.group) or {}
        group = root[damage.group]
        inside = damage.key.removesuffix("/zarr.json")[len(damage.group) + 1:]
        arrays = expected_arrays(kind, attrs)
        if inside == RESULTS_GROUP:
            recreate_group(group, RESULTS_GROUP)
            names = [name for name in arrays if name.startswith(f"{RESULTS_GROUP}/")]
        else:
            names = [inside]
        values = {"input_id": input_ids.get(damage.scope), "n": attrs.get("sizes"),
                  "null": attrs.get("nulls", ["uniform"]),
                  "head": models[damage.scope].heads if damage.scope in models else None}
        for name in names:
            value = values.get(name)  # a coordinate array's values; None for data
            recreate_array(group, name, arrays[name], None if value is None else
                           np.asarray(value, dtype=np.int64 if name == "n" else str))
        print(f"sweep: {damage.key}: {damage.reason}; recreated, and the shards it held "
              f"recomputed", file=sys.stderr)

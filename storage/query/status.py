"""What a store holds: done, pending and failed tasks per model and stage, from its markers.

A done task whose chunks no longer match its marker's checksums (`storage.integrity`: checked
against one listing, as `sweep run` does at start-up; re-hashed with `verify`) counts as pending
and is listed in `damaged` with the damaged chunks; a metadata document that is not what the
layout says (`storage.integrity.metadata_damage`) is a `metadata` entry of its model (or the
baseline), and a group whose own document is damaged is that entry alone. A
store whose creation never finished (no `config` root attribute: the driver writes it last)
raises StoreDamagedError instead of showing an empty table. A model whose results were compacted
(`storage.compaction`) has a `compact` entry: its marker vouches for the compacted objects, and
its test markers for its results no more (`storage.integrity.still_vouched`). A model in
training (a progress record and no prepare marker: `storage.markers`) has a pending `prepare`
entry while it trains, before its marker exists.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from storage.attention import EXTRACT_STAGE, AttentionPolicy, dropped_by_shard, held_inputs
from storage.errors import StoreDamagedError
from storage.integrity import FULL, MARKERS, STAT, metadata_damage, scan_store
from storage.layout import (
    BASELINE_GROUP,
    BASELINE_STAGE,
    COMPACT_STAGE,
    NULLS_GROUP,
    NULLS_STAGE,
    PREPARE_STAGE,
    STAGES,
)
from storage.location import StoreLike, locate
from storage.markers import (
    MarkerIndex,
    TrainingProgress,
    marker_key,
    marker_name,
    read_progress,
    read_state,
)
from storage.store import open_root

MISSING = "group"  # the stage of a StageStatus standing for a deleted group
METADATA = "metadata"  # the stage of a StageStatus standing for damaged metadata documents


@dataclass
class StageStatus:
    """Counts of one (model or baseline, stage), with the error of every failed task."""

    scope: str
    stage: str
    done: int = 0
    pending: int = 0
    failed: dict[str, str] = field(default_factory=dict)  # marker name -> error
    damaged: dict[str, list[str]] = field(default_factory=dict)  # marker name -> chunk files
    missing: bool = False  # the scope's group is gone from the store (stage MISSING)
    metadata: dict[str, str] = field(default_factory=dict)  # damaged document -> what is wrong

    @property
    def total(self) -> int:
        return self.done + self.pending + len(self.failed)


def _count(index: MarkerIndex, scope: str, stage: str, names: list[str],
           damaged: dict[str, list[str]]) -> StageStatus:
    status = StageStatus(scope, stage)
    for name in names:
        bad = damaged.get(marker_key(scope, name)[len(MARKERS):])
        if bad:
            status.damaged[name] = bad
            status.pending += 1
        elif index.done(scope, name):
            status.done += 1
        elif index.failed(scope, name):
            status.failed[name] = read_state(index.store, scope, name).error or ""
        else:
            status.pending += 1
    return status


def store_status(store: StoreLike, *, verify: bool = False) -> list[StageStatus]:
    """Per model and stage, then for the baseline, how many tasks are done, pending, failed;
    a model whose group is gone is one `missing` entry (stage MISSING); done tasks whose chunks
    no longer match their markers count as pending and are listed as damaged: checked
    against one listing of the store (sizes and versions, as `sweep run` checks at start-up),
    or re-read and re-hashed with `verify`."""
    location = locate(store)
    root = open_root(location)
    if "config" not in root.attrs:
        raise StoreDamagedError(
            f"store {location}: half-created (its creation was interrupted before it was "
            f"finished); rerun `sweep run` with its config to finish it"
        )
    index = MarkerIndex(location)
    damaged = scan_store(location, depth=FULL if verify else STAT)
    models = root.attrs.get("models", [])
    training = read_progress(location)
    damage = metadata_damage(location, models)
    metadata: dict[str, dict[str, str]] = {}
    for d in damage:
        metadata.setdefault(d.scope, {})[d.key] = d.reason
    touched, whole = {d.group for d in damage}, {d.group for d in damage if d.whole_group}
    out = [StageStatus(scope, METADATA, pending=len(keys), metadata=keys)
           for scope, keys in metadata.items()]
    for model in models:
        if model in whole:
            continue  # its attributes are gone: the METADATA entry says so
        if model not in root:  # deleted: `sweep run` recreates and recomputes it
            out.append(StageStatus(model, MISSING, pending=1, missing=True))
            continue
        n_shards = root[model].attrs["n_shards"]
        if (index.done(model, PREPARE_STAGE) or index.failed(model, PREPARE_STAGE)
                or model in training):
            out.append(_count(index, model, PREPARE_STAGE, [PREPARE_STAGE], damaged))
        for stage in STAGES:
            names = [marker_name(stage, shard) for shard in range(n_shards)]
            out.append(_count(index, model, stage, names, damaged))
        if index.done(model, COMPACT_STAGE):  # its results as a few objects (storage.compaction)
            out.append(_count(index, model, COMPACT_STAGE, [COMPACT_STAGE], damaged))
        if f"{model}/{NULLS_GROUP}" not in touched and NULLS_GROUP in root[model]:
            group = root[model][NULLS_GROUP]
            chunks = range(group["holding"].shape[-1])
            names = [marker_name(NULLS_STAGE, f"{null}-c{chunk:05d}")
                     for null in group.attrs["nulls"] for chunk in chunks]
            out.append(_count(index, model, NULLS_STAGE, names, damaged))
    if BASELINE_GROUP not in touched and BASELINE_GROUP in root:
        attrs = root[BASELINE_GROUP].attrs
        n_chunks = root[BASELINE_GROUP]["holding"].shape[-1]
        nulls = [f"{null}-" for null in attrs["nulls"]] if "nulls" in attrs else [""]  # "": old
        names = [marker_name(BASELINE_STAGE, f"{null}n{n:04d}-c{chunk:05d}")
                 for null in nulls for n in attrs["sizes"] for chunk in range(n_chunks)]
        out.append(_count(index, BASELINE_GROUP, BASELINE_STAGE, names, damaged))
    return out


@dataclass(frozen=True)
class AttentionHeld:
    """How many of a model's inputs still have their attention in the store, and its policy."""

    model: str
    held: int
    n_inputs: int
    policy: str

    def line(self) -> str:
        return (f"attention {self.model}: {self.held} of {self.n_inputs} inputs still have "
                f"their attention (attention: {self.policy})")


def attention_held(store: StoreLike) -> list[AttentionHeld]:
    """Per model with an extracted shard: inputs of extracted shards less those whose attention
    was dropped (`storage.attention`), from one listing of the markers."""
    location = locate(store)
    root = open_root(location)
    index = MarkerIndex(location)
    dropped = dropped_by_shard(location)
    models = root.attrs.get("models", [])
    unreadable = {d.group for d in metadata_damage(location, models, arrays=False)
                  if d.whole_group}
    out = []
    for model in models:
        if model in unreadable or model not in root:
            continue  # a group gone or unreadable: `store_status` reports it
        attrs = root[model].attrs
        size, n = attrs["shard_size"], attrs["n_inputs"]
        done = [(shard, shard * size, min(shard * size + size, n))
                for shard in range(attrs["n_shards"])
                if index.done(model, marker_name(EXTRACT_STAGE, shard))]
        if not done:  # nothing extracted yet: nothing to hold or to drop
            continue
        mine = {shard: inputs for (scope, shard), inputs in dropped.items() if scope == model}
        policy = AttentionPolicy.parse(attrs.get("attention", "keep"))
        out.append(AttentionHeld(model, held_inputs(done, mine), n, str(policy)))
    return out


def training_now(store: StoreLike) -> list[TrainingProgress]:
    """The progress records of the store's models whose preparation is not done (in training,
    or stopped while training), in the store's model order."""
    location = locate(store)
    index = MarkerIndex(location)
    records = read_progress(location)
    models = open_root(location).attrs.get("models", [])
    return [records[m] for m in models if m in records and not index.done(m, PREPARE_STAGE)]

"""What a store holds: done, pending and failed tasks per model and stage, from its markers.

With `verify`, a done task whose chunk files no longer match its marker's checksums
(`storage.integrity`) counts as pending and is listed in `damaged` with the damaged files. A
store whose creation never finished (no `config` root attribute: the driver writes it last)
raises StoreDamagedError instead of showing an empty table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from storage.errors import StoreDamagedError
from storage.integrity import damaged_chunks
from storage.layout import (
    BASELINE_GROUP,
    BASELINE_STAGE,
    NULLS_GROUP,
    NULLS_STAGE,
    PREPARE_STAGE,
    STAGES,
)
from storage.markers import marker_name, read_state, vouched_chunks
from storage.store import open_root


@dataclass
class StageStatus:
    """Counts of one (model or baseline, stage), with the error of every failed task."""

    scope: str
    stage: str
    done: int = 0
    pending: int = 0
    failed: dict[str, str] = field(default_factory=dict)  # marker name -> error
    damaged: dict[str, list[str]] = field(default_factory=dict)  # marker name -> chunk files

    @property
    def total(self) -> int:
        return self.done + self.pending + len(self.failed)


def _count(store: Path, scope: str, stage: str, names: list[str],
           verify: bool = False) -> StageStatus:
    status = StageStatus(scope, stage)
    for name in names:
        state = read_state(store, scope, name)
        vouched = vouched_chunks(store, scope, name) if verify and state.state == "done" else None
        bad = damaged_chunks(store, vouched) if vouched else []
        if bad:
            status.damaged[name] = bad
            status.pending += 1
        elif state.state == "done":
            status.done += 1
        elif state.state == "failed":
            status.failed[name] = state.error or ""
        else:
            status.pending += 1
    return status


def store_status(store: str | Path, *, verify: bool = False) -> list[StageStatus]:
    """Per model and stage, then for the baseline, how many tasks are done, pending, failed;
    `verify` re-reads every done task's chunks (damaged ones count as pending)."""
    store = Path(store)
    root = open_root(store)
    if "config" not in root.attrs:
        raise StoreDamagedError(
            f"store {store}: half-created (its creation was interrupted before it was "
            f"finished); rerun `sweep run` with its config to finish it"
        )
    out = []
    for model in root.attrs.get("models", []):
        n_shards = root[model].attrs["n_shards"]
        if read_state(store, model, PREPARE_STAGE).state != "pending":  # a model that has one
            out.append(_count(store, model, PREPARE_STAGE, [PREPARE_STAGE], verify))
        for stage in STAGES:
            names = [marker_name(stage, shard) for shard in range(n_shards)]
            out.append(_count(store, model, stage, names, verify))
        if NULLS_GROUP in root[model]:
            group = root[model][NULLS_GROUP]
            chunks = range(group["holding"].shape[-1])
            names = [marker_name(NULLS_STAGE, f"{null}-c{chunk:05d}")
                     for null in group.attrs["nulls"] for chunk in chunks]
            out.append(_count(store, model, NULLS_STAGE, names, verify))
    if BASELINE_GROUP in root:
        attrs = root[BASELINE_GROUP].attrs
        n_chunks = root[BASELINE_GROUP]["holding"].shape[-1]
        nulls = [f"{null}-" for null in attrs["nulls"]] if "nulls" in attrs else [""]  # "": old
        names = [marker_name(BASELINE_STAGE, f"{null}n{n:04d}-c{chunk:05d}")
                 for null in nulls for n in attrs["sizes"] for chunk in range(n_chunks)]
        out.append(_count(store, BASELINE_GROUP, BASELINE_STAGE, names, verify))
    return out

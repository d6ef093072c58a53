"""What a store holds: done, pending and failed tasks per model and stage, from its markers."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from storage.layout import BASELINE_GROUP, BASELINE_STAGE, PREPARE_STAGE, STAGES
from storage.markers import marker_name, read_state
from storage.store import open_root


@dataclass
class StageStatus:
    """Counts of one (model or baseline, stage), with the error of every failed task."""

    scope: str
    stage: str
    done: int = 0
    pending: int = 0
    failed: dict[str, str] = field(default_factory=dict)  # marker name -> error

    @property
    def total(self) -> int:
        return self.done + self.pending + len(self.failed)


def _count(store: Path, scope: str, stage: str, names: list[str]) -> StageStatus:
    status = StageStatus(scope, stage)
    for name in names:
        state = read_state(store, scope, name)
        if state.state == "done":
            status.done += 1
        elif state.state == "failed":
            status.failed[name] = state.error or ""
        else:
            status.pending += 1
    return status


def store_status(store: str | Path) -> list[StageStatus]:
    """Per model and stage, then for the baseline, how many tasks are done, pending, failed."""
    store = Path(store)
    root = open_root(store)
    out = []
    for model in root.attrs.get("models", []):
        n_shards = root[model].attrs["n_shards"]
        if read_state(store, model, PREPARE_STAGE).state != "pending":  # a model that has one
            out.append(_count(store, model, PREPARE_STAGE, [PREPARE_STAGE]))
        for stage in STAGES:
            names = [marker_name(stage, shard) for shard in range(n_shards)]
            out.append(_count(store, model, stage, names))
    if BASELINE_GROUP in root:
        attrs = root[BASELINE_GROUP].attrs
        n_chunks = root[BASELINE_GROUP]["holding"].shape[1]
        names = [marker_name(BASELINE_STAGE, f"n{n:04d}-c{chunk:05d}")
                 for n in attrs["sizes"] for chunk in range(n_chunks)]
        out.append(_count(store, BASELINE_GROUP, BASELINE_STAGE, names))
    return out

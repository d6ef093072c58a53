"""The driver's side of compaction (`storage.compaction.results`): a finished model's result
arrays become a few objects at the end of a run, and a compacted model whose shards must be
tested again is expanded before any task runs. All under the store lock, with no task running,
so the driver is their only writer.

Order in `sweep.driver.runner.execute_plan`: `settle` (before the pending tasks are worked out:
a compaction killed before its marker is undone; the test markers of the shards a damaged
compacted object held are cleared, so they rerun), `expand` (after: the compacted models with a
test to rerun go back to one chunk per shard), the tasks, then `compact` (every model whose
tests are all done) and the consolidated metadata.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable

from storage import markers
from storage.compaction.results import (
    compact_model,
    expand_model,
    lost_shards,
    restore_compacted,
    revert_unmarked,
    unread_results,
)
from storage.integrity import FULL, NOT_COMPACTED, STAT
from storage.layout import COMPACT_STAGE
from sweep.driver.plan import ModelPlan, SweepPlan, Task, TestTask


def _test_marker(shard: int) -> str:
    return markers.marker_name(TestTask.stage, shard)


def settle(plan: SweepPlan, *, verify: bool = False) -> None:
    """Per planned model: without a compaction marker, undo a compaction killed before it
    (`revert_unmarked`); with one, put back the compacted metadata of any result array whose
    document is per shard (`restore_compacted`: the marker, not the document, says where the
    values are; one stderr line each), check its compacted objects (`verify`: re-hash them all)
    and clear the test markers of the shards a damaged one held (one stderr line)."""
    store = plan.config.store_ref
    index = markers.MarkerIndex(store)
    for model in plan.models:
        if not index.done(model.name, COMPACT_STAGE):
            revert_unmarked(store, model.name, model.shard_size, _test_markers(model))
            continue
        for path in restore_compacted(store, model.name):
            print(f"sweep: {path}/zarr.json: {NOT_COMPACTED.partition(' (')[0]}; its compacted "
                  f"metadata put back", file=sys.stderr)
        lost = lost_shards(store, model.name, model.shard_size, model.n_inputs,
                           depth=FULL if verify else STAT)
        for shard in sorted(lost):
            index.clear(model.name, _test_marker(shard))
        if lost:
            print(f"sweep: model {model.name!r}: damaged compacted results ({len(lost)} "
                  f"shard(s)); recomputing them", file=sys.stderr)


def _test_markers(model: ModelPlan) -> list[str]:
    return [_test_marker(shard) for shard in range(model.n_shards)]


def _tested(index: markers.MarkerIndex, model: ModelPlan) -> list[int]:
    return [shard for shard in range(model.n_shards)
            if index.done(model.name, _test_marker(shard))]


def expand(plan: SweepPlan, pending: Iterable[Task]) -> list[str]:
    """Expand every compacted model with a test task in `pending` (`expand_model`: the shards
    whose tests stay done keep their values); returns their names."""
    retested = {task.model for task in pending if isinstance(task, TestTask)}
    store = plan.config.store_ref
    index = markers.MarkerIndex(store)
    out = []
    for model in plan.models:
        if model.name in retested and index.done(model.name, COMPACT_STAGE):
            expand_model(store, model.name, model.shard_size, _tested(index, model))
            out.append(model.name)
    return out


def compact(plan: SweepPlan) -> list[str]:
    """Compact every planned model whose test tasks are all done (`compact_model`; a model
    compacted already only has what a killed run left finished); returns their names. A model
    whose per-shard results are not all there is left as it is, the test markers of the shards
    it lacks cleared so that the next run tests them again (one stderr line)."""
    store = plan.config.store_ref
    index = markers.MarkerIndex(store)
    out = []
    for model in plan.models:
        if len(_tested(index, model)) != model.n_shards:
            continue
        if compact_model(store, model.name, model.shard_size, _test_markers(model)):
            out.append(model.name)
            continue
        unread = unread_results(store, model.name, _test_markers(model))
        for name in unread:
            index.clear(model.name, name)
        print(f"sweep: model {model.name!r}: the results of {len(unread)} shard(s) are gone "
              f"from the store since they were tested ({', '.join(unread[:3])}"
              f"{', ...' if len(unread) > 3 else ''}); not compacted; rerun sweep run to test "
              f"them again", file=sys.stderr)
    return out

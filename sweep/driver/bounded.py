"""The driver's side of a bounded store (`attention: drop | {sample: N}`, `storage.attention`).

Before the lock: a policy change that would need attention the store no longer holds is refused
(`check_attention_change`), unless the run re-extracts it. At start-up, with the markers listed
once: a shard whose test must run but whose attention was dropped re-extracts first
(`needs_attention`), and a tested shard whose attention the policy drops, but which still holds
it (a store made under `keep`, or a run killed between a test's marker and its drop), has it
dropped now (`finish_drops`).
"""

from __future__ import annotations

from collections.abc import Iterable

import zarr

from storage.attention import KEEP, AttentionPolicy, drop_attention, dropped_by_shard
from storage.location import locate
from storage.markers import MarkerIndex, marker_name
from storage.store import StoreMismatchError, open_root, stored_model_attrs
from sweep.config.schema import SweepConfig
from sweep.driver.plan import ExtractTask, SweepPlan, TestTask
from workers.tasks.shards import attention_chunks

REEXTRACT_FLAG = "--reextract-attention"


def _tested(index: MarkerIndex, model: str, shard: int) -> bool:
    return index.done(model, marker_name(TestTask.stage, shard))


def wanted_back(config: SweepConfig, name: str, group: zarr.Group,
                dropped: dict[int, frozenset[int]]) -> dict[int, frozenset[int]]:
    """Per shard, the dropped inputs that model `name`'s policy in `config` keeps."""
    policy = config.attention_policy(name)
    if policy.mode == "drop" or not dropped:
        return {}
    if policy.mode == KEEP:
        return {shard: inputs for shard, inputs in dropped.items() if inputs}
    kept = policy.kept(name, [str(i) for i in group["input_id"][:]])
    return {shard: inputs & kept for shard, inputs in dropped.items() if inputs & kept}


def check_attention_change(config: SweepConfig, *, reextract: bool = False) -> None:
    """StoreMismatchError (nothing written) if a model's `attention` policy keeps inputs whose
    attention an earlier policy dropped from tested shards, unless `reextract`."""
    location = locate(config.store_ref)
    if reextract or location.read("zarr.json") is None:
        return
    records = dropped_by_shard(location)
    if not records:
        return
    index = MarkerIndex(location)
    root = open_root(location)
    problems = []
    for name in config.models:
        mine = {shard: inputs for (model, shard), inputs in records.items()
                if model == name and _tested(index, name, shard)}
        if not mine or stored_model_attrs(location, name) is None:
            continue  # absent, or unreadable (`sweep run` recreates it)
        back = wanted_back(config, name, root[name], mine)
        if back:
            was = AttentionPolicy.parse(root[name].attrs.get("attention", "drop"))
            problems.append(f"models.{name}.attention: {config.attention_policy(name)} needs "
                            f"the attention of {sum(map(len, back.values()))} inputs that "
                            f"attention: {was} deleted")
    if problems:
        raise StoreMismatchError(
            f"store {config.store}: {'; '.join(problems)}; rerun with {REEXTRACT_FLAG} to "
            f"extract them again (and retest their shards), or restore the policy")


def reextractions(plan: SweepPlan, index: MarkerIndex, *, reextract: bool) -> list[ExtractTask]:
    """Done extractions to run again: shards whose test must run but whose attention was
    dropped (tested shards' results vouch for nothing about it), and with `reextract`, shards
    holding dropped inputs that the policy now keeps."""
    records = dropped_by_shard(plan.config.store_ref)
    if not records:
        return []
    root = open_root(plan.config.store_ref) if reextract else None
    back: dict[tuple[str, int], frozenset[int]] = {}
    if reextract:
        for model in plan.models:
            mine = {s: v for (m, s), v in records.items() if m == model.name}
            for shard, inputs in wanted_back(plan.config, model.name, root[model.name],
                                             mine).items():
                back[(model.name, shard)] = inputs
    out = []
    for task in plan.tasks:
        if not isinstance(task, ExtractTask) or not index.done(task.scope, task.marker):
            continue
        key = (task.model, task.shard)
        if records.get(key) and (not _tested(index, task.model, task.shard) or key in back):
            out.append(task)
    return out


def finish_drops(plan: SweepPlan, index: MarkerIndex, pending: Iterable[str]) -> int:
    """Drop the attention the policy drops from every tested shard that still holds it (and
    whose tasks do not rerun: `pending` keys); returns the number of shards dropped from.
    What a shard still holds is read from one listing of each bounded model's attention, not
    from its record of dropped inputs: a drop killed after its record was written and before
    its chunks were deleted is finished here."""
    waiting = set(pending)
    location = locate(plan.config.store_ref)
    count = 0
    groups: dict[str, zarr.Group] = {}
    present: dict[str, set[str]] = {}  # model -> keys of its attention chunks in the store
    for task in plan.tasks:
        if not isinstance(task, TestTask) or not task.drop or task.key in waiting:
            continue
        if not index.done(task.scope, task.marker):
            continue
        if task.model not in groups:
            groups[task.model] = open_root(task.store)[task.model]
            prefix = f"{groups[task.model]['attention'].path}/"
            present[task.model] = set(location.listing(prefix))
        chunks = attention_chunks(groups[task.model], tuple(sorted(task.drop)))
        held = {i: key for i, key in chunks.items() if key in present[task.model]}
        if not held:
            continue
        drop_attention(task.store, task.model, task.shard, held)
        count += 1
    return count

"""The bodies of the sweep's tasks: plain functions of a frozen task spec (no Dask in here).

Two sides, so that a worker imports only what its tasks need:

- `extract` (GPU pool): preparation (training) and extraction; imports torch and the model
  families (`workers.models.extraction`).
- `verdicts` (CPU pool: the equality test of a shard) and `nulls` (the config-size baseline and
  the size-matched nulls): numpy, numba and zarr only, never torch, transformers or timm.

Beneath both, `shards` (a shard's chunk files, the one line for an over-long input), `cache` (the
per-process dataset cache) and `threads` (numba's threads in a worker). `run_task` imports a
stage's module on first use, so a CPU worker that never extracts never imports torch
(`tests/test_lean_workers.py`).

Each body reads what it needs, writes only the store chunks its task owns, then writes its
completion marker.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from workers.task_specs import BaselineTask, ExtractTask, NullTask, PrepareTask, TestTask

STAGE_BODIES = {
    "prepare": ("workers.tasks.extract", "run_prepare"),
    "extract": ("workers.tasks.extract", "run_extract"),
    "test": ("workers.tasks.verdicts", "run_test"),
    "baseline": ("workers.tasks.nulls", "run_baseline"),
    "nulls": ("workers.tasks.nulls", "run_null"),
}
"""Stage -> (module, function) of its body: the module is imported when a task of the stage
first runs in this process."""


def run_task(task: PrepareTask | ExtractTask | TestTask | BaselineTask | NullTask) -> int:
    """Dispatch a task spec to its body; returns the number of inputs or trials it covered
    (models, for a preparation)."""
    module, name = STAGE_BODIES[task.stage]
    return getattr(importlib.import_module(module), name)(task)

"""Memory per worker process: what each pool of a cluster file gives one, against what its tasks
need, from measured figures (`MEMORY`); `sweep plan --cluster` prints it and warns where a pool
gives less.

Pure: the cluster config and the plan's models in, numbers and lines out. A worker process needs:

- test side (a pool carrying `CPU`): TEST_WORKER (a worker after its first task: Python,
  distributed, numpy, numba's kernels, zarr) plus, per test task it runs at once (its `CPU`
  resource), the task's peak: one read block of the shard's stored attention (float32, every
  stored head: `storage.store.StoredAttention`, at most READ_BLOCK_BYTES unless one input is
  larger) and TEST_STACKS float64 copies of one (layer, T, T) stack (restriction, the rollout's
  factors and products, the kernel's screens), at the model's T_max.
- extraction side (a pool carrying `GPU`): EXTRACT_IMPORTS of its family (torch and the
  family's library, a tiny model built), plus EXTRACT_COPIES host copies of one batch's
  attention (float32, every stored head, T_max; an estimate from the code), plus the model's
  weights where the plan knows its width (`ModelPlan.width`): BLOCK_PARAMS x layers x width^2
  parameters at the extraction dtype's bytes (an estimate: embeddings not counted); where it
  does not, the weights are named, not added.

Each figure was measured as its `measured` says (benchmarks/README.md, "Memory per worker
process"); rerun that on the target machine to replace it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from dask.utils import parse_bytes
from distributed.system import MEMORY_LIMIT

from storage.store import READ_BLOCK_BYTES
from sweep.clusters.config import ClusterConfig
from sweep.clusters.shapes import PoolShape, pool_shapes

MIB = 2**20
FLOAT32, FLOAT64 = 4, 8


@dataclass(frozen=True)
class Figure:
    """A figure the memory lines rest on: its value in `unit` and the command and run that
    measured it (`estimate`: counted from the code, not measured); `sweep plan --cluster
    --verbose` prints each with its source."""

    value: float
    unit: str
    measured: str
    estimate: bool = False

    def lines(self, name: str) -> list[str]:
        """'  TEST_WORKER = 217 MiB resident ...' and '      [how it was measured]'."""
        mark = " (ESTIMATE)" if self.estimate else ""
        return [f"  {name} = {self.value:g} {self.unit}{mark}", f"      [{self.measured}]"]


MEMORY: dict[str, Figure] = {
    "TEST_WORKER": Figure(
        217, "MiB resident in a CPU test worker process once it ran a test task (Python, "
        "distributed's worker, numpy, zarr, numba and its kernels from the cache)",
        "PYTHONPATH=. python benchmarks/worker_start.py --t 8: a `dask worker --nthreads 1` "
        "after two test tasks at T = 8 (217 MiB, two rounds); 246 MiB after two at T = 197 "
        "(8 inputs, 12 layers); Intel Xeon (Sapphire Rapids, KVM), Python 3.11, numba 0.68, "
        "distributed 2026.8, 2026-12-06",
    ),
    "TEST_STACKS": Figure(
        3.2, "float64 (layer, T, T) stacks a test task holds at its peak, beside one read "
        "block of attention",
        "PYTHONPATH=. python benchmarks/pool_bench.py --memory 197,577,1370: (peak during the "
        "task - after a warm-up task at T = 8 - the read block) / (12 x T^2 x 8 bytes) = 3.2 at "
        "T = 577 (332 - 204 - 30.5 MiB) and 3.1 at 1370 (821 - 204 - 86 MiB); at 197 the "
        "stacks are 3.6 MiB and the rest (5 MiB) is not theirs; two runs, 2026-12-06",
    ),
    "EXTRACT_IMPORTS": Figure(
        900, "MiB resident in a process that imported torch and its family and built a tiny "
        "model (hf, timm; the ft-transformer and vit-trained families import torch and a small "
        "library: counted the same)",
        "PYTHONPATH=. python benchmarks/fixed_costs.py tiny-roberta tiny-deit-distilled: 845 "
        "(hf) and 902 MiB (timm) after the model load; 580 MiB after `import "
        "workers.tasks.extract` alone (torch); 2026-12-06",
    ),
    "EXTRACT_COPIES": Figure(
        3, "host copies of one batch's attention (float32, every stored head, T_max) an "
        "extraction holds: the stacked layers, each input's crop, the padded block written",
        "counted in workers/tasks/extract.py and workers/models/extraction.py (not measured)",
        estimate=True,
    ),
    "BLOCK_PARAMS": Figure(
        12, "parameters per layer per width^2: a transformer block's attention (4 d^2) and MLP "
        "(8 d^2), embeddings not counted",
        "counted against whole models (built on torch's meta device, or a safetensors file's "
        "shapes): ViT-B/16 86.6M parameters (12 x 12 x 768^2 = 84.9M), ViT-L/16 304.3M "
        "(302.0M), all-MiniLM-L6-v2 22.7M (10.6M: its 11.7M word embeddings not counted); "
        "2026-12-06",
        estimate=True,
    ),
}


def _v(name: str) -> float:
    return MEMORY[name].value


def size_text(n: int) -> str:
    """Bytes as whole MiB below 10 GiB ('1,434 MiB'), else GiB ('11.8 GiB')."""
    return f"{n / MIB:,.0f} MiB" if n < 10 * 2**30 else f"{n / 2**30:.1f} GiB"


class SizedModel(Protocol):
    """What sizes a model's tasks (`sweep.driver.plan.ModelPlan` has it)."""

    name: str
    n_layers: int
    n_heads: int
    t_max: int
    shard_size: int
    batch_size: int
    dtype: str
    width: int | None

    @property
    def input_bytes(self) -> int: ...


def peak_of_a_test_task(model: SizedModel) -> int:
    """Peak bytes one test task of `model` adds to its worker: a read block and TEST_STACKS
    float64 stacks at T_max."""
    per_input = model.input_bytes
    block = per_input * min(model.shard_size, max(1, READ_BLOCK_BYTES // per_input))
    return int(block + _v("TEST_STACKS") * model.n_layers * model.t_max**2 * FLOAT64)


def weight_bytes(model: SizedModel) -> int | None:
    """The model's weights at its extraction dtype, from its width (an estimate); None when the
    plan does not know the width."""
    if model.width is None:
        return None
    itemsize = FLOAT32 if model.dtype == "float32" else FLOAT32 // 2
    return int(_v("BLOCK_PARAMS") * model.n_layers * model.width**2 * itemsize)


def extraction_bytes(model: SizedModel) -> int:
    """Bytes an extraction worker holds for `model` (an estimate): imports, one batch's
    attention copies and the weights when the width is known."""
    batch = model.batch_size * model.input_bytes
    return int(_v("EXTRACT_IMPORTS") * MIB + _v("EXTRACT_COPIES") * batch
               + (weight_bytes(model) or 0))


@dataclass(frozen=True)
class PoolMemory:
    """One pool's memory per worker process: given (None: unknown), how, and what runs there."""

    name: str
    given: int | None
    source: str
    tests: int  # test tasks a process runs at once (its CPU resource; 0: none)
    extracts: bool  # whether the pool runs extractions (it carries GPU)


def pool_memory(cfg: ClusterConfig, cpu_count: int | None = None,
                devices: list[int] | None = None) -> list[PoolMemory] | None:
    """Each pool's memory per worker process as `cfg` gives it; None for `address` (workers
    started by hand: their --memory-limit is theirs)."""
    shapes = pool_shapes(cfg, cpu_count, devices)
    if shapes is None:
        return None
    out = []
    for name, shape in shapes.items():
        given, source = _given(cfg, name, shape, shapes.values())
        tests = min(int(shape.resources.get("CPU", 0)), shape.threads)
        out.append(PoolMemory(name, given, source, tests, shape.resources.get("GPU", 0) > 0))
    return out


def _given(cfg: ClusterConfig, name: str, shape: PoolShape,
           shapes: Iterable[PoolShape]) -> tuple[int, str]:
    if cfg.kind == "slurm" and cfg.slurm is not None:
        memory = getattr(cfg.slurm, name).memory
        return (parse_bytes(memory) // shape.processes,
                f"slurm.{name}.memory {memory} / {shape.processes} process(es)")
    if cfg.kind == "kubernetes" and cfg.kubernetes is not None:
        memory = getattr(cfg.kubernetes, name).memory
        return parse_bytes(memory), f"kubernetes.{name}.memory {memory} per pod"
    limit = cfg.local.memory_limit
    if shape.in_process:  # one process: the sweep's own, its workers threads of it
        return MEMORY_LIMIT, f"this machine's {size_text(MEMORY_LIMIT)}, one process"
    if limit != "auto":
        return parse_bytes(limit), f"local.memory_limit {limit}"
    total = sum(s.workers for s in shapes)
    return (MEMORY_LIMIT // max(total, 1),
            f"local.memory_limit auto: {size_text(MEMORY_LIMIT)} / {total} processes")


ADDRESS_POOLS = [PoolMemory("test workers", None, "yours: dask worker --memory-limit", 1, False),
                 PoolMemory("extraction workers", None, "yours: dask worker --memory-limit", 0,
                            True)]
"""`kind: address`: the workers are started by hand; what each side needs is said."""


@dataclass(frozen=True)
class Need:
    """One side's largest need per worker process of a pool, and the model that sets it."""

    side: str  # "tests" or "extraction"
    bytes: int
    model: str
    what: str
    estimate: bool = False


def pool_needs(pool: PoolMemory, models: Iterable[SizedModel]) -> list[Need]:
    """What one worker process of `pool` needs at most over `models`, per side it runs."""
    models = list(models)
    needs = []
    if pool.tests and models:
        worst = max(models, key=peak_of_a_test_task)
        task = peak_of_a_test_task(worst)
        needs.append(Need("tests", int(_v("TEST_WORKER") * MIB) + pool.tests * task, worst.name,
                          f"a test worker {_v('TEST_WORKER'):.0f} MiB + {pool.tests} x "
                          f"{size_text(task)}, the peak of a test task at T = {worst.t_max}, "
                          f"{worst.n_layers} layers"))
    if pool.extracts and models:
        worst = max(models, key=extraction_bytes)
        weights = weight_bytes(worst)
        held = (f"{size_text(weights)} of weights (width {worst.width}, {worst.dtype})"
                if weights is not None else "+ the model's weights (width unknown)")
        needs.append(Need("extraction", extraction_bytes(worst), worst.name,
                          f"torch and its family, batch {worst.batch_size} at T = "
                          f"{worst.t_max}, {held}", estimate=True))
    return needs


def memory_data(cfg: ClusterConfig, models: list[SizedModel]) -> dict[str, object]:
    """Per pool: bytes given per worker process and how, and per side it runs the bytes needed,
    the model that sets them and whether the pool gives less (`short`); for `address` (pools
    unknown), the needs of a test worker and of an extraction worker."""
    pools = pool_memory(cfg) or ADDRESS_POOLS
    return {pool.name: {
        "given_bytes": pool.given, "given_by": pool.source,
        "needs": {need.side: {"bytes": need.bytes, "model": need.model,
                              "estimate": need.estimate,
                              "short": pool.given is not None and pool.given < need.bytes}
                  for need in pool_needs(pool, models)}} for pool in pools}


def memory_lines(cfg: ClusterConfig, models: list[SizedModel], figures: bool = False) -> list[str]:
    """`sweep plan --cluster`'s lines: per pool, memory per worker process given and needed
    (from MEMORY), a WARNING line for each pool that gives less, and (`figures`) the figures
    with their sources."""
    lines = ["memory per worker process (from measured figures and estimates: "
             "sweep/clusters/memory.py MEMORY):"]
    pools = pool_memory(cfg)
    if pools is None:
        pools = ADDRESS_POOLS
        lines.append("  kind: address: start each worker with --memory-limit at least:")
    warnings = []
    for pool in pools:
        needs = pool_needs(pool, models)
        if pool.given is not None:
            lines.append(f"  pool {pool.name}: {size_text(pool.given)} given ({pool.source})")
        else:
            lines.append(f"  {pool.name}:")
        for need in needs:
            mark = " (estimate)" if need.estimate else ""
            lines.append(f"    {need.side}: needs {size_text(need.bytes)}{mark} for "
                         f"{need.model}: {need.what}")
            if pool.given is not None and pool.given < need.bytes:
                short = math.ceil((need.bytes - pool.given) / MIB)
                warnings.append(
                    f"WARNING: pool {pool.name} gives a worker process "
                    f"{size_text(pool.given)}, {short} MiB less than its {need.side} of "
                    f"{need.model} need ({size_text(need.bytes)}{mark}): raise its memory "
                    f"or run fewer processes in it")
    lines += warnings
    if figures:
        lines.append("memory figures (value, unit, where measured; ESTIMATE: not measured):")
        lines += [line for name, figure in MEMORY.items() for line in figure.lines(name)]
    return lines

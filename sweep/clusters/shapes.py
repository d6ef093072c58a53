"""What each pool of a cluster file starts, in numbers: units (jobs, pods, workers), worker
processes per unit, threads per process, resources per process. `sweep plan --cluster` prints
it and `sweep.driver.balance` sizes the stages from it."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from sweep.clusters.config import (
    ClusterConfig,
    kubernetes_resources,
    slurm_resources,
    worker_processes,
)
from sweep.clusters.local import cuda_devices, local_pools, use_processes


@dataclass(frozen=True)
class PoolShape:
    """One pool: `units` jobs (slurm), pods (kubernetes) or workers (local), each running
    `processes` worker processes of `threads` threads that carry `resources` each."""

    units: int
    unit: str
    processes: int
    threads: int
    resources: dict[str, float]
    in_process: bool = False  # local workers as threads of the sweep's own process

    @property
    def workers(self) -> int:
        """Worker processes of the pool (Dask workers)."""
        return self.units * self.processes

    def line(self, name: str) -> str:
        """'pool cpu: 4 job(s) x 16 worker process(es) x 1 thread(s) = 64 worker thread(s),
        resources {'CPU': 1.0} per worker'."""
        kind = "worker thread(s) of the sweep" if self.in_process else "worker process(es)"
        return (f"pool {name}: {self.units} {self.unit}(s) x {self.processes} {kind} x "
                f"{self.threads} thread(s) = {self.workers * self.threads} worker thread(s), "
                f"resources {self.resources} per worker")


def pool_shapes(cfg: ClusterConfig, cpu_count: int | None = None,
                devices: Sequence[int] | None = None) -> dict[str, PoolShape] | None:
    """Each pool's shape; None for `address` (an existing cluster: its workers are its own).
    `cpu_count` and `devices` size the local default (this machine's, when None)."""
    if cfg.kind == "local":
        count = cpu_count if cpu_count is not None else os.cpu_count() or 1
        found = tuple(devices) if devices is not None else cuda_devices(cfg.local.gpus)
        pools = local_pools(cfg.local, count, found)
        threads = not use_processes(cfg.local, pools)
        return {name: PoolShape(units=pool.workers, unit="worker", processes=1,
                                threads=pool.threads, resources=dict(pool.resources),
                                in_process=threads)
                for name, pool in pools.items()}
    if cfg.kind == "slurm" and cfg.slurm is not None:
        shapes = {}
        for name in ("gpu", "cpu"):
            pool = getattr(cfg.slurm, name)
            processes = worker_processes(name, pool)
            shapes[name] = PoolShape(units=pool.jobs, unit="job", processes=processes,
                                     threads=pool.cores // processes,
                                     resources=slurm_resources(name, pool))
        return shapes
    if cfg.kind == "kubernetes" and cfg.kubernetes is not None:
        return {name: PoolShape(units=pool.workers, unit="pod", processes=1,
                                threads=pool.threads, resources=kubernetes_resources(name, pool))
                for name, pool in (("gpu", cfg.kubernetes.gpu), ("cpu", cfg.kubernetes.cpu))}
    return None

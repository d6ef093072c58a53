"""Where the sweep runs: load `cluster.yaml`, open a `distributed.Client` on the chosen kind.

Kinds (one module each under `sweep/clusters/`): `local` (the default, sized to this machine),
`address` (an existing scheduler), `slurm` (dask-jobqueue, GPU and CPU pools of worker jobs),
`kubernetes` (dask-kubernetes operator, a worker group per pool). Every worker carries Dask
resources; tasks tagged `resources={"GPU": 1}` (extraction) and `{"CPU": 1}` (tests, baselines)
land on the pools that carry them.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any, TextIO

import dask
import yaml
from distributed import Client

from storage.errors import InputError
from storage.location import StoreRef
from sweep.clusters.config import ClusterConfig, load_cluster_config
from sweep.clusters.kubernetes import kubernetes_specs, start_kubernetes
from sweep.clusters.local import (
    cuda_devices,
    exposure_warning,
    local_pools,
    start_local,
    use_processes,
)
from sweep.clusters.masking import masked, masked_text
from sweep.clusters.shapes import pool_shapes
from sweep.clusters.slurm import job_scripts, start_slurm
from sweep.terminal.quiet_logs import quiet_shutdown, restored_log_levels

__all__ = [
    "ClusterConfig",
    "check_store_fits_cluster",
    "describe_cluster",
    "kubernetes_specs",
    "load_cluster_config",
    "open_client",
]


def _dask_settings(cfg: ClusterConfig) -> dict[str, Any]:
    settings: dict[str, Any] = {"distributed.scheduler.allowed-failures": cfg.allowed_failures}
    if cfg.kind == "slurm" and cfg.slurm is not None:
        settings["distributed.deploy.lost-worker-timeout"] = cfg.slurm.lost_job_timeout
    return settings


@contextmanager
def open_client(cfg: ClusterConfig, *, out: TextIO | None = None,
                restore_logs: bool = True) -> Iterator[Client]:
    """Start (or reach) the cluster `cfg` describes and yield a Client; close both on exit.

    Prints one line with the dashboard address to `out` (default stderr). Closing silences
    Dask's loggers in this process (`sweep.terminal.quiet_logs`) until both are closed, or for good
    with `restore_logs=False` (`sweep run`, which exits soon after: asyncio logs a future the close
    left unretrieved whenever it is collected, even after the close).
    """
    out = out if out is not None else sys.stderr
    with ExitStack() as stack:
        if restore_logs:
            stack.enter_context(restored_log_levels())
        stack.enter_context(dask.config.set(_dask_settings(cfg)))
        if cfg.kind == "address":
            client = stack.enter_context(_address_client(cfg))
        else:
            with warnings.catch_warnings():  # another cluster on 8787: the line below says where
                warnings.filterwarnings("ignore", message="Port .* is already in use")
                cluster = stack.enter_context(_start_cluster(cfg))
            client = stack.enter_context(Client(cluster))
        stack.callback(quiet_shutdown)  # first on the way out: closing logs are no fault
        link = client.dashboard_link or "unavailable (install bokeh>=3.1 to serve it)"
        print(f"sweep: {cfg.kind} cluster, dashboard {link}", file=out)
        if (warning := exposure_warning(cfg)) is not None:
            print(warning, file=out)
        yield client


def _start_cluster(cfg: ClusterConfig) -> Any:
    if cfg.kind == "local":
        return start_local(cfg)
    if cfg.kind == "slurm":
        return start_slurm(cfg)
    return start_kubernetes(cfg)


@contextmanager
def _address_client(cfg: ClusterConfig) -> Iterator[Client]:
    """Connect to an existing scheduler and apply `allowed_failures` to it."""
    address = cfg.address
    if address is None:
        raise ValueError("an address config needs an address: block")
    target = address.scheduler or address.scheduler_file
    try:
        if address.scheduler_file is not None:
            client = Client(scheduler_file=address.scheduler_file, timeout=address.timeout)
        else:
            client = Client(address.scheduler, timeout=address.timeout)
    except (OSError, TimeoutError) as error:
        raise InputError(
            f"address: cannot reach the scheduler at {target} within {address.timeout} "
            f"({type(error).__name__}); start it or fix address.scheduler / scheduler_file"
        ) from None
    with client:
        client.run_on_scheduler(_set_allowed_failures, n=cfg.allowed_failures)
        yield client


def _set_allowed_failures(dask_scheduler: Any, n: int) -> None:
    dask_scheduler.allowed_failures = n


def check_store_fits_cluster(cfg: ClusterConfig, store: StoreRef) -> None:
    """InputError if the cluster's workers cannot reach the store: Kubernetes pods share no
    folder with the driver (their store must be an object store URL), and a `memory://` store
    lives in the driver's process (only a local cluster of threads shares it)."""
    if cfg.kind == "kubernetes" and (store.is_local or store.scheme == "memory"):
        raise InputError(
            f"store {store}: Kubernetes workers share no folder with the driver; put the store "
            f"on an object store (store: s3://BUCKET/PATH.zarr, docs/storage.md)")
    if store.scheme == "memory":
        threads = cfg.kind == "local" and not use_processes(
            cfg.local, local_pools(cfg.local, os.cpu_count() or 1, cuda_devices(cfg.local.gpus)))
        if not threads:
            raise InputError(
                f"store {store}: a memory:// store lives in this process; run with "
                f"--in-process or a local cluster of threads (local: processes: false)")


def describe_cluster(cfg: ClusterConfig) -> str:
    """A dry-run description: the resolved config, each pool's worker processes x threads
    (`sweep.clusters.shapes`) and what would be started (scripts, specs), secret-looking
    environment values masked (`sweep.clusters.masking`)."""
    chosen = masked(cfg.model_dump(mode="json", include={"kind", "allowed_failures",
                                                          "dashboard_address", cfg.kind}))
    lines = [f"cluster kind: {cfg.kind}", yaml.safe_dump(chosen, sort_keys=False)]
    shapes = pool_shapes(cfg)
    if shapes is None:
        lines.append("pools: the running cluster's own workers (start CPU workers as "
                     "`dask worker ADDRESS --nworkers C --nthreads 1 --resources CPU=1`)")
    else:
        lines += [shape.line(name) for name, shape in shapes.items()]
    if cfg.kind == "slurm" and cfg.slurm is not None:
        for name, script in job_scripts(cfg.slurm).items():
            jobs = getattr(cfg.slurm, name).jobs
            lines += [f"# pool {name}: {jobs} job(s), each running:", masked_text(script)]
    elif cfg.kind == "kubernetes":
        lines.append(yaml.safe_dump_all(masked(kubernetes_specs(cfg)), sort_keys=False))
    return "\n".join(lines)

"""The local kind: a `distributed` SpecCluster of Nanny workers on this machine, one spec per pool.

Machine-sized default (no `pools:`): with CUDA devices, one GPU worker per device (pinned with
CUDA_VISIBLE_DEVICES, `gpu_threads` threads for its extraction pipeline) and CPU workers on the
remaining cores; without, every worker carries both
labels, so extraction runs on CPU workers that hold a `GPU` resource of 1 (one model pass at a
time per worker) and the test tasks share the same cores. Either way a CPU worker is one
single-threaded process per core (`threads: 1`), unless the config says otherwise.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
from collections.abc import Sequence

from distributed import Nanny, Scheduler, Security, SpecCluster, Worker
from distributed.comm.addressing import unparse_host_port
from distributed.system import MEMORY_LIMIT

from storage.errors import EnvironmentFault, InputError
from sweep.clusters.config import THREAD_VARIABLES, ClusterConfig, Gpus, LocalConfig, LocalPool


def cuda_devices(gpus: Gpus) -> tuple[int, ...]:
    """The CUDA device indices to give GPU workers: the configured list, or all torch sees."""
    if gpus != "auto":
        return tuple(gpus)
    import torch

    return tuple(range(torch.cuda.device_count())) if torch.cuda.is_available() else ()


def local_pools(cfg: LocalConfig, cpu_count: int, devices: Sequence[int]) -> dict[str, LocalPool]:
    """Resolve the pools to start: the configured ones, else a default sized to the machine."""
    if cfg.pools is not None:
        return dict(cfg.pools)
    if devices:
        # each GPU worker's extraction pipeline runs on its threads (`gpu_threads`, at most half
        # the cores per GPU: the test workers need the rest)
        threads = max(1, min(cfg.gpu_threads, cpu_count // (2 * len(devices))))
        pools = {
            f"gpu{device}": LocalPool(
                workers=1, threads=threads, resources={"GPU": 1.0},
                env={"CUDA_VISIBLE_DEVICES": str(device)},
            )
            for device in devices
        }
        spare = max(1, (cpu_count - threads * len(devices)) // cfg.threads)
        pools["cpu"] = LocalPool(
            workers=spare, threads=cfg.threads, resources={"CPU": float(cfg.threads)},
            env={"CUDA_VISIBLE_DEVICES": ""},
        )
        return pools
    workers = max(1, cpu_count // cfg.threads)
    return {
        "cpu": LocalPool(
            workers=workers, threads=cfg.threads,
            resources={"GPU": 1.0, "CPU": float(cfg.threads)},
        )
    }


def use_processes(cfg: LocalConfig, pools: dict[str, LocalPool]) -> bool:
    """Whether the workers are processes (Nanny) or threads of this process (Worker).

    `auto`: processes whenever there is more than one worker, or a pool has an environment of
    its own, or pools are explicit: a process's test tasks take turns at its kernel and BLAS
    locks (`workers.exact.equality`), so two workers in one process do the work of little more
    than one. Threads (`auto` with one worker: a one-core machine, or `threads` >= its cores)
    skip the worker's start-up, imports and model load, but a worker crash is the sweep's crash
    and no per-pool environment (CUDA_VISIBLE_DEVICES, THREAD_VARIABLES) can apply.
    """
    if cfg.processes == "auto":
        workers = sum(pool.workers for pool in pools.values())
        return cfg.pools is not None or workers > 1 or any(pool.env for pool in pools.values())
    if not cfg.processes and any(pool.env for pool in pools.values()):
        raise InputError(
            "local: processes: false runs every worker in one process, so a pool's env "
            "(e.g. CUDA_VISIBLE_DEVICES) cannot apply: drop the env or use processes: true"
        )
    return cfg.processes


def worker_specs(pools: dict[str, LocalPool], memory_limit: str, processes: bool = True,
                 host: str = "127.0.0.1", security: Security | None = None
                 ) -> dict[str, dict]:
    """SpecCluster worker specs named `<pool>-<i>`, with resources, threads and thread env vars
    (processes), or in-process `Worker`s with resources and threads (threads: they share this
    process's memory, so `auto` gives each the whole machine's limit). Every listener (a
    nanny's, its worker's, the worker's HTTP server) binds `host`, with `security` (TLS when
    Dask's configuration asks for it)."""
    total = sum(pool.workers for pool in pools.values())
    if memory_limit == "auto":
        memory_limit = str(MEMORY_LIMIT // max(total, 1) if processes else MEMORY_LIMIT)
    specs = {}
    for name, pool in pools.items():
        options = {
            "nthreads": pool.threads,
            "resources": dict(pool.resources),
            "memory_limit": memory_limit,
            "silence_logs": logging.WARNING,
            "host": host,  # a Nanny passes it to its worker (else: every interface)
            "security": security,
        }
        if processes:
            env = {name: str(pool.threads) for name in THREAD_VARIABLES}
            options["env"] = {**env, **pool.env}
        for i in range(pool.workers):
            specs[f"{name}-{i}"] = {
                "cls": Nanny if processes else Worker,
                "options": {**options, "resources": dict(pool.resources)},  # one dict per worker
            }
    return specs


def bound_dashboard(dashboard_address: str, host: str) -> str:
    """The dashboard's address with `host` where it names none (`:8787`, `8787`): distributed
    binds a host-less dashboard to every interface."""
    head, sep, port = dashboard_address.rpartition(":")
    if head or not port.isdigit():
        return dashboard_address
    return unparse_host_port(host, int(port))


def exposure_warning(cfg: ClusterConfig) -> str | None:
    """A line to print when the local cluster listens off loopback without TLS: anyone who
    reaches a worker can run code in it (docs/faults.md, "Who can reach the local cluster")."""
    host = cfg.local.host.strip("[]")
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if cfg.kind != "local" or loopback or Security().require_encryption:
        return None
    return (f"sweep: warning: the local cluster listens on {cfg.local.host} without TLS: anyone "
            f"who reaches it can run code in this sweep; require TLS in Dask's configuration "
            f"(docs/faults.md, \"Who can reach the local cluster\") or set local.host: 127.0.0.1")


def check_listen_host(cfg: ClusterConfig) -> None:
    """EnvironmentFault (one line) when the local kind's `local.host` is no address this machine
    can listen on (one that is not its own, a name that does not resolve): found by binding a
    socket there, a free port, closed at once, before any store or cluster exists."""
    if cfg.kind != "local":
        return
    host = cfg.local.host.strip("[]")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.bind(address)
    except OSError as error:
        raise EnvironmentFault(
            f"cluster local.host {cfg.local.host}: this machine cannot listen there "
            f"({error.strerror or error}); set local.host to one of its own addresses "
            f"(127.0.0.1, the default, keeps the cluster on this machine)") from None


def start_local(cfg: ClusterConfig) -> SpecCluster:
    """Start the local cluster described by `cfg.local`, every listener bound to
    `cfg.local.host` (loopback unless the cluster file says otherwise) and speaking TLS when
    Dask's configuration asks for it (`distributed.comm.require-encryption`, docs/faults.md);
    the caller closes it."""
    pools = local_pools(cfg.local, os.cpu_count() or 1, cuda_devices(cfg.local.gpus))
    host, security = cfg.local.host, Security()  # Security(): the TLS settings of Dask's config
    scheduler = {
        "cls": Scheduler,
        "options": {"host": host, "security": security,
                    "dashboard_address": bound_dashboard(cfg.dashboard_address, host)},
    }
    processes = use_processes(cfg.local, pools)
    return SpecCluster(
        workers=worker_specs(pools, cfg.local.memory_limit, processes, host, security),
        security=security,
        scheduler=scheduler,
        silence_logs=logging.WARNING,
        name="sweep-local",
    )

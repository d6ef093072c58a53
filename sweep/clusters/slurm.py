"""The slurm kind: dask-jobqueue, one scheduler here and two pools of worker jobs (GPU and CPU).

How two pools share one scheduler: `SLURMCluster` is a `distributed.SpecCluster`, whose public
`worker_spec` maps a job name to `{"cls": SLURMJob, "options": job keywords}`; each entry is
one `sbatch` job. A GPU job runs one worker of `cores` threads; a CPU job runs `cores`
single-threaded worker processes (`processes=cores`, dask's `--nworkers`), named `cpu-<i>-<k>`,
which its spec lists as its `group` of name suffixes. The cluster is built with the GPU pool's
keywords (this starts the scheduler, bound to `scheduler_host` or `interface`); its
`worker_spec` is then filled with `gpu-<i>` entries from the GPU pool and `cpu-<i>` entries from
the CPU pool, and `scale(jobs=total)` submits them. SpecCluster starts heterogeneous specs as
given, and a scale to the current total trims nothing. Each worker's `--resources` are its
pool's, so the scheduler sends GPU-tagged tasks to GPU jobs and CPU-tagged tasks to CPU jobs.

Before submitting, `sbatch --test-only` checks each pool's script, so a wrong partition, account
or gres is a one-line error instead of a sweep that waits forever for workers.

Pre-emption: a cancelled job (scancel, walltime, pre-emption) takes its workers away; the
scheduler reschedules their tasks (`allowed_failures` bounds how many deaths one task
survives). After `lost_job_timeout` SpecCluster forgets a one-worker job but keeps its spec;
a job of several workers is forgotten here once none of its workers has been seen for a
`lost_job_timeout` (SpecCluster matches a lost worker's name to a job only without a group).
A periodic `scale(jobs=total)` (`replace_lost_jobs`) then resubmits the job.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dask.utils import parse_timedelta

from sweep.terminal.interrupts import sigint_pinned

if TYPE_CHECKING:
    from dask_jobqueue import SLURMCluster
from distributed.core import Status
from tornado.ioloop import PeriodicCallback

from storage.errors import InputError
from sweep.clusters.config import (
    THREAD_VARIABLES,
    ClusterConfig,
    SlurmConfig,
    SlurmPool,
    slurm_resources,
    worker_processes,
)

POOLS = ("gpu", "cpu")


def job_options(slurm: SlurmConfig, pool_name: str) -> dict[str, Any]:
    """SLURMJob keywords for one worker job of a pool: directives, worker processes (each with
    its share of the cores and memory, and its thread variables), resources, python, dirs."""
    pool: SlurmPool = getattr(slurm, pool_name)
    resources = ",".join(f"{k}={v:g}" for k, v in slurm_resources(pool_name, pool).items())
    processes = worker_processes(pool_name, pool)
    threads = pool.cores // processes
    return {
        "cores": pool.cores,
        "memory": pool.memory,
        "processes": processes,
        "queue": pool.queue,
        "account": pool.account,
        "walltime": pool.walltime,
        "job_extra_directives": list(pool.job_extra_directives),
        "job_script_prologue": [f"export {name}={threads}" for name in THREAD_VARIABLES]
        + list(pool.job_script_prologue),  # the pool's own lines last: they may override
        "worker_extra_args": ["--resources", resources],
        "python": slurm.python or sys.executable,
        "local_directory": slurm.local_directory,
        "log_directory": slurm.log_directory,
        "death_timeout": slurm.death_timeout,
        "job_name": f"sweep-{pool_name}",
        "interface": slurm.interface,
    }


def job_scripts(slurm: SlurmConfig, scheduler: str = "tcp://<scheduler>:8786") -> dict[str, str]:
    """The batch script each pool submits per worker (for dry runs and `sweep plan`)."""
    job = _jobqueue().SLURMJob
    return {
        name: job(scheduler, name=f"{name}-0", **job_options(slurm, name)).job_script()
        for name in POOLS
    }


def check_job_scripts(slurm: SlurmConfig) -> None:
    """Ask SLURM (`sbatch --test-only`) whether each pool's job would be accepted; a refusal is
    an InputError naming the pool and SLURM's reason, before anything is submitted."""
    with tempfile.TemporaryDirectory() as folder:
        for name, script in job_scripts(slurm).items():
            path = Path(folder) / f"{name}.sh"
            path.write_text(script)
            test = subprocess.run(
                ["sbatch", "--test-only", str(path)], capture_output=True, text=True, timeout=60
            )
            if test.returncode != 0:
                reason = next(
                    (line for line in test.stderr.splitlines() if "error" in line.lower()),
                    test.stderr.strip() or f"exit code {test.returncode}",
                )
                raise InputError(
                    f"slurm.{name}: SLURM refuses this pool's job ({reason.strip()}); fix "
                    f"slurm.{name} (queue, account, cores, memory, walltime, job_extra_directives)"
                )


def _jobqueue() -> Any:
    """`dask_jobqueue.slurm`, imported on first use: its import would replace the SIGINT handler
    with a silent `sys.exit()` (exit 0 on Ctrl-C), so it runs with the handler pinned."""
    with sigint_pinned():
        import dask_jobqueue.slurm
    return dask_jobqueue.slurm


def start_slurm(cfg: ClusterConfig) -> SLURMCluster:
    """Start the scheduler here and submit every pool's worker jobs; the caller closes it."""
    slurm = cfg.slurm
    if slurm is None:
        raise ValueError("start_slurm needs a config with a slurm: block")
    if shutil.which("sbatch") is None:
        raise InputError(
            "kind: slurm, but sbatch is not on PATH; run on a SLURM login node "
            "(or .ci/slurm-up.sh here), or choose another kind in the cluster file"
        )
    check_job_scripts(slurm)
    scheduler_options: dict[str, Any] = {"dashboard_address": cfg.dashboard_address}
    if slurm.scheduler_host is not None:
        scheduler_options["host"] = slurm.scheduler_host
    jobqueue = _jobqueue()
    cluster = jobqueue.SLURMCluster(**job_options(slurm, "gpu"),
                                    scheduler_options=scheduler_options)
    for name in POOLS:
        options = {
            **job_options(slurm, name), "config_name": "slurm", "protocol": None, "security": None
        }
        spec: dict[str, Any] = {"cls": jobqueue.SLURMJob, "options": options}
        if options["processes"] > 1:  # the job's workers are named <job>-0, <job>-1, ...
            spec["group"] = [f"-{k}" for k in range(options["processes"])]
        for i in range(getattr(slurm, name).jobs):
            cluster.worker_spec[f"{name}-{i}"] = dict(spec)
    cluster.scale(jobs=len(cluster.worker_spec))
    if slurm.replace_lost_jobs:
        _keep_jobs_submitted(cluster, interval_s=parse_timedelta(slurm.lost_job_timeout))
    return cluster


def lost_jobs(groups: dict[str, list[str]], connected: set[str],
              misses: dict[str, int]) -> list[str]:
    """Jobs of several workers (job name -> its workers' name suffixes) that lost them all: of
    the jobs whose workers connected once, those none of whose workers is `connected` at this
    call nor at the one before. `misses` (job -> calls since one was last connected) is this
    function's memory between calls, updated here."""
    lost = []
    for job, suffixes in groups.items():
        if any(job + suffix in connected for suffix in suffixes):
            misses[job] = 0
        elif job in misses:
            misses[job] += 1
            if misses[job] >= 2:
                lost.append(job)
                del misses[job]
    return lost


def _keep_jobs_submitted(cluster: SLURMCluster, interval_s: float) -> None:
    """Every `interval_s`, forget the jobs of several workers that lost them all (`lost_jobs`;
    SpecCluster forgets one-worker jobs itself) and resubmit every forgotten job (closed with
    the cluster)."""
    misses: dict[str, int] = {}
    closing: set[asyncio.Task] = set()

    def resubmit() -> None:
        if cluster.status != Status.running:
            return
        groups = {name: cluster.worker_spec[name]["group"] for name in cluster.workers
                  if "group" in cluster.worker_spec.get(name, {})}
        connected = {w["name"] for w in cluster.scheduler_info.get("workers", {}).values()}
        for job in lost_jobs(groups, connected, misses):
            task = asyncio.ensure_future(cluster.workers.pop(job).close())  # scancel, if any
            closing.add(task)
            task.add_done_callback(closing.discard)
        cluster.scale(jobs=len(cluster.worker_spec))

    callback = PeriodicCallback(resubmit, interval_s * 1000)
    cluster.periodic_callbacks["sweep-replace-lost-jobs"] = callback
    cluster.loop.add_callback(callback.start)

"""The slurm kind: dask-jobqueue, one scheduler here and two pools of worker jobs (GPU and CPU).

How two pools share one scheduler: `SLURMCluster` is a `distributed.SpecCluster`, whose public
`worker_spec` maps a worker name to `{"cls": SLURMJob, "options": job keywords}`; each entry is
one `sbatch` job running one worker (processes=1). The cluster is built with the GPU pool's
keywords (this starts the scheduler, bound to `scheduler_host` or `interface`); its
`worker_spec` is then filled with `gpu-<i>` entries from the GPU pool and `cpu-<i>` entries from
the CPU pool, and `scale(jobs=total)` submits them. SpecCluster starts heterogeneous specs as
given, and a scale to the current total trims nothing. Each worker's `--resources` are its
pool's, so the scheduler sends GPU-tagged tasks to GPU jobs and CPU-tagged tasks to CPU jobs.

Before submitting, `sbatch --test-only` checks each pool's script, so a wrong partition, account
or gres is a one-line error instead of a sweep that waits forever for workers.

Pre-emption: a cancelled job (scancel, walltime, pre-emption) takes its worker away; the
scheduler reschedules that worker's tasks (`allowed_failures` bounds how many deaths one task
survives). After `lost_job_timeout` SpecCluster forgets the worker but keeps its spec, so a
periodic `scale(jobs=total)` (`replace_lost_jobs`) resubmits the job.
"""

from __future__ import annotations

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
)

POOLS = ("gpu", "cpu")


def job_options(slurm: SlurmConfig, pool_name: str) -> dict[str, Any]:
    """SLURMJob keywords for one worker job of a pool: directives, resources, python, dirs."""
    pool: SlurmPool = getattr(slurm, pool_name)
    resources = ",".join(f"{k}={v:g}" for k, v in slurm_resources(pool_name, pool).items())
    return {
        "cores": pool.cores,
        "memory": pool.memory,
        "processes": 1,
        "queue": pool.queue,
        "account": pool.account,
        "walltime": pool.walltime,
        "job_extra_directives": list(pool.job_extra_directives),
        "job_script_prologue": [f"export {name}={pool.cores}" for name in THREAD_VARIABLES]
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
        for i in range(getattr(slurm, name).jobs):
            cluster.worker_spec[f"{name}-{i}"] = {"cls": jobqueue.SLURMJob, "options": options}
    cluster.scale(jobs=len(cluster.worker_spec))
    if slurm.replace_lost_jobs:
        _keep_jobs_submitted(cluster, interval_s=parse_timedelta(slurm.lost_job_timeout))
    return cluster


def _keep_jobs_submitted(cluster: SLURMCluster, interval_s: float) -> None:
    """Every `interval_s`, resubmit the jobs of workers the cluster lost (closed with it)."""

    def resubmit() -> None:
        if cluster.status == Status.running:
            cluster.scale(jobs=len(cluster.worker_spec))

    callback = PeriodicCallback(resubmit, interval_s * 1000)
    cluster.periodic_callbacks["sweep-replace-lost-jobs"] = callback
    cluster.loop.add_callback(callback.start)

"""SLURM for real (needs .ci/slurm-up.sh): dask-jobqueue worker jobs in a GPU pool and a CPU pool
on one scheduler, and pre-emptions (`scancel` of worker jobs mid-work) that the work survives:
the lost tasks rerun, the cancelled jobs are replaced, and a sweep run through SLURM this way
stores the same values as an uninterrupted in-process run."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from distributed import as_completed, get_worker

from storage.errors import InputError
from storage.layout import BOOKKEEPING_DIR
from sweep.clusters.client import ClusterConfig, load_cluster_config, open_client
from sweep.config.load import load_config
from sweep.driver.graph import DaskExecutor
from sweep.driver.runner import InProcessExecutor, run_sweep
from tests.store_fixtures import stored_arrays

REPO = Path(__file__).resolve().parents[1]


def slurm_unavailable() -> str | None:
    """Why SLURM cannot be used here, or None when a node is idle."""
    if shutil.which("sinfo") is None:
        return "sinfo not found: run .ci/slurm-up.sh to install and start a single-node SLURM"
    states = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%t"], capture_output=True, text=True, timeout=30
    )
    if states.returncode != 0 or "idle" not in states.stdout.split():
        shown = (states.stdout + states.stderr).strip() or "no nodes"
        return f"sinfo shows no idle node ({shown}): run .ci/slurm-up.sh"
    return None


SKIP_REASON = slurm_unavailable()
needs_slurm = pytest.mark.skipif(SKIP_REASON is not None, reason=SKIP_REASON or "")
pytestmark = [pytest.mark.slurm, pytest.mark.timeout(300)]


def slurm_config(tmp_path: Path) -> ClusterConfig:
    """One 1-core job per pool (the test node has 2 cores); workers run this venv's python."""
    pool = {
        "jobs": 1, "cores": 1, "memory": "2GB", "walltime": "00:15:00",
        "job_script_prologue": [f"export PYTHONPATH={REPO}"],
    }
    return ClusterConfig.model_validate({
        "kind": "slurm",
        "allowed_failures": 3,
        "dashboard_address": ":0",
        "slurm": {
            "scheduler_host": "127.0.0.1",
            "python": sys.executable,
            "local_directory": str(tmp_path / "scratch"),
            "log_directory": str(tmp_path / "logs"),
            "lost_job_timeout": "2s",
            "death_timeout": 30,
            "gpu": pool,
            "cpu": pool,
        },
    })


@needs_slurm
def test_a_job_slurm_would_refuse_is_a_one_line_error_before_submitting(tmp_path):
    raw = slurm_config(tmp_path).model_dump()
    raw["slurm"]["cpu"]["queue"] = "no-such-partition"
    with pytest.raises(InputError) as caught:
        with open_client(ClusterConfig.model_validate(raw), out=io.StringIO()):
            pass
    message = str(caught.value)
    assert message.startswith("slurm.cpu: SLURM refuses this pool's job (")
    assert "partition" in message and "\n" not in message
    assert our_jobs() == []


def square_slowly(i: int) -> tuple[int, int, str, str]:
    """i, i², the worker's name and its SLURM job id."""
    time.sleep(0.4)
    return i, i * i, get_worker().name, os.environ["SLURM_JOB_ID"]


def our_jobs(pools: tuple[str, ...] = ("gpu", "cpu"), state: str | None = None) -> list[str]:
    """Ids of the sweep's worker jobs of `pools` still in the queue (or in `state`, e.g. R)."""
    names = ",".join(f"sweep-{pool}" for pool in pools)
    states = [f"--states={state}"] if state else []  # default: pending, running, completing
    out = subprocess.run(
        ["squeue", "-h", "-o", "%i", f"--name={names}", *states],
        capture_output=True, text=True, check=True,
    ).stdout
    return out.split()


@needs_slurm
def test_pools_run_as_slurm_jobs_and_survive_a_preemption(tmp_path):
    assert our_jobs() == [], "sweep-* jobs left over from an earlier run: scancel them"
    with open_client(slurm_config(tmp_path), out=io.StringIO()) as client:
        client.wait_for_workers(2, timeout=120)
        workers = client.scheduler_info()["workers"].values()
        assert {w["name"]: w["resources"] for w in workers} == {
            "gpu-0": {"GPU": 1.0}, "cpu-0": {"CPU": 1.0}
        }
        extraction = client.map(square_slowly, range(4), resources={"GPU": 1}, key="extract")
        tests = client.map(square_slowly, range(24), resources={"CPU": 1}, key="test")

        done, cancelled = [], None
        for future in as_completed(tests):
            done.append(future.result())
            if len(done) == 3:  # pre-empt the CPU pool's job mid-work
                cancelled = done[0][3]
                subprocess.run(["scancel", cancelled], check=True)
        landed_extraction = client.gather(extraction)

    assert sorted(r[:2] for r in done) == [(i, i * i) for i in range(24)]
    assert {r[2] for r in done} == {"cpu-0"}
    assert {r[2] for r in landed_extraction} == {"gpu-0"}
    test_jobs = {r[3] for r in done}
    assert cancelled in test_jobs and len(test_jobs) == 2, "the cancelled job was not replaced"
    assert {r[3] for r in landed_extraction}.isdisjoint(test_jobs)
    deadline = time.monotonic() + 30
    while our_jobs() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert our_jobs() == [], "closing the client left worker jobs in the queue"


SWEEP = """\
store: sweep.zarr
shard_size: 2
retries: 2
cache_dir: cache
datasets:
  photos: {source: 'sklearn:sample_images', limit: 6}
  topics: {source: 'pydoc:topics', limit: 6}
models:
  vit: {source: tiny-deit-distilled, dataset: photos}
  rob: {source: tiny-roberta, dataset: topics, batch_size: 2}
baseline: {sizes: [2, 5], trials: 4000, seed: 3, chunk_trials: 1000}
"""


def sweep_config(folder: Path):
    folder.mkdir()
    (folder / "sweep.yaml").write_text(SWEEP)
    return load_config(folder / "sweep.yaml")


class Preempter(threading.Thread):
    """Cancels the running job of `pool` as soon as the first `stage` task of the sweep is
    done, and records how many such tasks were done at that moment."""

    def __init__(self, store: Path, pool: str, stage: str) -> None:
        super().__init__(daemon=True)
        self.pattern = f"{BOOKKEEPING_DIR}/markers/*/{stage}-*.done"
        self.store, self.pool = Path(store), pool
        self.cancelled: str | None = None
        self.done_at_cancel = -1
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            done = len(list(self.store.glob(self.pattern)))
            running = our_jobs((self.pool,), "R")
            if done and running:
                subprocess.run(["scancel", running[0]], check=True)
                self.cancelled, self.done_at_cancel = running[0], done
                return
            time.sleep(0.05)


@needs_slurm
def test_a_sweep_through_slurm_survives_preemptions_with_identical_results(tmp_path):
    assert our_jobs() == [], "sweep-* jobs left over from an earlier run: scancel them"
    reference = sweep_config(tmp_path / "in-process")
    assert run_sweep(reference, InProcessExecutor(), progress=False).exit_code == 0

    config = sweep_config(tmp_path / "slurm")
    with open_client(slurm_config(tmp_path), out=io.StringIO()) as client:
        client.wait_for_workers(2, timeout=120)
        preempt = [Preempter(config.store, "gpu", "extract"),
                   Preempter(config.store, "cpu", "test")]
        for thread in preempt:
            thread.start()
        summary = run_sweep(config, DaskExecutor(client), progress=False)
        for thread in preempt:
            thread.stop.set()
            thread.join()

    assert summary.exit_code == 0 and not summary.failed and not summary.blocked
    n_extract = sum(1 for key in summary.completed if key.startswith("extract-"))
    n_test = sum(1 for key in summary.completed if key.startswith("test-"))
    for p, total in zip(preempt, (n_extract, n_test), strict=True):
        print(f"scancel {p.pool} job {p.cancelled} after {p.done_at_cancel}/{total} done")
    assert [p.cancelled is not None for p in preempt] == [True, True]
    assert 0 < preempt[0].done_at_cancel < n_extract, "the GPU job was not cancelled mid-sweep"
    assert 0 < preempt[1].done_at_cancel < n_test, "the CPU job was not cancelled mid-sweep"
    expected, got = stored_arrays(reference.store), stored_arrays(config.store)
    assert sorted(got) == sorted(expected)
    for key in expected:
        np.testing.assert_array_equal(got[key], expected[key], err_msg=key, strict=True)


def ci_config(tmp_path: Path) -> ClusterConfig:
    """.ci/cluster-slurm.yaml (one 2-core CPU job carrying both labels), its workers on this
    tree and this venv, its logs and scratch under tmp_path."""
    raw = load_cluster_config(REPO / ".ci" / "cluster-slurm.yaml").model_dump()
    raw["dashboard_address"] = ":0"
    raw["slurm"].update(python=sys.executable, local_directory=str(tmp_path / "scratch"),
                        log_directory=str(tmp_path / "logs"), lost_job_timeout="2s",
                        death_timeout=30)
    raw["slurm"]["cpu"]["job_script_prologue"] = [f"export PYTHONPATH={REPO}"]
    return ClusterConfig.model_validate(raw)


def whoami(i: int) -> dict:
    """What a task sees of the worker process it runs in."""
    import numba

    worker = get_worker()
    return {"i": i, "name": worker.name, "pid": os.getpid(), "job": os.environ["SLURM_JOB_ID"],
            "nthreads": worker.state.nthreads, "numba": numba.get_num_threads(),
            "omp": os.environ.get("OMP_NUM_THREADS")}


@needs_slurm
def test_a_two_core_cpu_job_runs_two_single_threaded_workers_and_is_replaced_when_lost(
        tmp_path):
    assert our_jobs() == [], "sweep-* jobs left over from an earlier run: scancel them"
    with open_client(ci_config(tmp_path), out=io.StringIO()) as client:
        client.wait_for_workers(2, timeout=120)
        info = client.scheduler_info()["workers"].values()
        assert sorted(w["name"] for w in info) == ["cpu-0-0", "cpu-0-1"]
        assert all(w["nthreads"] == 1 and w["resources"] == {"GPU": 1.0, "CPU": 1.0}
                   for w in info)
        seen = client.gather(client.map(whoami, range(8), resources={"CPU": 1}, key="who"))
        assert {s["name"] for s in seen} == {"cpu-0-0", "cpu-0-1"}
        assert len({s["pid"] for s in seen}) == 2 and len({s["job"] for s in seen}) == 1
        assert {(s["nthreads"], s["numba"], s["omp"]) for s in seen} == {(1, 1, "1")}

        (job,) = our_jobs(("cpu",))
        subprocess.run(["scancel", job], check=True)  # pre-empt the job: both workers go
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (
                our_jobs(("cpu",), "R") and our_jobs(("cpu",), "R") != [job]
                and len(client.scheduler_info()["workers"]) == 2):
            time.sleep(0.5)
        after = client.gather(client.map(whoami, range(8), resources={"CPU": 1}, key="after"))
    assert {s["name"] for s in after} == {"cpu-0-0", "cpu-0-1"}
    assert {s["job"] for s in after} != {job} and len({s["job"] for s in after}) == 1
    deadline = time.monotonic() + 30
    while our_jobs() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert our_jobs() == [], "closing the client left worker jobs in the queue"


@needs_slurm
def test_a_sweep_on_the_two_core_job_stores_what_one_core_in_process_stores(tmp_path):
    assert our_jobs() == [], "sweep-* jobs left over from an earlier run: scancel them"
    reference = sweep_config(tmp_path / "in-process")
    assert run_sweep(reference, InProcessExecutor(), progress=False).exit_code == 0
    config = sweep_config(tmp_path / "slurm")
    with open_client(ci_config(tmp_path), out=io.StringIO()) as client:
        client.wait_for_workers(2, timeout=120)
        summary = run_sweep(config, DaskExecutor(client), progress=False)
    assert summary.exit_code == 0 and not summary.failed and not summary.blocked
    expected, got = stored_arrays(reference.store), stored_arrays(config.store)
    assert sorted(got) == sorted(expected)
    for key in expected:
        np.testing.assert_array_equal(got[key], expected[key], err_msg=key, strict=True)


S3_SWEEP = """\
store: s3://{root}/slurm.zarr
storage_options: {{endpoint_url: "{endpoint}"}}
shard_size: 2
retries: 2
datasets:
  photos: {{source: 'sklearn:sample_images', limit: 4}}
  wine: {{source: 'sklearn:wine', limit: 4}}
models:
  vit: {{source: tiny-deit-distilled, dataset: photos}}
  ft: {{source: ft-transformer, dataset: wine, options: {{max_epochs: 2, n_blocks: 2}}}}
baseline: {{sizes: [2, 5], trials: 2000, seed: 3, chunk_trials: 1000, nulls: [uniform]}}
matched_nulls: {{trials: 1000, chunk_trials: 1000, nulls: [uniform]}}
"""


def files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


@needs_slurm
@pytest.mark.s3
def test_a_slurm_sweep_on_s3_writes_nothing_outside_the_store_and_the_workers_scratch(
        tmp_path, s3_bucket):
    """Workers start in a folder of their own with a HOME of their own (no folder shared with
    the driver): after the sweep those hold nothing, the driver's folder holds only its config,
    and the store on S3 equals an in-process run's store on a local path."""
    from tests.s3_fixtures import ENDPOINT

    assert our_jobs() == [], "sweep-* jobs left over from an earlier run: scancel them"
    text = S3_SWEEP.format(root=s3_bucket, endpoint=ENDPOINT)
    reference_folder = tmp_path / "reference"
    reference_folder.mkdir()
    (reference_folder / "sweep.yaml").write_text(
        text.replace(f"s3://{s3_bucket}/slurm.zarr", "sweep.zarr"))
    reference = load_config(reference_folder / "sweep.yaml")
    assert run_sweep(reference, InProcessExecutor(), progress=False).exit_code == 0

    driver = tmp_path / "driver"
    driver.mkdir()
    (driver / "sweep.yaml").write_text(text)
    config = load_config(driver / "sweep.yaml")
    home, workdir, scratch = tmp_path / "home", tmp_path / "workdir", tmp_path / "scratch"
    for folder in (home, workdir, scratch):
        folder.mkdir()
    cluster = slurm_config(tmp_path).model_dump()
    for pool in ("gpu", "cpu"):
        cluster["slurm"][pool]["job_script_prologue"] = (
            *cluster["slurm"][pool]["job_script_prologue"],
            f"export HOME={home}", f"cd {workdir}", f"export DOBRUSHIN_CACHE={scratch}/cache")
    with open_client(ClusterConfig.model_validate(cluster), out=io.StringIO()) as client:
        client.wait_for_workers(2, timeout=120)
        summary = run_sweep(config, DaskExecutor(client), progress=False)
    assert summary.exit_code == 0 and not summary.failed, summary.lines()
    assert files_under(home) == [] and files_under(workdir) == []
    assert files_under(driver) == ["sweep.yaml"]
    expected, got = stored_arrays(reference.store), stored_arrays(config.store_ref)
    assert sorted(got) == sorted(expected)
    for key in expected:
        np.testing.assert_array_equal(got[key], expected[key], err_msg=key, strict=True)

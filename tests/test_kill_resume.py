"""Killed at any moment and rerun, a sweep's store ends identical, value for value, to an
uninterrupted run: SIGKILL of the driver (`python -m sweep run` in a subprocess), and a worker
process killed mid-task."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from distributed import Client, LocalCluster

from sweep.config.load import load_config
from sweep.driver.graph import DaskExecutor
from sweep.driver.runner import InProcessExecutor, run_sweep
from tests.test_sweep_local import arrays, assert_same_arrays

REPO = Path(__file__).parents[1]
CLUSTER = """\
kind: local
dashboard_address: ":0"
local:
  pools:
    both: {workers: 2, threads: 1, resources: {GPU: 1, CPU: 1}}
"""


def write_config(folder: Path, cache: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "sweep.yaml"
    path.write_text(f"""\
store: sweep.zarr
shard_size: 2
cache_dir: {cache}
datasets:
  photos: {{source: 'sklearn:sample_images', limit: 12}}
  wine: {{source: 'sklearn:wine', limit: 16}}
models:
  vit: {{source: tiny-deit-distilled, dataset: photos}}
  ft: {{source: ft-transformer, dataset: wine, options: {{max_epochs: 3, n_blocks: 2}}}}
baseline: {{sizes: [3, 6], trials: 3000, seed: 1, chunk_trials: 1000}}
matched_nulls: {{trials: 2000, chunk_trials: 1000}}
""")
    return path


def done_markers(store: Path) -> list[Path]:
    return sorted((Path(store) / ".sweep" / "markers").rglob("*.done"))


N_NULLS = 5  # every null, by default
# extract + test per shard of both models, FT's preparation, baseline chunks per null, matched
# nulls per model
N_TASKS = 2 * (6 + 8) + 1 + N_NULLS * 2 * 3 + 2 * N_NULLS * 2
N_MARKERS = N_TASKS + 2  # and each model's compaction marker (storage.compaction)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("checkpoints")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, cache):
    """An uninterrupted run's arrays."""
    config = load_config(write_config(tmp_path_factory.mktemp("reference"), cache))
    assert run_sweep(config, InProcessExecutor(), progress=False).exit_code == 0
    assert len(done_markers(config.store)) == N_MARKERS
    return arrays(config.store)


def sweep_command(config: Path, cluster: Path) -> list[str]:
    return [sys.executable, "-m", "sweep", "run", str(config), "--cluster", str(cluster),
            "--no-progress"]


def test_sigkill_of_the_driver_then_rerun_gives_identical_results(tmp_path, cache, reference):
    config = write_config(tmp_path, cache)
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(CLUSTER)
    store = Path(load_config(config).store)
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    driver = subprocess.Popen(sweep_command(config, cluster), cwd=tmp_path, env=env,
                              start_new_session=True, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240
        while not done_markers(store):
            assert driver.poll() is None, driver.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "no task finished in time"
            time.sleep(0.02)
        driver.send_signal(signal.SIGKILL)  # the driver, mid-sweep
        driver.wait()
    finally:
        try:
            os.killpg(driver.pid, signal.SIGKILL)  # its orphaned worker processes
        except ProcessLookupError:
            pass
        driver.stderr.close()
    assert 0 < len(done_markers(store)) < N_TASKS
    rerun = subprocess.run(sweep_command(config, cluster), cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert len(done_markers(store)) == N_MARKERS
    assert_same_arrays(reference, arrays(store))


def test_a_worker_killed_mid_task_is_replaced_and_results_are_identical(tmp_path, cache,
                                                                       reference):
    config = load_config(write_config(tmp_path, cache))
    killed = []
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      resources={"GPU": 1, "CPU": 1}, dashboard_address=":0") as cluster, \
            Client(cluster) as client:

        def kill_a_busy_worker() -> None:
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline and not killed:
                busy = [w for w, keys in client.processing().items() if keys]
                if busy and done_markers(config.store):
                    pid = client.run(os.getpid, workers=busy[:1])[busy[0]]
                    os.kill(pid, signal.SIGKILL)
                    killed.append(busy[0])
                time.sleep(0.02)

        killer = threading.Thread(target=kill_a_busy_worker)
        killer.start()
        summary = run_sweep(config, DaskExecutor(client), progress=False)
        killer.join()
    assert killed, "no worker was killed: the sweep finished first"
    assert summary.exit_code == 0, summary.lines()
    assert_same_arrays(reference, arrays(config.store))

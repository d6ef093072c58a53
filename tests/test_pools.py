"""Pools on a real local `distributed` cluster: GPU-tagged tasks (extraction) land only on
workers carrying `GPU` (a fake label here), CPU-tagged tasks (tests, baselines) only on workers
carrying `CPU`; the default cluster runs both; allowed_failures reaches the scheduler."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from distributed import KilledWorker, get_worker

from storage.errors import InputError
from sweep.clusters.client import ClusterConfig, open_client

pytestmark = pytest.mark.timeout(120)


def pools_config(**extra) -> ClusterConfig:
    return ClusterConfig.model_validate({
        "dashboard_address": ":0",
        "local": {"pools": {
            "gpu": {"workers": 1, "threads": 1, "resources": {"GPU": 1}},
            "cpu": {"workers": 1, "threads": 2, "resources": {"CPU": 2}},
        }},
        **extra,
    })


def where_am_i(i: int) -> tuple[int, str, dict[str, float]]:
    worker = get_worker()
    return i, worker.name, dict(worker.state.total_resources)


def allowed_failures(dask_scheduler) -> int:
    return dask_scheduler.allowed_failures


def test_each_task_type_lands_on_its_pool():
    out = io.StringIO()
    with open_client(pools_config(), out=out) as client:
        client.wait_for_workers(2)
        # the sweep's tagging contract: extraction {"GPU": 1}, tests and baselines {"CPU": 1}
        extraction = client.map(where_am_i, range(6), resources={"GPU": 1}, key="extract")
        tests = client.map(where_am_i, range(6), resources={"CPU": 1}, key="test")
        landed_extraction = client.gather(extraction)
        landed_tests = client.gather(tests)
    assert {name for _, name, _ in landed_extraction} == {"gpu-0"}
    assert {name for _, name, _ in landed_tests} == {"cpu-0"}
    assert all(res == {"GPU": 1.0} for _, _, res in landed_extraction)
    assert all(res == {"CPU": 2.0} for _, _, res in landed_tests)
    assert [i for i, _, _ in landed_tests] == list(range(6))
    assert out.getvalue().startswith("sweep: local cluster, dashboard ")


def test_the_machine_sized_default_runs_both_task_types():
    cfg = ClusterConfig.model_validate({"dashboard_address": ":0", "local": {"gpus": []}})
    with open_client(cfg, out=io.StringIO()) as client:
        client.wait_for_workers(1)
        info = client.scheduler_info()["workers"].values()
        assert len(info) == (os.cpu_count() or 1)
        assert all(w["resources"] == {"GPU": 1.0, "CPU": 1.0} for w in info)
        extraction = client.submit(where_am_i, 0, resources={"GPU": 1}, key="extract-0")
        test = client.submit(where_am_i, 1, resources={"CPU": 1}, key="test-0")
        assert extraction.result()[1].startswith("cpu-")
        assert test.result()[1].startswith("cpu-")


def test_allowed_failures_reaches_the_scheduler():
    with open_client(pools_config(allowed_failures=7), out=io.StringIO()) as client:
        assert client.run_on_scheduler(allowed_failures) == 7


def die_once(marker: str) -> str:
    """Kill this worker's process the first time it runs; succeed on the retry."""
    if not Path(marker).exists():
        Path(marker).touch()
        os._exit(1)
    return get_worker().name


def test_a_task_survives_a_worker_death_within_allowed_failures(tmp_path):
    with open_client(pools_config(allowed_failures=1), out=io.StringIO()) as client:
        future = client.submit(die_once, str(tmp_path / "died"), resources={"CPU": 1})
        assert future.result(timeout=60) == "cpu-0"
    assert (tmp_path / "died").exists()


def test_a_worker_death_beyond_allowed_failures_fails_the_task(tmp_path):
    with open_client(pools_config(allowed_failures=0), out=io.StringIO()) as client:
        future = client.submit(die_once, str(tmp_path / "died"), resources={"CPU": 1})
        with pytest.raises(KilledWorker):
            future.result(timeout=60)


def test_address_kind_joins_a_running_scheduler_and_sets_allowed_failures(tmp_path):
    with open_client(pools_config(), out=io.StringIO()) as host:
        address = host.scheduler.address
        host.write_scheduler_file(str(tmp_path / "scheduler.json"))
        targets = ({"scheduler": address}, {"scheduler_file": str(tmp_path / "scheduler.json")})
        for n, target in enumerate(targets):
            cfg = ClusterConfig.model_validate(
                {"kind": "address", "allowed_failures": 10 + n, "address": target}
            )
            out = io.StringIO()
            with open_client(cfg, out=out) as client:
                assert client.submit(where_am_i, n, resources={"GPU": 1}).result()[1] == "gpu-0"
                assert client.run_on_scheduler(allowed_failures) == 10 + n
            assert out.getvalue().startswith("sweep: address cluster, dashboard ")
        assert host.submit(where_am_i, 9, resources={"CPU": 1}).result()[1] == "cpu-0"


def test_an_unreachable_address_is_a_one_line_input_error():
    cfg = ClusterConfig.model_validate(
        {"kind": "address", "address": {"scheduler": "tcp://127.0.0.1:9", "timeout": "1s"}}
    )
    with pytest.raises(InputError, match=r"cannot reach the scheduler at tcp://127\.0\.0\.1:9"):
        with open_client(cfg, out=io.StringIO()):
            pass


def numba_threads_seen(threads: int) -> tuple[int, int]:
    import numba

    from workers.tasks.threads import numba_threads

    with numba_threads(threads):
        inside = numba.get_num_threads()
    return inside, numba.get_num_threads()


def test_a_worker_process_runs_numba_on_its_own_threads_whatever_was_imported_first():
    """The driver's process imports numba before the Nanny's NUMBA_NUM_THREADS=1 applies
    (spawn re-imports the main module); the task's numba_threads still gives one thread."""
    import numba

    before = numba.get_num_threads()
    with open_client(pools_config(), out=io.StringIO()) as client:
        client.wait_for_workers(2)
        inside, after = client.submit(numba_threads_seen, 1, resources={"CPU": 1}).result()
    assert inside == 1 and after >= 1
    assert numba_threads_seen(1) == (1, before)  # restored in the calling thread


LATE_VARIABLE = """
import os, sys, numba
if sys.argv[1] == "started":
    numba.get_num_threads()  # the pool starts at numba's import-time size
os.environ["NUMBA_NUM_THREADS"] = "1" if numba.config.NUMBA_NUM_THREADS > 1 else "2"  # late
from workers.tasks.threads import numba_threads
with numba_threads(1):
    print(numba.njit(lambda x: x + 1)(1), numba.get_num_threads(), numba.config.NUMBA_NUM_THREADS)
"""


@pytest.mark.parametrize("pool", ["started", "not-started"])
def test_a_late_numba_num_threads_never_breaks_the_next_compilation(pool):
    """A NUMBA_NUM_THREADS set after numba's import (a Nanny's variables, on a machine with no
    numba cache) made numba's next compilation raise once its pool had started; the task's
    numba_threads settles it: the started pool keeps its size, a pool not started yet adopts it."""
    import numba

    env = {k: v for k, v in os.environ.items() if k != "NUMBA_NUM_THREADS"}
    done = subprocess.run([sys.executable, "-c", LATE_VARIABLE, pool], env=env, text=True,
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr[-1500:]
    compiled, inside, size = done.stdout.split()
    assert (compiled, inside) == ("2", "1")
    default = numba.config.NUMBA_DEFAULT_NUM_THREADS
    assert size == (str(default) if pool == "started" else "1" if default > 1 else "2")

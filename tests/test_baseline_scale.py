"""Baselines and their plans are streamed: memory and time flat in the number of trials."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import pytest

from sweep.config.load import parse_config
from sweep.driver.plan import BaselineTask, build_plan
from tests.fault_helpers import default_sigint
from workers.nulls.baseline import BLOCK, BlockSpan, baseline_blocks, chunk_span, run_baseline

REPO = Path(__file__).resolve().parent.parent


def test_a_chunks_blocks_are_found_in_constant_time():
    trials = 10**15 + 500  # 1e12 blocks: any materialised list would not fit in memory
    last = trials // BLOCK
    span = chunk_span(trials, 3 * BLOCK, last // 3)
    assert list(span) == [(k, BLOCK) for k in range(3 * (last // 3), last)] + [(last, 500)]
    assert span.trial_count == (len(span) - 1) * BLOCK + 500
    assert baseline_blocks(trials) == BlockSpan(trials, 0, last + 1)
    assert len(baseline_blocks(trials)) == last + 1
    with pytest.raises(ValueError, match="multiple of 1000"):
        chunk_span(trials, 1500, 0)


def test_planning_ten_million_trials_takes_under_a_second_and_little_memory():
    config = parse_config({"store": "/tmp/never-written.zarr", "baseline": {
        "sizes": [2], "trials": 10**7, "chunk_trials": 1000, "nulls": ["uniform"]}})
    tracemalloc.start()
    start = time.process_time()  # CPU time: this machine is shared, wall time is not ours
    plan = build_plan(config, {})
    elapsed = time.process_time() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    tasks = [t for t in plan.tasks if isinstance(t, BaselineTask)]
    assert len(tasks) == 10**4
    assert tuple(tasks[-1].blocks) == ((9999, 1000),)
    assert elapsed < 1.0, f"planning took {elapsed:.2f} s"
    assert peak < 32 * 2**20, f"planning peaked at {peak / 2**20:.1f} MiB"


def test_a_huge_run_starts_at_once_in_little_memory():
    class Stop(Exception):
        pass

    def stop_after_first_block(done: int) -> None:
        raise Stop(done)

    tracemalloc.start()
    start = time.process_time()
    with pytest.raises(Stop) as stopped:
        run_baseline([2, 256], 10**12, 0, progress=stop_after_first_block)
    elapsed = time.process_time() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert stopped.value.args == (BLOCK,)
    assert elapsed < 10, f"the first block took {elapsed:.1f} s of CPU"
    assert peak < 64 * 2**20, f"peaked at {peak / 2**20:.1f} MiB before the first block"


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc for memory")
def test_ctrl_c_stops_a_huge_baseline_with_exit_130_and_one_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    process = subprocess.Popen(
        # n = 256: the time goes to compiled kernels, where a raw KeyboardInterrupt would
        # surface as numba's SystemError
        [sys.executable, "-m", "sweep", "baseline", "--sizes", "256", "--trials", "1e12",
         "--null", "all"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        preexec_fn=default_sigint)
    err = bytearray()
    reader = threading.Thread(target=lambda: _drain(process.stderr, err), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 120
        while b"trial" not in err:  # the progress bar: trials are running
            assert process.poll() is None and time.monotonic() < deadline, err.decode()
            time.sleep(0.1)
        time.sleep(2.0)  # well into the trials
        rss = _rss_kib(process.pid)
        process.send_signal(signal.SIGINT)
        out = process.stdout.read()
        process.wait(timeout=30)
        reader.join(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
    lines = [line for line in err.decode().replace("\r", "\n").splitlines() if line.strip()]
    assert process.returncode == 130, lines[-5:]
    assert lines[-1].startswith("sweep baseline: interrupted")
    assert out == b""
    assert rss < 1024 * 1024, f"resident memory {rss / 1024:.0f} MiB"  # interpreter + libraries


def _drain(stream, into: bytearray) -> None:
    while chunk := stream.read1(4096):
        into.extend(chunk)


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for process {pid}")

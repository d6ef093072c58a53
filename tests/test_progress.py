"""A run's progress in a batch job's log: off a terminal, plain lines (counts, rate, ETA) at a
steady interval and at the end, never a carriage return; on a terminal, tqdm's bar."""

from __future__ import annotations

import io
import subprocess
import sys

from sweep.terminal.progress import BarProgress, LineProgress, NoProgress, duration, progress
from tests.fault_helpers import env, write_text_sweep


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_line_every_interval_and_one_at_the_end():
    clock, out = FakeClock(), io.StringIO()
    bar = LineProgress(10, "sweep", "task", out, interval=30, clock=clock)
    clock.now += 10
    bar.update()
    assert out.getvalue() == ""  # 10 s in: nothing yet
    clock.now += 20
    bar.update(failed=1)  # 30 s in: 1 done, 1 failed
    assert out.getvalue() == (
        "sweep: 1/10 tasks done, 8 pending, 1 failed, 0.07 tasks/s, ETA 2m00s\n")
    clock.now += 10
    bar.update(3)
    assert out.getvalue().count("\n") == 1  # 10 s after the last line: nothing more
    clock.now += 20
    bar.update(5)
    bar.close()
    bar.close()  # once only
    lines = out.getvalue().splitlines()
    assert lines[1:] == [
        "sweep: 9/10 tasks done, 0 pending, 1 failed, 0.17 tasks/s, elapsed 1m00s",
        "sweep: 9/10 tasks done, 0 pending, 1 failed, 0.17 tasks/s, elapsed 1m00s",
    ]
    assert "\r" not in out.getvalue()


def test_before_any_task_ends_the_eta_is_unknown():
    clock, out = FakeClock(), io.StringIO()
    bar = LineProgress(3, "sweep", "task", out, interval=30, clock=clock)
    clock.now += 45
    bar.tick()
    assert out.getvalue() == (
        "sweep: 0/3 tasks done, 3 pending, 0 failed, 0.00 tasks/s, ETA unknown\n")


def test_durations_read_plainly():
    assert [duration(s) for s in (0, 7.4, 65, 3723)] == ["0s", "7s", "1m05s", "1h02m03s"]


def test_the_kind_of_progress_follows_the_stream():
    assert isinstance(progress(5, "sweep", "task", stream=io.StringIO()), LineProgress)
    assert isinstance(progress(5, "sweep", "task", stream=Terminal()), BarProgress)
    assert isinstance(progress(5, "sweep", "task", enabled=False), NoProgress)
    terminal = Terminal()
    bar = progress(2, "sweep", "task", stream=terminal)
    bar.update()
    bar.update(failed=1)
    bar.close()
    assert "\r" in terminal.getvalue() and "failed=1" in terminal.getvalue()  # tqdm's bar


def test_a_sweep_run_with_stderr_to_a_pipe_logs_plain_lines(tmp_path):
    """The local Dask cluster's run, its stderr a pipe as in a SLURM or Kubernetes log."""
    path = write_text_sweep(tmp_path)
    done = subprocess.run([sys.executable, "-m", "sweep", "run", str(path)],
                          capture_output=True, env=env(), timeout=300, cwd=tmp_path)
    stderr = done.stderr.decode()  # bytes: text mode would turn each "\r" into "\n"
    assert done.returncode == 0, stderr
    assert "\r" not in stderr
    lines = [line for line in stderr.split("\n") if line.startswith("sweep: ")]
    assert lines[-1].startswith("sweep: 6/6 tasks done, 0 pending, 0 failed, "), stderr

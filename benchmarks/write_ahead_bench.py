"""The extraction task with its chunk folders made on the loader's thread (the `ahead` stage,
folders made from the top down, chunk files written with four system calls) against the same
task as it stood at 0291892 (batch k's write made batch k+1's folders with `Path.mkdir(parents=
True)`, batch 0's made by its own write; files written through `open(...).write` after a
`mkdir`), kept here as the baseline, in one process, rounds interleaved (2026-12-07;
`interleaved.py` says how and what is reported). `pipeline_bench.py`'s runs of 2026-12-07, in
processes of their own, could not tell these two apart.

    PYTHONPATH=. HF_HUB_OFFLINE=1 python benchmarks/write_ahead_bench.py --models roberta,vit-b
"""

from __future__ import annotations

import os
import sys
import uuid
from contextlib import contextmanager
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import interleaved  # noqa: E402

import storage.recording as recording  # noqa: E402
import workers.tasks.extract as extract  # noqa: E402
from workers.tasks.pipeline import run_batches  # noqa: E402


def put_file_before(path: Path, data: np.ndarray) -> None:
    """`storage.recording.put_file` at 0291892."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{uuid.uuid4().hex}.partial")
    try:
        with open(partial, "wb") as out:
            out.write(memoryview(data))
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def make_folders_before(self: recording.RecordingStore, keys) -> None:
    """`RecordingStore.make_folders` at 0291892."""
    root = self.local_root()
    if root is None:
        return
    for folder in dict.fromkeys((root / key).parent for key in keys):
        folder.mkdir(parents=True, exist_ok=True)


def run_batches_before(n, load, run, write, cores, stop=None, ahead=None):
    """The pipeline at 0291892: batch k's write makes batch k+1's folders at its end."""
    def write_then_folders(k, result, parts):
        write(k, result, parts)
        if ahead is not None and k + 1 < n:
            ahead(k + 1)

    return run_batches(n, load, run, write_then_folders, cores, stop)


@contextmanager
def before(measured):
    """The extraction task as it stood at 0291892."""
    saved = recording.put_file, recording.RecordingStore.make_folders, extract.run_batches
    recording.put_file = put_file_before
    recording.RecordingStore.make_folders = make_folders_before
    extract.run_batches = run_batches_before
    try:
        yield
    finally:
        recording.put_file, recording.RecordingStore.make_folders, extract.run_batches = saved


@contextmanager
def now(measured):
    """The extraction task as it stands."""
    yield


if __name__ == "__main__":
    interleaved.main("write_ahead_bench", __doc__.splitlines()[0], "roberta,vit-b",
                     {"before": before, "now": now})

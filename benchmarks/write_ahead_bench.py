"""The extraction task with its chunk folders made on the loader's thread (the `ahead` stage,
folders made from the top down, chunk files written with four system calls) against the same
task as it stood at 0291892 (batch k's write made batch k+1's folders with `Path.mkdir(parents=
True)`, batch 0's made by its own write; files written through `open(...).write` after a
`mkdir`), kept here as the baseline, in one process, rounds interleaved (2026-12-07).

Why one process: this machine's pace drifts by tens of percent between processes and between
minutes (`pipeline_bench.py` compares trees in processes of their own, and its runs of 2026-12-07
could not tell these two apart); rounds of both, alternating in one process, meet the same drift.

Per round: the bare eager forward pass, then the extraction task of one variant (the models,
inputs and `Measured` of `pipeline_bench.py`; each round into new chunk files, nothing deleted
until the end). Reported per variant: the median and quartiles of the rounds' paired ratios
(bare wall / extraction wall), and the median CPU ms per input outside the forward pass.

    PYTHONPATH=. HF_HUB_OFFLINE=1 python benchmarks/write_ahead_bench.py --models roberta,vit-b
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pipeline_bench as pb  # noqa: E402

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
def variant(name: str):
    """The extraction task as it stands ("now") or as it stood at 0291892 ("before")."""
    saved = recording.put_file, recording.RecordingStore.make_folders, extract.run_batches
    if name == "before":
        recording.put_file = put_file_before
        recording.RecordingStore.make_folders = make_folders_before
        extract.run_batches = run_batches_before
    try:
        yield
    finally:
        recording.put_file, recording.RecordingStore.make_folders, extract.run_batches = saved


def measure(measured: pb.Measured, rounds: int) -> dict[str, list[tuple[float, float]]]:
    """(paired ratio, CPU ms per input outside the forward pass) per round and variant."""
    out: dict[str, list[tuple[float, float]]] = {"before": [], "now": []}
    for name in out:  # warm-up: each variant's first write of its buffers and files
        with variant(name):
            measured.unwrite()
            measured.extract()
    for r in range(rounds):
        for name in (("before", "now") if r % 2 == 0 else ("now", "before")):
            measured.unwrite()
            wall, cpu = time.perf_counter(), time.process_time()
            measured.bare()
            bare_wall, bare_cpu = time.perf_counter() - wall, time.process_time() - cpu
            with variant(name):
                wall, cpu = time.perf_counter(), time.process_time()
                measured.extract()
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            out[name].append((bare_wall / wall, (cpu - bare_cpu) / measured.n * 1e3))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="roberta,vit-b")
    parser.add_argument("--rounds", type=int, default=10, help="rounds of each variant")
    args = parser.parse_args()
    print(f"write_ahead_bench: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        images = pb.make_images(folder / "images", max(pb.DEFAULT_INPUTS.values()))
        for name in args.models.split(","):
            path, options = pb.thin_model(folder / "models", name)
            n = pb.DEFAULT_INPUTS[name]
            config = pb.sweep_config(folder, path, options, name, n, pb.BATCH[name], images)
            measured = pb.Measured(config, scratch)
            results = measure(measured, args.rounds)
            measured.settle(everything=True)
            print(f"\n{name}: {n} inputs, batch {pb.BATCH[name]}, {args.rounds} rounds each")
            for variant_name, rows in results.items():
                ratios = [r[0] for r in rows]
                q1, q3 = np.percentile(ratios, [25, 75])
                print(f"  {variant_name:7} ratio {statistics.median(ratios):.2f} "
                      f"(quartiles {q1:.2f}-{q3:.2f}), CPU ms/input outside forward "
                      f"{statistics.median(r[1] for r in rows):.2f}")


if __name__ == "__main__":
    main()

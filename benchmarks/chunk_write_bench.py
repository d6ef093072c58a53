"""A batch's attention chunks written into a local store, three ways, in one process: through
zarr's event loop (`store.set` per chunk, what `write_attention` did before
`RecordingStore.file_writer`), as files on the calling thread (an extraction's writer thread),
and as files over a pool of two threads (an extraction's last batch). Each round writes new
chunk files (as a sweep's first pass does) into a store that records checksums, as a task's
does. Per way: wall and process CPU (every thread) per round, the median of rounds 2.. . The
last way writes into chunk folders made beforehand, untimed, as an extraction's last batch does
(`make_attention_folders`, run by the batch before's write): what making them costs is timed on
its own line.
Beside them, the check every value is finite that precedes a batch's write, on one thread under
one torch thread: the extraction's `check_finite` (torch's sum per input) against numpy's sum
per input (its check before 2026-12-07), the same rounds.

    PYTHONPATH=. python benchmarks/chunk_write_bench.py [--tokens 197] [--rounds 7]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from unittest import mock

import numpy as np
import torch
import zarr

from storage import store as store_module
from storage.recording import RecordingStore
from workers.tasks.extract import check_finite


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=197, help="T (197: ViT-B; 128: RoBERTa)")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    shape = (args.batch, args.layers, 1, args.tokens, args.tokens)
    batch = np.random.default_rng(0).random(shape, dtype=np.float32)
    pool = ThreadPoolExecutor(2)

    def on_pool(fn, items):
        return [future.result() for future in [pool.submit(fn, item) for item in items]]

    def through_zarr(group, start):
        with mock.patch.object(RecordingStore, "file_writer", lambda store: None):
            store_module.write_attention(group, start, batch)

    ways = {"zarr's event loop": through_zarr,
            "files, one thread": lambda group, start: store_module.write_attention(
                group, start, batch),
            "files, two threads": lambda group, start: store_module.write_attention(
                group, start, batch, on_pool),
            "  into folders made": lambda group, start: store_module.write_attention(
                group, start, batch, on_pool)}
    ahead = "  into folders made"
    making = "  making the folders"
    ids = [str(i) for i in range(args.batch)]
    checks = {"numpy's sum": lambda: all(np.isfinite(values.sum()) for values in batch),
              "check_finite": lambda: check_finite("bench", batch, ids)}
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        group = zarr.open_group(RecordingStore(zarr.storage.LocalStore(Path(scratch) / "s.zarr")),
                                mode="w", zarr_format=3)
        group.create_array("attention", shape=(args.batch * len(ways) * args.rounds, *shape[1:]),
                           chunks=(1, *shape[1:]), dtype="float32", compressors=None,
                           filters=None, fill_value=0.0)
        times: dict[str, list[tuple[float, float]]] = {
            way: [] for way in [*ways, making, *checks]}
        start = 0
        for _ in range(args.rounds):
            for check, run in checks.items():
                wall, cpu = time.perf_counter(), time.process_time()
                run()
                times[check].append((time.perf_counter() - wall, time.process_time() - cpu))
            for way, write in ways.items():
                if way == ahead:
                    wall, cpu = time.perf_counter(), time.process_time()
                    store_module.make_attention_folders(group, start, start + args.batch)
                    times[making].append((time.perf_counter() - wall,
                                          time.process_time() - cpu))
                wall, cpu = time.perf_counter(), time.process_time()
                write(group, start)
                times[way].append((time.perf_counter() - wall, time.process_time() - cpu))
                start += args.batch
    megabytes = batch[0].nbytes / 1e6
    print(f"{args.batch} chunks of {megabytes:.2f} MB per round (T = {args.tokens}), median of "
          f"rounds 2..{args.rounds}")
    for way, rounds in times.items():
        wall = statistics.median(t[0] for t in rounds[1:])
        cpu = statistics.median(t[1] for t in rounds[1:])
        print(f"  {way:<20} wall {1e3 * wall:6.1f} ms, CPU {1e3 * cpu:6.1f} ms per round")


if __name__ == "__main__":
    main()

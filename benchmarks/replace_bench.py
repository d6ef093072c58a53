"""Writing a batch of attention chunks as new files against replacing the files already there,
the way zarr's local store writes (a temporary file, then a rename over the chunk's name).

Why `pipeline_bench.py` writes each round into new files: on ext4 (its default `auto_da_alloc`),
a rename over an existing file starts writing the new file's data out, and a round that replaces
the last round's chunks waits for that; a sweep's first pass writes new files. Per round:
`--files` chunks of `--megabytes` each (default: a batch of 64 ViT-B chunks, 1.86 MB each), wall
and this thread's CPU, in a folder of `--where` (default: the system's temporary folder).

    python benchmarks/replace_bench.py [--files 64] [--megabytes 1.86] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path


def write_round(folder: Path, payload: bytes, files: int, mode: str, round_: int) -> None:
    """One batch of chunk files: `new` under names no earlier round used, `replace` over the
    last round's files, `unlink` removing the last round's files first (not timed apart)."""
    for i in range(files):
        name = folder / (f"r{round_}-{i}" if mode == "new" else f"c{i}")
        if mode == "unlink":
            name.unlink(missing_ok=True)
        partial = name.with_suffix(".partial")
        with partial.open("wb") as out:
            out.write(payload)
        os.replace(partial, name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=64)
    parser.add_argument("--megabytes", type=float, default=1.86)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--where", default=None, help="folder to write in (its file system)")
    args = parser.parse_args()
    payload = os.urandom(int(args.megabytes * 1e6))
    print(f"{args.files} files of {args.megabytes} MB per round; the median of rounds "
          f"2..{args.rounds} (the first writes names the folder does not hold yet)")
    for mode in ("new", "replace", "unlink"):
        with tempfile.TemporaryDirectory(dir=args.where) as scratch:
            times = []
            for round_ in range(args.rounds):
                wall, cpu = time.perf_counter(), time.thread_time()
                write_round(Path(scratch), payload, args.files, mode, round_)
                times.append((time.perf_counter() - wall, time.thread_time() - cpu))
            rest = sorted(times[1:])
            wall, cpu = rest[len(rest) // 2]
            print(f"  {mode:<8} wall {1e3 * wall:6.1f} ms, CPU {1e3 * cpu:6.1f} ms per round")


if __name__ == "__main__":
    main()

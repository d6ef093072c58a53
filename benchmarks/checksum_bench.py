"""Cost of chunk integrity: hashing one chunk, and checking a finished store at start-up.

`hash`: CPU time (`time.process_time`, best of --repeat) to hash one file already in the page
cache, with sha256 (markers before CRC32C) and with `storage.integrity.file_checksum` (CRC32C),
for a ViT-B attention chunk (12 x 197 x 197 float32, 1,862,832 bytes) and a DINOv2-518 one
(90 MB).

`startup`: a synthetic finished store of --chunks chunk files of --chunk-bytes under markers of
--per-marker chunks each, checked as `sweep run` does at start-up (`sweep.freshness.
damaged_tasks`, marker reads included): before (sha256 markers, every chunk re-hashed: what
`sweep run` did), after (CRC32C + mtime markers, a stat per chunk), and `--verify` (every chunk
re-hashed with CRC32C), each timed on its second pass. Chunks are freshly written, so reads come
from the page cache: a store larger than memory, or on a network file system, reads slower; only
the stat check does not read.

    PYTHONPATH=. python benchmarks/checksum_bench.py hash
    PYTHONPATH=. python benchmarks/checksum_bench.py startup --chunks 2000
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from storage import markers
from storage.integrity import checksums, file_checksum
from sweep.freshness import damaged_tasks

VIT_B = 12 * 197 * 197 * 4
DINOV2_518 = 90_000_000


def sha256_checksum(path: Path) -> list:
    """[size, sha256 hex]: what markers held before CRC32C (read in 1 MiB blocks, as then)."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
            size += len(block)
    return [size, digest.hexdigest()]


def cpu_ms(action, repeat: int) -> float:
    """Best CPU time of `repeat` calls, ms."""
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        action()
        best = min(best, time.process_time() - start)
    return round(1000 * best, 2)


def bench_hash(repeat: int) -> list[dict]:
    rng = np.random.default_rng(0)
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, size in (("vit-b", VIT_B), ("dinov2-518", DINOV2_518)):
            path = Path(tmp) / label
            path.write_bytes(rng.bytes(size))
            path.read_bytes()  # in the page cache
            out.append({"file": label, "bytes": size,
                        "sha256_cpu_ms": cpu_ms(lambda p=path: sha256_checksum(p), repeat),
                        "crc32c_cpu_ms": cpu_ms(lambda p=path: file_checksum(p), repeat)})
    return out


def timed(action) -> dict:
    """Wall and CPU seconds of the second of two calls (the first warms markers and metadata)."""
    action()
    wall, cpu = time.perf_counter(), time.process_time()
    result = action()
    return {"wall_s": round(time.perf_counter() - wall, 3),
            "cpu_s": round(time.process_time() - cpu, 3), "damaged": len(result)}


def bench_startup(n_chunks: int, chunk_bytes: int, per_marker: int) -> dict:
    block = np.random.default_rng(0).bytes(chunk_bytes)
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp)
        names = [f"m/attention/c/{i}/0/0/0" for i in range(n_chunks)]
        for i, name in enumerate(names):
            path = store / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(i.to_bytes(8, "little") + block[8:])  # every chunk different
        tasks = [SimpleNamespace(store=store, scope="m", marker=f"extract-{k:05d}",
                                 key=f"extract-m-{k:05d}")
                 for k in range(0, n_chunks // per_marker)]
        plan = SimpleNamespace(tasks=tasks)
        shards = {t.marker: names[k * per_marker:(k + 1) * per_marker]
                  for k, t in enumerate(tasks)}
        for task in tasks:
            old = {n: sha256_checksum(store / n) for n in shards[task.marker]}
            markers.mark_done(store, "m", task.marker, old)
        out = {"chunks": len(tasks) * per_marker, "chunk_bytes": chunk_bytes,
               "markers": len(tasks)}
        out["before_sha256_full"] = timed(lambda: damaged_tasks(plan, verify=True))
        for task in tasks:
            markers.mark_done(store, "m", task.marker, checksums(store, shards[task.marker]))
        out["after_stat"] = timed(lambda: damaged_tasks(plan))
        out["after_verify_crc32c_full"] = timed(lambda: damaged_tasks(plan, verify=True))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("hash", "startup"))
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--chunks", type=int, default=2000)
    parser.add_argument("--chunk-bytes", type=int, default=VIT_B)
    parser.add_argument("--per-marker", type=int, default=8)
    args = parser.parse_args()
    if args.what == "hash":
        for row in bench_hash(args.repeat):
            print(json.dumps(row))
    else:
        print(json.dumps(bench_startup(args.chunks, args.chunk_bytes, args.per_marker)))


if __name__ == "__main__":
    main()

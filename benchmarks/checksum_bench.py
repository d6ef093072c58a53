"""Cost of chunk integrity: hashing one chunk, and checking a finished store at start-up.

`hash`: CPU time (`time.process_time`, best of --repeat) to hash one chunk already in memory,
with sha256 (markers before CRC32C) and CRC32C (`storage.recording.crc32c_of`), for a ViT-B
attention chunk (12 x 197 x 197 float32, 1,862,832 bytes) and a DINOv2-518 one (90 MB).

`startup`: a synthetic finished store of --chunks chunks of --chunk-bytes under markers of
--per-marker chunks each, at --store (a local folder by default, or a URL such as
s3://bucket/prefix with --endpoint-url), checked as `sweep run` does at start-up
(`sweep.driver.freshness.damaged_tasks`, marker reads included): the listing check (sizes and
versions from one listing), and `--verify` (every chunk re-read and re-hashed with CRC32C), each
timed on its second pass. Local chunks are freshly written, so reads come from the page cache.

    PYTHONPATH=. python benchmarks/checksum_bench.py hash
    PYTHONPATH=. python benchmarks/checksum_bench.py startup --chunks 2000
    PYTHONPATH=. python benchmarks/checksum_bench.py startup --chunks 2000 \
        --store s3://bench/startup --endpoint-url http://127.0.0.1:8333
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
from storage.integrity import checksums
from storage.location import StoreRef, locate
from storage.recording import crc32c_of
from sweep.driver.freshness import damaged_tasks

VIT_B = 12 * 197 * 197 * 4
DINOV2_518 = 90_000_000


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
    for label, size in (("vit-b", VIT_B), ("dinov2-518", DINOV2_518)):
        data = rng.bytes(size)
        out.append({"chunk": label, "bytes": size,
                    "sha256_cpu_ms": cpu_ms(lambda d=data: hashlib.sha256(d).hexdigest(), repeat),
                    "crc32c_cpu_ms": cpu_ms(lambda d=data: crc32c_of(d), repeat)})
    return out


def timed(action) -> dict:
    """Wall and CPU seconds of the second of two calls (the first warms markers and metadata)."""
    action()
    wall, cpu = time.perf_counter(), time.process_time()
    result = action()
    return {"wall_s": round(time.perf_counter() - wall, 3),
            "cpu_s": round(time.process_time() - cpu, 3), "damaged": len(result)}


def bench_startup(store: StoreRef, n_chunks: int, chunk_bytes: int, per_marker: int) -> dict:
    block = np.random.default_rng(0).bytes(chunk_bytes)
    location = locate(store)
    location.delete_prefix("")
    names = [f"m/attention/c/{i}/0/0/0" for i in range(n_chunks)]
    for i, name in enumerate(names):
        location.write(name, i.to_bytes(8, "little") + block[8:])  # every chunk different
    tasks = [SimpleNamespace(store=store, scope="m", marker=f"extract-{k:05d}",
                             key=f"extract-m-{k:05d}")
             for k in range(0, n_chunks // per_marker)]
    plan = SimpleNamespace(tasks=tasks, config=SimpleNamespace(store_ref=store))
    for k, task in enumerate(tasks):
        markers.mark_done(store, "m", task.marker,
                          checksums(store, names[k * per_marker:(k + 1) * per_marker]))
    out = {"store": str(store), "chunks": len(tasks) * per_marker, "chunk_bytes": chunk_bytes,
           "markers": len(tasks)}
    out["listing"] = timed(lambda: damaged_tasks(plan))
    out["verify_crc32c_full"] = timed(lambda: damaged_tasks(plan, verify=True))
    location.delete_prefix("")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("hash", "startup"))
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--chunks", type=int, default=2000)
    parser.add_argument("--chunk-bytes", type=int, default=VIT_B)
    parser.add_argument("--per-marker", type=int, default=8)
    parser.add_argument("--store", help="where to build the store (default: a temporary folder)")
    parser.add_argument("--endpoint-url", help="an S3-compatible server for an s3:// --store")
    args = parser.parse_args()
    if args.what == "hash":
        for row in bench_hash(args.repeat):
            print(json.dumps(row))
        return
    options = {"endpoint_url": args.endpoint_url} if args.endpoint_url else {}
    with tempfile.TemporaryDirectory() as tmp:
        store = StoreRef.of(args.store or str(Path(tmp) / "store"), options)
        print(json.dumps(bench_startup(store, args.chunks, args.chunk_bytes, args.per_marker)))


if __name__ == "__main__":
    main()

"""Objects per model on an object store, and what `sweep status` and `sweep report` pay for them:
the same sweep (tiny-roberta over N generated text lines, shards of 32, one token set,
`attention: drop`: a light sweep whose result arrays are what is counted) run
into SeaweedFS by each code tree given (e.g. the main branch in a `git worktree` and this one),
in one run of this script.

Per tree: the sweep's wall time (`sweep run --in-process`), the objects of the model's group
(all, and its result arrays), its markers, then the median wall time of `sweep status` and of
`sweep report --ci wilson --no-cache` (fresh processes, `--repeats` each, rounds interleaved
between the trees). Needs the S3 server of `.ci/s3-up.sh` (endpoint and test credentials as in
tests/s3_fixtures.py).

    git worktree add --detach /tmp/before main
    PYTHONPATH=. HF_HUB_OFFLINE=1 python benchmarks/object_count.py --inputs 20000 \
        --tree before=/tmp/before --tree after=.

`--time-compaction`: then, in this process (this tree's code), for each store whose model is
compacted: the wall time of expanding it back to per-shard chunks (`expand_model`, every shard
kept: what a retest costs first) and of compacting it again (`compact_model`: what the end of
a run adds).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from storage.compaction.results import compact_model, expand_model, is_marked
from storage.location import StoreRef, locate
from storage.markers import marker_name
from tests.s3_fixtures import CREDENTIALS, ENDPOINT, filesystem

CONFIG = """\
store: {store}
storage_options: {{endpoint_url: '{endpoint}'}}
shard_size: {shard_size}
token_sets: [all]
attention: drop
matched_nulls: null
retries: 0
datasets:
  lines: {{path: lines.txt}}
models:
  rob: {{source: tiny-roberta, dataset: lines, batch_size: 32}}
"""
WORDS = "the a model token attention layer input row bound tight pair self weight".split()


def write_lines(path: Path, n: int) -> None:
    """N short distinct lines (5 words each: a handful of tokens, so the test stage is cheap)."""
    lines = [" ".join(WORDS[(i // len(WORDS) ** k) % len(WORDS)] for k in range(4)) + f" {i}"
             for i in range(n)]
    path.write_text("\n".join(lines) + "\n")


def timed(tree: Path, argv: list[str], cwd: Path) -> float:
    """Seconds of one CLI call of `tree`'s code in a fresh process (a failure is fatal)."""
    env = {**os.environ, **CREDENTIALS, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1"}
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "sweep", *argv], cwd=cwd, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"{tree}: sweep {' '.join(argv)} exited {result.returncode}: "
                         f"{result.stderr.strip()[-2000:]}")
    return elapsed


def objects(store: str) -> dict[str, int]:
    """Objects of the model's group, of its result arrays, its markers, and of the store."""
    keys = list(locate(StoreRef.of(store, {"endpoint_url": ENDPOINT})).listing())
    return {"model group": sum(k.startswith("rob/") for k in keys),
            "result arrays": sum(k.startswith("rob/results/") for k in keys),
            "model markers": sum(k.startswith(".sweep/markers/rob/") for k in keys),
            "store": len(keys)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=20000)
    parser.add_argument("--shard-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tree", action="append", required=True, metavar="NAME=PATH",
                        help="a code tree to run (`sweep` imported from PATH)")
    parser.add_argument("--time-compaction", action="store_true")
    args = parser.parse_args()
    trees = {name: Path(path).resolve() for name, path in
             (item.split("=", 1) for item in args.tree)}
    os.environ.update(CREDENTIALS)
    bucket = f"dobrushin-objects-{uuid.uuid4().hex[:8]}"
    fs = filesystem()
    fs.mkdir(bucket)
    out: dict[str, dict] = {name: {} for name in trees}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folders = {}
            for name, tree in trees.items():
                folder = Path(tmp) / name
                folder.mkdir()
                write_lines(folder / "lines.txt", args.inputs)
                store = f"s3://{bucket}/{name}.zarr"
                (folder / "sweep.yaml").write_text(CONFIG.format(
                    store=store, endpoint=ENDPOINT, shard_size=args.shard_size))
                out[name]["sweep s"] = round(timed(
                    tree, ["run", "sweep.yaml", "--in-process", "--no-progress"], folder), 1)
                out[name]["objects"] = objects(store)
                folders[name] = (folder, store)
                print(name, json.dumps(out[name]), flush=True)
            option = f"--storage-option=endpoint_url={ENDPOINT}"
            times: dict[str, dict[str, list[float]]] = {
                name: {"status": [], "report": []} for name in trees}
            for _ in range(args.repeats):
                for name, tree in trees.items():
                    folder, store = folders[name]
                    times[name]["status"].append(timed(tree, ["status", store, option], folder))
                    times[name]["report"].append(timed(
                        tree, ["report", store, option, "--ci", "wilson", "--no-cache"], folder))
            for name in trees:
                for what, values in times[name].items():
                    out[name][f"{what} s"] = round(statistics.median(values), 2)
                    out[name][f"{what} s (all)"] = [round(v, 2) for v in values]
                ref = StoreRef.of(folders[name][1], {"endpoint_url": ENDPOINT})
                if args.time_compaction and is_marked(ref, "rob"):
                    shards = range(-(-args.inputs // args.shard_size))
                    start = time.perf_counter()
                    expand_model(ref, "rob", args.shard_size, shards)
                    out[name]["expand s"] = round(time.perf_counter() - start, 1)
                    start = time.perf_counter()
                    compact_model(ref, "rob", args.shard_size,
                                  [marker_name("test", shard) for shard in shards])
                    out[name]["compact s"] = round(time.perf_counter() - start, 1)
                    out[name]["objects after expand+compact"] = objects(folders[name][1])
    finally:
        fs.rm(bucket, recursive=True)
    print(json.dumps({"inputs": args.inputs, "shard_size": args.shard_size, **out}, indent=1))


if __name__ == "__main__":
    main()

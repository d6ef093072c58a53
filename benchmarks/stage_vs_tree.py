"""The test stage's math per input in this tree against other trees (older commits), in one run.

    PYTHONPATH=. python benchmarks/stage_vs_tree.py --against OLD_TREE[,OTHER_TREE] \
        [--sizes 197,577,1370] [--rounds 3] [--repeats 2] [--workers 1]
        [--task [--store s3://bucket/prefix --endpoint-url http://127.0.0.1:8333]]

`git worktree add /tmp/old <commit>` makes a tree of an older commit. For each size, an
attention-like shard (per layer, softmax of N(0, 4) logits with +4 on column 0, a sink, and +2
on the diagonal; token 0 is CLS, the rest content; 12 layers; 8 inputs at T <= 257, 2 at
T <= 600, 1 above) goes through `workers.tasks.verdicts.evaluate_shard` -- restriction, `check`
(with the decision radius where the tree has it), attaining kinds and the whole rollout, for both
token sets `all` and `content`: the stage without its store read and write (`--task` adds them).
Each tree runs in a child process of its own (PYTHONPATH = the tree; the same numpy, numba and
BLAS), children alternate between trees for --repeats rounds, and each child keeps the
best of --rounds calls after one warm-up. Reported per input: CPU ms (all threads of the
process) and wall ms, and each tree's ratio to this one. `--workers 2` runs two copies of the
shard at once in two threads of one process, as the default local cluster's two thread workers
run test tasks; CPU / wall then shows how much of the second core the stage uses.

`--task` times the whole test task instead, as a sweep runs it and `test_stage_bench.py` times
its `stage`: the shard is written to a store the way extraction writes it (`storage.store`), then
`workers.tasks.verdicts.run_test` reads it back one input at a time, tests both token sets with the
rollout, writes the results and the marker. The store is a temporary folder, or
`--store s3://bucket/prefix --endpoint-url URL` (one store per child below the prefix).

Thread counts are the environment's (NUMBA_NUM_THREADS, OMP_NUM_THREADS): set them to 1 for
what one core of a cluster spends per input.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

import numpy as np

LAYERS = 12
TOKEN_SETS = ("all", "content")


def inputs_for(t: int) -> int:
    """Inputs in a shard of size t: enough work per call, a bounded run."""
    return 8 if t <= 257 else 2 if t <= 600 else 1


def shard(t: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(attention (input, layer, 1 head, T, T) float32, n_tokens, token kinds): the same data in
    every process (seeded)."""
    rng = np.random.default_rng(t)
    inputs = inputs_for(t)
    logits = 2.0 * rng.normal(size=(inputs, LAYERS, t, t))
    logits[..., 0] += 4.0
    logits[..., np.arange(t), np.arange(t)] += 2.0
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    attention = (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)[:, :, None]
    kinds = np.zeros((inputs, t), dtype=np.int8)  # TokenKind.CONTENT
    kinds[:, 0] = 1  # TokenKind.CLS
    return attention, np.full(inputs, t, dtype=np.int32), kinds


def write_test_shard(store: object, attention: np.ndarray, n_tokens: np.ndarray,
                     kinds: np.ndarray, device_kappa: np.ndarray | None = None) -> object:
    """The TestTask of a store (a StoreRef) holding `attention` (input, layer, head, T, T) as one
    shard of model `m`, written as extraction writes it; only imports every tree here has.
    `device_kappa`: the rollout's kappa as `rollout_device: extraction` stores it (the task then
    runs no rollout products)."""
    from storage.location import locate
    from storage.store import create_root, ensure_model, open_model, write_attention, write_tokens
    from workers.task_specs import TestTask

    moved = {} if device_kappa is None else {"device_rollout": True}
    n, layers, t_max = attention.shape[0], attention.shape[1], attention.shape[-1]
    locate(store).delete_prefix("")
    root = create_root(store)
    ensure_model(root, "m", input_ids=[f"i{i}" for i in range(n)], n_layers=layers, t_max=t_max,
                 shard_size=n, token_sets=TOKEN_SETS, attrs={}, fingerprint_inputs={}, **moved)
    root.attrs["models"] = ["m"]
    group = open_model(store, "m", mode="r+")
    write_attention(group, 0, attention)
    write_tokens(group, 0, n_tokens, kinds)
    if device_kappa is not None:
        from storage.store import write_device_rollout

        write_device_rollout(group, 0, device_kappa)
    return TestTask(key="test-m-00000", store=store, model="m", shard=0, start=0, stop=n,
                    token_sets=TOKEN_SETS, tol=1e-12, **moved)


def test_side() -> ModuleType:
    """The tree's test-task module: `workers.tasks.verdicts`, or `workers.tasks` in a tree from
    before the split (966479d)."""
    try:
        return importlib.import_module("workers.tasks.verdicts")
    except ModuleNotFoundError:
        return importlib.import_module("workers.tasks")


def task_in_store(t: int, store: str, options: dict[str, str]) -> Callable[[], object]:
    """The whole test task over the shard written to `store` (the tree's own store code)."""
    from storage.location import StoreRef

    run_test = test_side().run_test
    task = write_test_shard(StoreRef.of(store, options), *shard(t))
    return lambda: run_test(task)


def child(t: int, rounds: int, workers: int, store: str | None,
          options: dict[str, str]) -> None:
    """Time evaluate_shard (or, with a store, run_test) in this process (the tree on
    PYTHONPATH); print one JSON line."""
    evaluate_shard = test_side().evaluate_shard

    attention, n_tokens, kinds = shard(t)
    if store is None:
        def stage() -> None:
            evaluate_shard(attention, n_tokens, kinds, TOKEN_SETS, 1e-12, "every")
    else:
        stage = task_in_store(t, store, options)

    def run() -> None:
        if workers == 1:
            stage()
            return
        with ThreadPoolExecutor(workers) as pool:
            for future in [pool.submit(stage) for _ in range(workers)]:
                future.result()

    run()  # warm-up: numba's cache, scratch buffers
    wall = cpu = np.inf
    for _ in range(rounds):
        w, c = time.perf_counter(), time.process_time()
        run()
        wall, cpu = min(wall, time.perf_counter() - w), min(cpu, time.process_time() - c)
    done = workers * len(n_tokens)
    print(json.dumps({"wall_ms": 1e3 * wall / done, "cpu_ms": 1e3 * cpu / done}))


def timed_in(tree: Path, t: int, rounds: int, workers: int, store: str | None,
             endpoint: str | None) -> dict[str, float]:
    """One child's best times in `tree` (`store`: time the whole task in a store there)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    extra = ["--task-store", store] if store else []
    extra += ["--endpoint-url", endpoint] if endpoint else []
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(t), "--rounds", str(rounds), "--workers",
         str(workers), *extra], env=env, cwd=tree, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"{tree}: the stage failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", default="",
                        help="comma-separated trees (worktrees of older commits)")
    parser.add_argument("--sizes", default="197,577,1370")
    parser.add_argument("--rounds", type=int, default=3, help="timed calls per child")
    parser.add_argument("--repeats", type=int, default=2, help="children per tree, alternating")
    parser.add_argument("--workers", type=int, default=1, help="concurrent shards (threads)")
    parser.add_argument("--task", action="store_true",
                        help="time the whole test task (store read, test, write, marker)")
    parser.add_argument("--store", help="with --task: an object store prefix (s3://bucket/p)")
    parser.add_argument("--endpoint-url", help="an S3-compatible server for --store")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--task-store", help=argparse.SUPPRESS)
    args = parser.parse_args()
    options = {"endpoint_url": args.endpoint_url} if args.endpoint_url else {}
    if args.child is not None:
        child(args.child, args.rounds, args.workers, args.task_store, options)
        return
    if args.task and args.workers != 1:
        parser.error("--task times one task at a time: leave --workers at 1")
    if args.store and not args.task:
        parser.error("--store needs --task")
    here = Path(__file__).resolve().parent.parent
    trees = [here] + [Path(p).resolve() for p in args.against.split(",") if p]
    threads = {k: os.environ.get(k, "default") for k in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS")}
    what = (f"the whole test task, store {args.store or 'a local folder'}" if args.task
            else "evaluate_shard")
    print(f"{what}; threads {threads}, workers {args.workers}, best of {args.rounds} calls x "
          f"{args.repeats} alternating children per tree")
    with tempfile.TemporaryDirectory() as tmp:
        for t in (int(s) for s in args.sizes.split(",")):
            best = {tree: {"wall_ms": np.inf, "cpu_ms": np.inf} for tree in trees}
            for repeat in range(args.repeats):
                for number, tree in enumerate(trees):
                    store = None
                    if args.task:
                        name = f"t{t}-tree{number}-r{repeat}.zarr"
                        store = (f"{args.store.rstrip('/')}/{name}" if args.store
                                 else str(Path(tmp) / name))
                    got = timed_in(tree, t, args.rounds, args.workers, store, args.endpoint_url)
                    best[tree] = {k: min(best[tree][k], got[k]) for k in got}
            report(t, trees, best, here)


def report(t: int, trees: list[Path], best: dict[Path, dict[str, float]], here: Path) -> None:
    """One size's lines: each tree's best per input and its ratio to this tree."""
    print(f"T = {t} ({LAYERS} layers, {inputs_for(t)} inputs, all + content):")
    for tree in trees:
        wall, cpu = best[tree]["wall_ms"], best[tree]["cpu_ms"]
        ratio = cpu / best[here]["cpu_ms"]
        print(f"  {str(tree):<40} {cpu:9.2f} CPU ms {wall:9.2f} wall ms per input  "
              f"CPU/wall {cpu / wall:4.2f}  CPU vs this tree {ratio:5.2f}x")


if __name__ == "__main__":
    main()

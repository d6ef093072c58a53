"""The driver's submission loop: CPU-seconds of `sweep.driver.graph.Submitter` per finished task,
for a bounded model (`attention: drop`) of N shards, this tree against older ones (worktrees),
in one run, the trees in turn.

    git worktree add --detach /tmp/submit-before 966479d
    PYTHONPATH=. python benchmarks/submit_bench.py [--shards 250,1000,2000] [--in-flight 16] \
        [/tmp/submit-before]

The plan (one ViT-sized model of N shards of 32 inputs, its matched nulls; built from facts, so
nothing is read) goes to a Submitter whose client only records submissions; tasks finish one at
a time, oldest first, and after each the loop does what `DaskExecutor` does (`finished`, then
`submit_ready`). Printed per tree and N: the process's CPU-seconds for all of it and per finished
task. Each (tree, N) runs in a fresh process with that tree alone on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = """
import json, sys, time
from collections import deque
from sweep.config.load import parse_config
from sweep.driver.graph import Submitter
from sweep.driver.plan import ModelFacts, build_plan

class Client:
    def submit(self, function, *args, key, **options):
        return key

shards, in_flight = int(sys.argv[1]), int(sys.argv[2])
ids = tuple(f"i{i}" for i in range(32 * shards))
config = parse_config({"store": "/tmp/never-written.zarr", "attention": "drop",
                       "datasets": {"photos": {"source": "sklearn:sample_images"}},
                       "models": {"vit": {"source": "tiny-vit", "dataset": "photos"}},
                       "matched_nulls": {"nulls": ["uniform"], "trials": 20000, "seed": 0}})
plan = build_plan(config, {"vit": ModelFacts.from_counts(ids, 12, (197,) * len(ids))})
tasks = list(plan.tasks)
start = time.process_time()
submitter = Submitter(Client(), plan, tasks, 0, in_flight)
running, done = deque(submitter.submit_ready()), 0
while running:
    key = running.popleft()
    submitter.finished(key)
    running.extend(submitter.submit_ready())
    done += 1
print(json.dumps({"tasks": len(tasks), "done": done, "cpu": time.process_time() - start}))
"""


def measure(tree: Path, shards: int, in_flight: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", CHILD, str(shards), str(in_flight)], cwd=tree,
                          env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="*", type=Path, help="worktrees of older commits")
    parser.add_argument("--shards", default="250,1000,2000")
    parser.add_argument("--in-flight", type=int, default=16, help="the bounded model's window")
    args = parser.parse_args()
    trees = [REPO, *(tree.resolve() for tree in args.trees)]
    print(f"a bounded model of N shards (32 inputs each) and its matched nulls, window "
          f"{args.in_flight}; load average {os.getloadavg()[0]:.1f} at the start")
    for shards in (int(n) for n in args.shards.split(",")):
        for tree in trees:
            out = measure(tree, shards, args.in_flight)
            print(f"  N = {shards:>5} {str(tree):<28} {out['tasks']:>6} tasks, {out['cpu']:7.2f} "
                  f"CPU-s, {1e3 * out['cpu'] / out['done']:7.3f} ms per finished task")


if __name__ == "__main__":
    main()

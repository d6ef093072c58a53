"""`sweep report` of one store by two source trees, alternated in one run: wall and CPU seconds.

Each round runs, for each tree in turn, `python -m sweep report STORE --no-cache` (and, with
`--html`, also writing the page) in a fresh process with that tree first on PYTHONPATH, and
reads the process's CPU time (user + system, its children included) from `getrusage`. Prints
one JSON line per run and the medians per tree and output. The figures in benchmarks/README.md
("sweep report on issue 45's small study"):

    PYTHONPATH=. python benchmarks/report_bench.py /tmp/study/runs/study.zarr \\
        --tree before=/path/to/main --tree after=. --rounds 2 --html
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def one(tree: Path, store: str, html: Path | None, folder: str) -> tuple[float, float]:
    """Wall and CPU seconds of one `sweep report` of `store` by the code of `tree`, run in
    `folder` (`python -m` puts the current folder before PYTHONPATH: not a source tree)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1"}
    argv = [sys.executable, "-m", "sweep", "report", str(Path(store).resolve()), "--no-cache"]
    if html is not None:
        argv += ["--html", str(html)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, cwd=folder)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store")
    parser.add_argument("--tree", action="append", required=True, metavar="NAME=PATH")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--html", action="store_true", help="also time the HTML page")
    args = parser.parse_args()
    trees = {name: Path(path).resolve() for name, path in (t.split("=", 1) for t in args.tree)}
    outputs = ["md", "html"] if args.html else ["md"]
    runs: dict[tuple[str, str], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as folder:
        for round_ in range(args.rounds):
            for output in outputs:
                for name, tree in trees.items():
                    page = Path(folder) / "r.html" if output == "html" else None
                    wall, cpu = one(tree, args.store, page, folder)
                    runs.setdefault((name, output), []).append((wall, cpu))
                    print(json.dumps({"round": round_, "tree": name, "output": output,
                                      "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                                      "load": round(os.getloadavg()[0], 1)}), flush=True)
    for (name, output), values in runs.items():
        print(json.dumps({"tree": name, "output": output, "median_wall_s": round(
            statistics.median(w for w, _ in values), 2), "median_cpu_s": round(
            statistics.median(c for _, c in values), 2)}))


if __name__ == "__main__":
    main()

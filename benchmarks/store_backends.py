"""The same sweep into a local folder and into SeaweedFS through each object-store backend
(obstore, fsspec/s3fs), in one run, rounds interleaved: the wall time of the sweep and of the
start-up check on the finished store (`sweep status` does the same listing-based check), as ratios
to the local folder.

Needs the S3 server of `.ci/s3-up.sh` (endpoint and test credentials as in tests/s3_fixtures.py).

    PYTHONPATH=. HF_HUB_OFFLINE=1 python benchmarks/store_backends.py --inputs 24 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from tests.s3_fixtures import CREDENTIALS, ENDPOINT, filesystem

CONFIG = """\
store: {store}
storage_options: {options}
shard_size: 4
datasets:
  photos: {{source: 'sklearn:sample_images', limit: 2}}
  wine: {{source: 'sklearn:wine', limit: {inputs}}}
  topics: {{source: 'pydoc:topics', limit: {inputs}}}
models:
  vit: {{source: tiny-deit-distilled, dataset: photos, options: {{image_size: 224}}}}
  ft: {{source: ft-transformer, dataset: wine, options: {{max_epochs: 2, n_blocks: 2}}}}
  rob: {{source: tiny-roberta, dataset: topics, batch_size: 4}}
baseline: {{sizes: [2, 5, 10], trials: 20000, seed: 3, chunk_trials: 10000}}
matched_nulls: {{trials: 4000, chunk_trials: 2000}}
"""


def timed(argv: list[str], folder: Path) -> float:
    """Seconds of one CLI call in a fresh process (exit status 0 or the run fails loudly)."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "sweep", *argv], cwd=folder, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    os.environ.update(CREDENTIALS)
    bucket = f"dobrushin-bench-{uuid.uuid4().hex[:8]}"
    fs = filesystem()
    fs.mkdir(bucket)
    backends = {"local": None, "s3 obstore": "obstore", "s3 fsspec": "fsspec"}
    times: dict[str, dict[str, list[float]]] = {b: {"sweep": [], "status": []} for b in backends}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for round_ in range(args.rounds):
                for name, backend in backends.items():
                    folder = Path(tmp) / f"{round_}-{name.replace(' ', '-')}"
                    folder.mkdir()
                    if backend is None:
                        store, options = "sweep.zarr", {}
                    else:
                        store = f"s3://{bucket}/{round_}/{backend}.zarr"
                        options = {"endpoint_url": ENDPOINT, "backend": backend}
                    (folder / "sweep.yaml").write_text(
                        CONFIG.format(store=store, options=options, inputs=args.inputs))
                    times[name]["sweep"].append(timed(
                        ["run", "sweep.yaml", "--in-process", "--no-progress"], folder))
                    options_args = [f"--storage-option={k}={v}" for k, v in options.items()]
                    times[name]["status"].append(timed(["status", store, *options_args], folder))
    finally:
        fs.rm(bucket, recursive=True)
    local = {stage: statistics.median(times["local"][stage]) for stage in ("sweep", "status")}
    print(f"{args.rounds} interleaved rounds, {args.inputs} inputs per text/table model; "
          "median wall seconds (ratio to local)")
    print("| store | sweep run | sweep status |\n|---|---|---|")
    for name in backends:
        cells = [f"{statistics.median(times[name][s]):.1f} "
                 f"({statistics.median(times[name][s]) / local[s]:.2f}x)"
                 for s in ("sweep", "status")]
        print(f"| {name} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()

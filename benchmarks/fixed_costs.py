"""The fixed costs `sweep plan --cluster` adds to its per-input predictions, measured here:

- worker start: `open_client` on the default local cluster until its workers answer
  (processes spawned, `sweep` and its task modules imported in each worker);
- model load: one model built in a fresh process, as a worker's first extraction of that model
  does (torch/transformers imports included), for each source named, with the process's
  resident set then (a tiny preset's: torch and its family's imports; `sweep plan --cluster`'s
  extraction memory, `sweep.clusters.memory`); and the resident set of a fresh process that
  imported the extraction side alone (`workers.tasks.extract`: torch).

Usage: python benchmarks/fixed_costs.py [SOURCE ...] (default: the default sweep's models that
load without training: minilm-l6 tiny-roberta tiny-deit-distilled); prints one line per
measurement and the mean to put in `sweep.driver.balance.CONSTANTS` (WORKER_START_S,
MODEL_LOAD_S).
"""

from __future__ import annotations

import subprocess
import sys
import time

LOAD = """
import sys, time
start = time.perf_counter()
from workers.inputs import open_dataset
from workers.models.extraction import load_extractor, model_dataset
from workers.models.registry import resolve_model
from sweep.config.load import default_config_path, load_config
config = load_config(default_config_path())
source = sys.argv[1]
name = next(n for n, m in config.models.items() if m.source == source)
entry = config.models[name]
spec = resolve_model(entry.source, **entry.options)
dataset = model_dataset(spec, open_dataset(config.datasets[entry.dataset].to_spec()))
load_extractor(spec, dataset=dataset, device="cpu")
seconds = time.perf_counter() - start
with open("/proc/self/status") as status:
    rss = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024
print(seconds, rss)
"""

IMPORTS = """
import workers.tasks.extract  # torch, the extraction side: what every GPU-pool worker imports
with open("/proc/self/status") as status:
    print(next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024)
"""


def worker_start() -> float:
    """Seconds from `open_client` on the default local cluster to its workers answering."""
    from sweep.clusters.client import load_cluster_config, open_client

    start = time.perf_counter()
    with open_client(load_cluster_config(None)) as client:
        client.run(lambda: __import__("workers.tasks.verdicts"))  # what a test task imports
        return time.perf_counter() - start


def model_load(source: str) -> tuple[float, float]:
    """Seconds a fresh process takes to import the model code and build `source`'s model, and
    its resident set (MiB) then."""
    done = subprocess.run([sys.executable, "-c", LOAD, source], capture_output=True, text=True,
                          check=True)
    seconds, rss = done.stdout.strip().splitlines()[-1].split()
    return float(seconds), float(rss)


def extraction_imports() -> float:
    """MiB resident in a fresh process once it imported the extraction side (torch)."""
    done = subprocess.run([sys.executable, "-c", IMPORTS], capture_output=True, text=True,
                          check=True)
    return float(done.stdout.strip().splitlines()[-1])


def main() -> None:
    sources = sys.argv[1:] or ["minilm-l6", "tiny-roberta", "tiny-deit-distilled"]
    start = worker_start()
    print(f"worker start (default local cluster): {start:.1f} s")
    print(f"a fresh process after importing workers.tasks.extract (torch): "
          f"{extraction_imports():.0f} MiB")
    loads = []
    for source in sources:
        seconds, rss = model_load(source)
        loads.append(seconds)
        print(f"model load {source}: {seconds:.1f} s, {rss:.0f} MiB resident after it")
    print(f"mean model load: {sum(loads) / len(loads):.1f} s")


if __name__ == "__main__":
    main()

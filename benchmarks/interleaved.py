"""Two variants of the extraction task in one process, rounds interleaved: the tool for effects
smaller than this machine's drift between processes (tens of percent; `pipeline_bench.py`
compares trees in processes of their own). Used by `write_ahead_bench.py` and
`normalise_rows_bench.py`, each of which keeps its baseline's code.

Per round: the bare eager forward pass, then the extraction task of one variant (the models,
inputs and `Measured` of `pipeline_bench.py`; each round into new chunk files, nothing deleted
until the end), the variants' order alternating round by round. Reported per variant: the
median and quartiles of the rounds' paired ratios (bare wall / extraction wall), and the median
CPU ms per input outside the forward pass (every thread counted).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pipeline_bench as pb  # noqa: E402

Variant = Callable[[pb.Measured], AbstractContextManager]
"""A variant: given the measured task, a context in which its extraction runs that way."""


def measure(measured: pb.Measured, rounds: int,
            variants: dict[str, Variant]) -> dict[str, list[tuple[float, float]]]:
    """(paired ratio, CPU ms per input outside the forward pass) per round and variant."""
    out: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    names = list(variants)
    for name in names:  # warm-up: each variant's first write of its buffers and files
        with variants[name](measured):
            measured.unwrite()
            measured.extract()
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            measured.unwrite()
            wall, cpu = time.perf_counter(), time.process_time()
            measured.bare()
            bare_wall, bare_cpu = time.perf_counter() - wall, time.process_time() - cpu
            with variants[name](measured):
                wall, cpu = time.perf_counter(), time.process_time()
                measured.extract()
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            out[name].append((bare_wall / wall, (cpu - bare_cpu) / measured.n * 1e3))
    return out


def run(title: str, models: list[str], rounds: int, variants: dict[str, Variant]) -> None:
    """`measure` each model's task (`pipeline_bench`'s thin models and inputs); print."""
    print(f"{title}: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        images = pb.make_images(folder / "images", max(pb.DEFAULT_INPUTS.values()))
        for name in models:
            path, options = pb.thin_model(folder / "models", name)
            n = pb.DEFAULT_INPUTS[name]
            config = pb.sweep_config(folder, path, options, name, n, pb.BATCH[name], images)
            measured = pb.Measured(config, scratch)
            results = measure(measured, rounds, variants)  # its store deleted with the scratch
            print(f"\n{name}: {n} inputs, batch {pb.BATCH[name]}, {rounds} rounds each")
            for variant_name, rows in results.items():
                ratios = [r[0] for r in rows]
                q1, q3 = np.percentile(ratios, [25, 75])
                print(f"  {variant_name:7} ratio {statistics.median(ratios):.2f} "
                      f"(quartiles {q1:.2f}-{q3:.2f}), CPU ms/input outside forward "
                      f"{statistics.median(r[1] for r in rows):.2f}")


def main(title: str, description: str, default_models: str, variants: dict[str, Variant]) -> None:
    """The command line the interleaved benchmarks share: `--models`, `--rounds`; then `run`."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--models", default=default_models)
    parser.add_argument("--rounds", type=int, default=10, help="rounds of each variant")
    args = parser.parse_args()
    run(title, args.models.split(","), args.rounds, variants)

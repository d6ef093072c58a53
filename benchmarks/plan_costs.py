"""The measured constants of `sweep plan`'s prices (`sweep/driver/balance.py`,
TRAINING_COSTS and NULL_CONSTANTS).

`training RECIPE TABLE [--seed S] [--option KEY=VALUE ...]`: trains the recipe (a preset the
project trains: `ft-transformer`, `vit-digits`, ...; default options, or these: e.g.
`--option objective=dino`) on a scikit-learn table on the CPU with 1
torch thread, as a sweep's preparation task does (nothing cached), and prints one JSON line: the
table's rows, the model's tokens, the epochs run, the CPU and wall seconds, and CPU-s per
(row x token x epoch), the unit of `TRAINING_COSTS`.

`nulls [--sizes 8,17,64] [--trials 4000]`: times the null draws and tests of `sweep baseline`
(uniform and softmax-b1, one thread) per size and prints CPU-s per trial, the unit of
`NULL_TRIAL_S` / `NULL_ELEMENT_S` (a trial of size n costs about NULL_TRIAL_S + NULL_ELEMENT_S
x n^2 + CHECK_S x n^3 / 2).

    for r in "vit-digits digits" "ft-transformer breast_cancer" "ft-transformer wine"; do
      NUMBA_NUM_THREADS=1 OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/plan_costs.py \\
        training $r; done
    NUMBA_NUM_THREADS=1 OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/plan_costs.py nulls

`host [--models vit-b,roberta,dinov2-518] [--rounds 3]`: one GPU worker's host work, the unit
of HOST_IMAGE_S, HOST_TEXT_S and HOST_BYTE_S. Per model of `pipeline_bench.py`'s thin models
and inputs (one shard; the least of `--rounds` rounds): the load alone (read, decode,
preprocess, one torch thread: CPU-s per input), and the extraction task with a simulated device
(`pipeline_bench.simulated_device`: no forward pass, the sink given precomputed maps; each round
into new chunk files; CPU-s per input). Both count every thread of the process. One JSON line per
model; then the fit: CPU-s per attention byte from the model with the most bytes per input
(its task less its load, per byte: what else a task does per input counted in), and each
family's CPU-s per input, its task less that x its bytes. Run it where nothing was deleted in
the last minute (`pipeline_bench.py` says why).

    PYTHONPATH=. python benchmarks/plan_costs.py host
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pipeline_bench as pb  # noqa: E402


def training(recipe: str, table: str, seed: int, options: dict | None = None) -> dict:
    """Train `recipe` (with `options`) on sklearn:`table` once; its cost as one record."""
    import torch

    from workers.inputs import DatasetSpec, open_dataset
    from workers.models.registry import resolve_model
    from workers.models.token_layout import token_layout

    torch.set_num_threads(1)
    spec = resolve_model(recipe, seed=seed, **(options or {}))
    kind = "image" if spec.modality == "image" else "tabular"
    dataset = open_dataset(DatasetSpec(kind=kind, source=f"sklearn:{table}"))
    tokens = token_layout(spec, dataset).tokens
    wall, cpu = time.perf_counter(), time.process_time()
    if spec.family == "ft-transformer":
        from workers.models.trained.ft import training as ft_training

        record = ft_training.train(spec, dataset.table, device=torch.device("cpu"))[2]
    else:
        from workers.models.trained.vit import training as vit_training

        record = vit_training.train(spec, dataset.table)[2]
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    rows, epochs = len(dataset.table.target), int(record["epochs_run"])
    return {"recipe": recipe, "options": options or {}, "table": table, "seed": seed,
            "rows": rows, "tokens": tokens,
            "epochs_run": epochs, "best_epoch": record["best_epoch"],
            "cpu_s": round(cpu, 1), "wall_s": round(wall, 1),
            "cpu_s_per_row_token_epoch": float(f"{cpu / (rows * tokens * epochs):.3g}")}


def nulls(sizes: list[int], trials: int) -> list[dict]:
    """CPU-s per trial of the baseline's draws and tests at each size."""
    from workers.nulls.baseline import run_baseline

    out = []
    for n in sizes:
        run_baseline([n], min(trials, 200), 0, nulls=("uniform",))  # compile, warm
        cpu = time.process_time()
        run_baseline([n], trials, 0, nulls=("uniform", "softmax-b1"))
        per = (time.process_time() - cpu) / (2 * trials)
        out.append({"n": n, "trials": 2 * trials, "cpu_s_per_trial": float(f"{per:.3g}")})
    return out


def host(models: list[str], rounds: int) -> list[dict]:
    """Per model: CPU-s per input of its load alone and of its task on a simulated device;
    then one record of the fitted constants (`host` above)."""
    records = []
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        images = pb.make_images(folder / "images", max(pb.DEFAULT_INPUTS[m] for m in models))
        for name in models:
            path, options = pb.thin_model(folder / "models", name)
            n = pb.DEFAULT_INPUTS[name]
            config = pb.sweep_config(folder, path, options, name, n, pb.BATCH[name], images)
            records.append({"model": name, **_host_costs(pb.Measured(config, scratch), rounds)})
    big = max(records, key=lambda r: r["input_bytes"])
    per_byte = (big["task_cpu_s"] - big["load_cpu_s"]) / big["input_bytes"]
    fit = {"HOST_BYTE_S": per_byte, "from": big["model"]}
    for record in records:
        fit[f"{record['model']} per input"] = record["task_cpu_s"] - \
            per_byte * record["input_bytes"]
    return [*records, fit]


def _host_costs(measured, rounds: int) -> dict:
    """CPU-s per input of `measured`'s load alone (in this thread, one torch thread) and of its
    task on a simulated device, each the least of `rounds` (the process's CPU: every thread)."""
    from workers.models.determinism import fixed_torch
    from workers.tasks.extract import fresh_digests

    extractor, task = measured.extractor, measured.tasks[0]
    dataset, _ = fresh_digests(task)
    parts = [range(a, min(a + task.batch_size, task.stop))
             for a in range(task.start, task.stop, task.batch_size)]

    def load_all() -> float:  # the process's CPU: a fast tokenizer may use threads of its own
        start = time.process_time()
        with fixed_torch(1):
            for part in parts:
                extractor.prepare_into(extractor.read(dataset, part), None)
        return time.process_time() - start

    def one_task() -> float:
        measured.unwrite()
        start = time.process_time()
        measured.extract()
        return time.process_time() - start

    load_all()
    load = min(load_all() for _ in range(rounds)) / measured.n
    pb.simulated_device(measured)  # t = 0: no forward pass
    measured.extract()  # warm-up
    task_s = min(one_task() for _ in range(rounds)) / measured.n
    return {"n": measured.n, "input_bytes": measured.input_bytes, "load_cpu_s": load,
            "task_cpu_s": task_s, "cores": len(os.sched_getaffinity(0))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    train = sub.add_parser("training")
    train.add_argument("recipe")
    train.add_argument("table")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                       help="a training option other than the recipe's (a YAML value)")
    null = sub.add_parser("nulls")
    null.add_argument("--sizes", default="8,17,64")
    null.add_argument("--trials", type=int, default=4000)
    hosts = sub.add_parser("host")
    hosts.add_argument("--models", default="vit-b,roberta,dinov2-518")
    hosts.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.what == "training":
        import yaml

        options = {key: yaml.safe_load(value) for key, _, value in
                   (option.partition("=") for option in args.option)}
        print(json.dumps(training(args.recipe, args.table, args.seed, options)))
    elif args.what == "host":
        for record in host(args.models.split(","), args.rounds):
            print(json.dumps(record), flush=True)
    else:
        for record in nulls([int(n) for n in args.sizes.split(",")], args.trials):
            print(json.dumps(record))


if __name__ == "__main__":
    main()

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
"""

from __future__ import annotations

import argparse
import json
import time


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
    args = parser.parse_args()
    if args.what == "training":
        import yaml

        options = {key: yaml.safe_load(value) for key, _, value in
                   (option.partition("=") for option in args.option)}
        print(json.dumps(training(args.recipe, args.table, args.seed, options)))
    else:
        for record in nulls([int(n) for n in args.sizes.split(",")], args.trials):
            print(json.dumps(record))


if __name__ == "__main__":
    main()

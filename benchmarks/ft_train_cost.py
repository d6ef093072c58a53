"""Training cost of one FT-Transformer by the default recipe: CPU and wall seconds, epochs.

Trains `ft-transformer` (default options, or `--option key=value`) on a scikit-learn table with
`--seed` on the CPU with `--threads` torch threads (not cached) and prints one JSON line: the
record's test score, best epoch, epochs run, what stopped training, split sizes, and the CPU and
wall seconds of the training. The numbers in docs/ft-transformer.md:

    for t in breast_cancer wine; do for s in 0 1 2; do
      PYTHONPATH=. python benchmarks/ft_train_cost.py $t --seed $s; done; done
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import yaml

from workers.inputs import DatasetSpec, open_dataset
from workers.models.registry import resolve_model
from workers.models.trained.ft import training as ft_training


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", help="a scikit-learn table: breast_cancer, wine, digits, ...")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="an FT-Transformer option (YAML value), e.g. preprocessing=standard")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    options = {k: yaml.safe_load(v) for k, v in (o.split("=", 1) for o in args.option)}
    dataset = open_dataset(DatasetSpec(kind="tabular", source=f"sklearn:{args.table}"))
    spec = resolve_model("ft-transformer", seed=args.seed, **options)
    wall, cpu = time.perf_counter(), time.process_time()
    record = ft_training.train(spec, dataset.table, device=torch.device("cpu"))[2]
    keys = ("test_score", "best_epoch", "epochs_run", "stopped_by", "split", "n_params",
            "torch_threads")
    print(json.dumps({"table": args.table, "seed": args.seed, **{k: record[k] for k in keys},
                      "cpu_s": round(time.process_time() - cpu, 1),
                      "wall_s": round(time.perf_counter() - wall, 1)}))


if __name__ == "__main__":
    main()

"""Which unit an over-training interval needs: the seed, the (seed, layer) cell, or the input.

For each trajectory of a store swept over checkpoints with seed replicates and controls
(`sweep/config/vit-objectives.yaml`), checkpoint and token set, the paired difference
checkpoint - initialisation (each seed's control) three ways: Student's t across the k seeds of
each seed's difference (the report's interval: the unit is the training run), Student's t
across the k x L (seed, layer) cells of per-layer differences (valid only if a seed's layers
were independent draws), and a binomial interval treating every input-layer verdict as
independent (what an interval over inputs implies across seeds); with the intraclass
correlation of the per-layer differences within a seed (one-way ANOVA: how much of their
spread is the seed's, which makes the cells interval too narrow), and the same for the rate
at initialisation.

    PYTHONPATH=. python benchmarks/seed_layer_units.py runs/vit-objectives.zarr
"""

from __future__ import annotations

import argparse
import math

import numpy as np
from scipy import stats

from storage.query.results import holding_rates, open_results
from sweep.report.training import _trajectories

Z = 1.959963984540054


def t_half(values: np.ndarray) -> float:
    return float(stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / math.sqrt(len(values)))


def icc(cells: np.ndarray) -> float:
    """One-way ANOVA intraclass correlation of a (seeds, layers) array."""
    k, n = cells.shape
    between = n * ((cells.mean(1) - cells.mean()) ** 2).sum() / (k - 1)
    within = ((cells - cells.mean(1, keepdims=True)) ** 2).sum() / (k * (n - 1))
    return float((between - within) / (between + (n - 1) * within))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store")
    parser.add_argument("--checkpoints", default="epoch 0,epoch 5,best")
    args = parser.parse_args()
    tree = open_results(args.store)
    rates = holding_rates(tree, by=("model", "layer", "token_set"))
    rate = {(r.model, int(r.layer), r.token_set): (r.rate, r.cells)
            for r in rates.itertuples()}
    print("| model | checkpoint | token set | k | mean Δ pp | ± t over seeds | ± t over "
          "(seed, layer) | ± binomial over input-layer cells | ICC of Δ | ICC at init |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for model, seeds in _trajectories(dict.fromkeys(rates["model"])).items():
        for label in args.checkpoints.split(","):
            names = {s: m[label] for s, m in seeds.items() if label in m}
            for token_set in dict.fromkeys(rates["token_set"]):
                layers = sorted({lay for (m, lay, t) in rate if m in names.values()
                                 and t == token_set})
                if len(names) < 2 or not layers:
                    continue
                d = np.array([[rate[(n, lay, token_set)][0]
                               - rate[(f"{_base(n)}@random-init", lay, token_set)][0]
                               for lay in layers] for n in names.values()])
                init = np.array([[rate[(f"{_base(n)}@random-init", lay, token_set)][0]
                                  for lay in layers] for n in names.values()])
                cells = sum(rate[(n, lay, token_set)][1] for n in names.values() for lay in layers)
                mean = float(d.mean())
                p1 = float(np.mean([rate[(n, lay, token_set)][0] for n in names.values()
                                    for lay in layers]))
                p0 = float(init.mean())
                binomial = Z * math.sqrt((p1 * (1 - p1) + p0 * (1 - p0)) / cells)
                print(f"| {model} | {label} | {token_set} | {len(names)} | {100 * mean:+.1f} | "
                      f"{100 * t_half(d.mean(1)):.1f} | {100 * t_half(d.ravel()):.1f} | "
                      f"{100 * binomial:.1f} | "
                      f"{icc(d) if label != 'epoch 0' else math.nan:.2f} | {icc(init):.2f} |")


def _base(name: str) -> str:
    from sweep.report.training import _base as base

    return base(name)


if __name__ == "__main__":
    main()

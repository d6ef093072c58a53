"""FT-Transformer's view of a table: the seeded split, the standardisation, the model's inputs
and its seeded initial architecture.

Functions of a spec's options, its seed and a `Table`: training, the extractor, the random-init
control and the driver's planning (`model_rows`) all derive the same split, preprocessing and
initial weights from them. Tokens: CLS, then the continuous features, then the categorical
ones (each group in column order), as the library orders them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from rtdl_revisiting_models import FTTransformer

from storage.errors import InputError
from workers.inputs import Table

STATS = ("stats.feature_mean", "stats.feature_std", "stats.target_mean", "stats.target_std")
PARTS = ("train", "val", "test")
MIN_STD = 1e-8  # below this a training column counts as constant: divided by 1, not by ~0


def split_indices(n: int, seed: int, val_fraction: float, test_fraction: float) -> dict:
    """A fixed random train/val/test split of range(n) from `seed`; each part ascending."""
    order = np.random.default_rng(seed).permutation(n)
    n_test, n_val = round(n * test_fraction), round(n * val_fraction)
    if n - n_test - n_val < 1 or n_val < 1 or n_test < 1:
        raise InputError(f"tabular dataset of {n} rows is too small to split train/val/test")
    return {"test": np.sort(order[:n_test]), "val": np.sort(order[n_test:n_test + n_val]),
            "train": np.sort(order[n_test + n_val:])}


def table_split(options: dict[str, Any], seed: int, table: Table) -> dict[str, np.ndarray]:
    """The split of every row of `table` that a spec with these options and seed trains on."""
    return split_indices(len(table.target), seed, options["val_fraction"],
                         options["test_fraction"])


def model_rows(options: dict[str, Any], seed: int, table: Table) -> np.ndarray:
    """The table rows attention is measured on, ascending: the test rows, or all (`split`)."""
    if options["split"] == "all":
        return np.arange(len(table.target))
    return table_split(options, seed, table)["test"]


def output_size(table: Table) -> int:
    """d_out: the number of classes (every row's labels; at least 2), or 1 for regression."""
    return max(int(table.target.max()) + 1, 2) if table.task == "classification" else 1


def fit_stats(table: Table, train_rows: np.ndarray) -> dict[str, torch.Tensor]:
    """Standardisation from the training rows: continuous features, and a regression target."""
    x = torch.as_tensor(table.features[np.ix_(train_rows, table.continuous)],
                        dtype=torch.float32)  # (train rows, continuous features)
    classification = table.task == "classification"
    y = torch.as_tensor(table.target[train_rows], dtype=torch.float32)
    y_std = float(y.std()) if len(y) > 1 else 1.0
    return {
        "stats.feature_mean": x.mean(0),
        "stats.feature_std": _scale(x.std(0)),
        "stats.target_mean": torch.tensor(0.0 if classification else float(y.mean())),
        "stats.target_std": torch.tensor(1.0 if classification or not y_std > MIN_STD else y_std),
    }


def _scale(std: torch.Tensor) -> torch.Tensor:
    """A standard deviation usable as a divisor: 1 where a feature is (nearly) constant."""
    return torch.where(std > MIN_STD, std, torch.ones_like(std))


def encode(rows: np.ndarray, table: Table, stats: dict[str, torch.Tensor],
           device: torch.device | None = None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Model inputs of feature rows (inputs, features): standardised continuous features
    (inputs, n_cont) float32 and categorical codes (inputs, n_cat) int64; None where absent."""
    rows = np.asarray(rows, dtype=np.float64)
    if rows.ndim != 2 or rows.shape[1] != len(table.feature_names):
        raise InputError(
            f"rows of shape {rows.shape}: the model takes {len(table.feature_names)} features"
        )
    x_cont = x_cat = None
    if table.continuous:
        x = torch.as_tensor(rows[:, table.continuous], dtype=torch.float32, device=device)
        mean = stats["stats.feature_mean"].to(device)
        x_cont = (x - mean) / stats["stats.feature_std"].to(device)
    if table.categorical:
        x_cat = torch.as_tensor(rows[:, table.categorical], device=device).long()
    return x_cont, x_cat


def architecture(options: dict[str, Any]) -> dict[str, Any]:
    """The FTTransformer backbone keyword arguments: the library's defaults for `n_blocks`,
    with option `d_block` (when set) replacing its width."""
    kwargs = FTTransformer.get_default_kwargs(int(options["n_blocks"]))
    if options.get("d_block") is not None:
        kwargs["d_block"] = int(options["d_block"])
    return kwargs


def init_model(options: dict[str, Any], seed: int, table: Table) -> FTTransformer:
    """The architecture for `table` with its initial weights drawn from `seed` alone (the global
    torch RNG is left as it was): what training starts from, and the random-init control."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return FTTransformer(
            n_cont_features=len(table.continuous), cat_cardinalities=list(table.cardinalities),
            d_out=output_size(table), **architecture(options),
        )

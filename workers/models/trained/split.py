"""The seeded train/validation/test split of a table a model is trained on, and the rows it is
measured on: pure functions of the options, the seed and the table (the driver plans with them).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from storage.errors import InputError
from workers.inputs import Table


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

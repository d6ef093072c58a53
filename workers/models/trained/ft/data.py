"""FT-Transformer's view of a table: the feature preprocessing, the model's inputs and its seeded
initial architecture.

Functions of a spec's options, its seed and a `Table`: training, the extractor and the
random-init control derive the same preprocessing and initial weights from them (and the same
split: `workers.models.trained.split`). Tokens: CLS, then the continuous features, then the
categorical ones (each group in column order), as the library orders them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from rtdl_revisiting_models import FTTransformer
from sklearn.preprocessing import QuantileTransformer

from storage.errors import InputError
from workers.inputs import Table

STATS_PREFIX = "stats."  # a checkpoint's preprocessing tensors: their keys start with it
STATS = ("stats.feature_mean", "stats.feature_std", "stats.target_mean", "stats.target_std")
QUANTILE_STATS = ("stats.quantiles", "stats.references")  # preprocessing: quantile
MIN_STD = 1e-8  # below this a training column counts as constant: divided by 1, not by ~0
QUANTILE_NOISE = 1e-5  # std of the Gaussian noise added to the training features before the fit
SUBSAMPLE = 10**9  # QuantileTransformer's subsample: every training row (the package example)


def output_size(table: Table) -> int:
    """d_out: the number of classes (every row's labels; at least 2), or 1 for regression."""
    return max(int(table.target.max()) + 1, 2) if table.task == "classification" else 1


def n_quantiles(n_train: int) -> int:
    """The package example's quantile count for `n_train` training rows: n/30 within [10, 1000]."""
    return max(min(n_train // 30, 1000), 10)


def fit_quantiles(table: Table, train_rows: np.ndarray, seed: int) -> QuantileTransformer:
    """QuantileTransformer(output_distribution="normal") fitted on the training rows' continuous
    features plus N(0, QUANTILE_NOISE^2) noise drawn from `seed` (the rows themselves are left
    as they are; the noise only breaks ties in the fit), as the rtdl_revisiting_models example."""
    x = table.features[np.ix_(train_rows, table.continuous)].astype(np.float64)
    noise = np.random.default_rng(seed).normal(0.0, QUANTILE_NOISE, x.shape)
    # sklearn caps the count at the rows it is fitted on (with a warning): cap it here, silently
    transform = QuantileTransformer(n_quantiles=min(n_quantiles(len(train_rows)), len(x)),
                                    output_distribution="normal", subsample=SUBSAMPLE,
                                    random_state=seed)
    return transform.fit(x + noise)


def quantile_stats(transform: QuantileTransformer) -> dict[str, torch.Tensor]:
    """A fitted transform as checkpoint tensors (float64): its quantiles and references."""
    return {key: torch.as_tensor(np.ascontiguousarray(value), dtype=torch.float64)
            for key, value in (("stats.quantiles", transform.quantiles_),
                               ("stats.references", transform.references_))}


def quantile_transform(stats: dict[str, torch.Tensor]) -> QuantileTransformer:
    """The fitted transform again from `quantile_stats`' tensors (sklearn's own `transform`)."""
    quantiles = stats["stats.quantiles"].detach().cpu().numpy().astype(np.float64)
    references = stats["stats.references"].detach().cpu().numpy().astype(np.float64)
    transform = QuantileTransformer(n_quantiles=len(references), output_distribution="normal",
                                    subsample=SUBSAMPLE)
    transform.quantiles_, transform.references_ = quantiles, references
    transform.n_features_in_ = quantiles.shape[1]
    return transform


def fit_preprocessing(options: dict[str, Any], seed: int, table: Table,
                      train_rows: np.ndarray) -> dict[str, torch.Tensor]:
    """The preprocessing of option `preprocessing`, fitted on the training rows only: `quantile`
    (`fit_quantiles`, the paper's) or `standard` (mean and std); a regression target is
    standardised either way. Tensors keyed by STATS_PREFIX names (they go in the checkpoint)."""
    stats = fit_stats(table, train_rows)
    if options.get("preprocessing", "standard") == "quantile" and table.continuous:
        stats = {k: v for k, v in stats.items() if not k.startswith("stats.feature_")}
        stats.update(quantile_stats(fit_quantiles(table, train_rows, seed)))
    return stats


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
    """Model inputs of feature rows (inputs, features): continuous features preprocessed by
    `stats` (quantile-transformed when it holds QUANTILE_STATS, else standardised), (inputs,
    n_cont) float32, and categorical codes (inputs, n_cat) int64; None where absent."""
    rows = np.asarray(rows, dtype=np.float64)
    if rows.ndim != 2 or rows.shape[1] != len(table.feature_names):
        raise InputError(
            f"rows of shape {rows.shape}: the model takes {len(table.feature_names)} features"
        )
    x_cont = x_cat = None
    if table.continuous and "stats.quantiles" in stats:
        x = quantile_transform(stats).transform(rows[:, table.continuous])
        x_cont = torch.as_tensor(x, dtype=torch.float32, device=device)
    elif table.continuous:
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

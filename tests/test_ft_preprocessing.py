"""FT-Transformer's preprocessing: the paper's quantile transform (the default) fitted on the
training rows only, with 1e-5 noise drawn from the seed; `standard` as the named alternative;
the checkpoint's tensors give back the fitted transform exactly."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from workers.inputs import Table
from workers.models.registry import resolve_model
from workers.models.trained.ft import training as ft_training
from workers.models.trained.ft.data import (
    encode,
    fit_preprocessing,
    fit_quantiles,
    n_quantiles,
    quantile_transform,
)
from workers.models.trained.split import table_split


def make_table(rows: int = 300, seed: int = 0) -> Table:
    """Two continuous columns (one with many ties) and one categorical column."""
    rng = np.random.default_rng(seed)
    features = np.column_stack([rng.lognormal(size=rows), rng.integers(0, 3, rows),
                                rng.integers(0, 4, rows)]).astype(np.float64)
    return Table(features=features, target=rng.integers(0, 2, rows), task="classification",
                 feature_names=("a", "ties", "colour"), fingerprint="hand-built",
                 categorical=(2,), cardinalities=(4,))


OPTIONS = resolve_model("ft-transformer").options


@pytest.mark.parametrize(("n_train", "expected"), [(24, 10), (341, 11), (1077, 35), (60_000, 1000)])
def test_quantile_count_is_the_package_examples_rule(n_train, expected):
    assert n_quantiles(n_train) == expected  # max(min(n // 30, 1000), 10)


def test_the_default_recipe_is_the_papers():
    options = resolve_model("ft-transformer").options
    assert (options["preprocessing"], options["batch_size"], options["n_blocks"]) == \
        ("quantile", 256, 3)
    from workers.models.trained.ft.data import architecture

    arch = architecture(options)
    assert (arch["d_block"], arch["attention_n_heads"]) == (192, 8)


def test_the_transform_is_fitted_on_the_training_rows_only():
    table = make_table()
    split = table_split(OPTIONS, 0, table)
    stats = fit_preprocessing(OPTIONS, 0, table, split["train"])
    assert set(stats) == {"stats.quantiles", "stats.references", "stats.target_mean",
                          "stats.target_std"}
    assert stats["stats.quantiles"].shape == (n_quantiles(len(split["train"])), 2)
    changed = table.features.copy()
    held_out = np.concatenate([split["val"], split["test"]])
    changed[held_out, 0] = 1e6  # any value on the held-out rows: the same transform
    same = fit_preprocessing(OPTIONS, 0, replace(table, features=changed), split["train"])
    assert all(torch.equal(stats[k], same[k]) for k in stats)
    changed[split["train"][:20], 0] = 1e6  # the training rows' values move it
    moved = fit_preprocessing(OPTIONS, 0, replace(table, features=changed), split["train"])
    assert not torch.equal(stats["stats.quantiles"], moved["stats.quantiles"])


def test_a_table_of_fewer_training_rows_than_quantiles_fits_one_quantile_per_row():
    table = make_table(rows=12)
    rows = table_split(OPTIONS, 0, table)["train"]
    stats = fit_preprocessing(OPTIONS, 0, table, rows)
    assert len(rows) < 10 and stats["stats.quantiles"].shape == (len(rows), 2)


def test_the_transform_is_a_function_of_the_seed():
    table = make_table()
    rows = table_split(OPTIONS, 0, table)["train"]
    first, again = (fit_preprocessing(OPTIONS, 3, table, rows) for _ in range(2))
    assert all(torch.equal(first[k], again[k]) for k in first)
    other = fit_preprocessing(OPTIONS, 4, table, rows)  # another noise draw
    assert not torch.equal(first["stats.quantiles"], other["stats.quantiles"])
    difference = (first["stats.quantiles"] - other["stats.quantiles"]).abs().max()
    assert 0 < float(difference) < 1e-3  # noise of std 1e-5 moves the quantiles by that order


def test_the_noise_breaks_ties_and_leaves_the_rows_themselves_alone():
    table = make_table()
    rows = table_split(OPTIONS, 0, table)["train"]
    before = table.features.copy()
    transform = fit_quantiles(table, rows, seed=0)
    assert np.array_equal(table.features, before)
    ties = transform.quantiles_[:, 1]  # a column of 0, 1, 2: the noise spreads its quantiles
    assert np.all(np.diff(ties) > 0)


def test_encoded_features_are_about_standard_normal_and_the_checkpoint_gives_them_back(tmp_path):
    table = make_table(rows=2000)
    rows = table_split(OPTIONS, 0, table)["train"]
    stats = fit_preprocessing(OPTIONS, 0, table, rows)
    x_cont, x_cat = encode(table.features[rows], table, stats)
    assert x_cont.dtype == torch.float32 and x_cont.shape == (len(rows), 2)
    assert abs(float(x_cont[:, 0].median())) < 0.05 and abs(float(x_cont[:, 0].std()) - 1) < 0.1
    fitted = fit_quantiles(table, rows, seed=0)
    expected = fitted.transform(table.features[:, [0, 1]])
    save_file(stats, str(tmp_path / "stats.safetensors"))  # as the checkpoint keeps them
    restored = quantile_transform(load_file(str(tmp_path / "stats.safetensors")))
    assert np.array_equal(restored.transform(table.features[:, [0, 1]]), expected)
    assert x_cat.tolist() == table.features[rows][:, [2]].astype(int).tolist()


def test_standard_preprocessing_is_the_named_alternative():
    table = make_table()
    options = resolve_model("ft-transformer", preprocessing="standard").options
    rows = table_split(options, 0, table)["train"]
    stats = fit_preprocessing(options, 0, table, rows)
    x = torch.as_tensor(table.features[np.ix_(rows, [0, 1])], dtype=torch.float32)
    assert torch.allclose(stats["stats.feature_mean"], x.mean(0))
    assert "stats.quantiles" not in stats


def test_the_training_record_names_the_preprocessing():
    table = make_table(rows=60)
    for kind in ("quantile", "standard"):
        spec = resolve_model("ft-transformer", n_blocks=2, d_block=8, max_epochs=1,
                             preprocessing=kind)
        record = ft_training.train(spec, table)[2]
        named = record["hyperparameters"]["preprocessing"]
        assert named["kind"] == kind and named["fitted_on"] == "train rows"
        if kind == "quantile":
            assert (named["n_quantiles"], named["noise_std"], named["output_distribution"]) == \
                (10, 1e-5, "normal")
        assert record["hyperparameters"]["batch_size"] == 256

"""`storage.query`: a sweep store read lazily as a DataTree and reduced to holding rates."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import xarray as xr
import zarr

from storage.errors import InputError
from storage.query.counts import group_counts, rates
from storage.query.results import (
    attaining_special,
    cell_counts,
    cells,
    holding_rates,
    holds_by_characterisation,
    open_results,
)
from tests.store_fixtures import FixtureModel, hand_store, write_store


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return hand_store(tmp_path_factory.mktemp("query") / "sweep.zarr")


@pytest.fixture(scope="module")
def tree(store):
    return open_results(store)


def wilson_by_quadratic(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson bounds as the roots p of (k/n - p)^2 = z^2 p (1 - p) / n."""
    phat = k / n
    roots = np.roots([1 + z**2 / n, -(2 * phat + z**2 / n), phat**2])
    return float(min(roots)), float(max(roots))


def row(table, **keys):
    selected = table
    for key, value in keys.items():
        selected = selected[selected[key] == value]
    assert len(selected) == 1, f"expected one row for {keys}, got {len(selected)}"
    return selected.iloc[0]


def test_tree_has_one_node_per_model_and_a_baseline(tree):
    assert set(tree.children) == {"alpha", "beta", "baseline"}
    alpha = tree["alpha"].to_dataset()
    assert dict(alpha.sizes) == {"input": 5, "layer": 3, "head": 1, "token_set": 2}
    for var in ("kappa", "kappa_factor", "bound", "margin", "holds", "holds_by_characterisation",
                "pair_i", "pair_j", "attaining_special", "status", "n_kept", "n_tokens",
                "rollout_kappa", "rollout_bound"):
        assert var in alpha.data_vars, var
    assert alpha["kappa"].dims == ("input", "layer", "head", "token_set")
    assert list(alpha["token_set"].values) == ["all", "content"]
    assert list(alpha["head"].values) == ["mean"]  # head-averaged: one head
    assert list(alpha["input"].values[:2]) == ["img-000", "img-001"]
    np.testing.assert_allclose(alpha["relative_depth"].values, [0.0, 0.5, 1.0])
    assert tree["beta"]["relative_depth"].values.tolist() == [0.0]  # one layer: depth 0
    assert alpha.attrs["n_layers"] == 3


def test_open_is_lazy_and_never_touches_attention(store, tmp_path):
    copy = tmp_path / "copy.zarr"
    shutil.copytree(store, copy)
    for path in (copy / "alpha" / "attention").rglob("*"):  # metadata and every chunk
        if path.is_file():
            path.write_bytes(b"corrupt")
    tree = open_results(copy)
    assert tree["alpha"]["margin"].chunks is not None  # dask-backed
    assert "attention" not in tree["alpha"].data_vars
    assert row(holding_rates(tree, by=("model",)), model="alpha")["holding"] == 16


def test_per_layer_rates_match_hand_counts(tree):
    rates = holding_rates(tree)
    expected = {
        ("alpha", 0, "all"): (4, 4), ("alpha", 1, "all"): (2, 4), ("alpha", 2, "all"): (1, 4),
        ("alpha", 0, "content"): (3, 4), ("alpha", 1, "content"): (4, 4),
        ("alpha", 2, "content"): (2, 3), ("beta", 0, "all"): (1, 2),
    }
    assert len(rates) == len(expected)
    for (model, layer, token_set), (holding, tested) in expected.items():
        got = row(rates, model=model, layer=layer, token_set=token_set)
        assert (got["holding"], got["cells"]) == (holding, tested)
        assert got["inputs"] == tested  # one cell per input in a (model, layer, token set)
        assert got["rate"] == pytest.approx(holding / tested)
        low, high = wilson_by_quadratic(holding, tested)
        assert (got["ci_low"], got["ci_high"]) == (pytest.approx(low), pytest.approx(high))
    assert row(rates, model="alpha", layer=2, token_set="content")["relative_depth"] == 1.0


def test_partial_store_counts_only_finished_cells(tree):
    rates = holding_rates(tree)
    content_last = row(rates, model="alpha", layer=2, token_set="content")
    assert (content_last["pending"], content_last["skipped"]) == (1, 1)
    assert row(rates, model="beta", layer=0, token_set="all")["pending"] == 0


def test_disagreements_between_definition_and_characterisation_are_counted(tree):
    rates = holding_rates(tree)
    assert row(rates, model="alpha", layer=1, token_set="all")["disagreements"] == 1
    assert rates["disagreements"].sum() == 1


def test_coarser_groupings_sum_counts_before_dividing(tree):
    by_set = holding_rates(tree, by=("token_set",))
    assert row(by_set, token_set="all")[["holding", "cells"]].tolist() == [8, 14]
    assert row(by_set, token_set="content")[["holding", "cells"]].tolist() == [9, 11]
    overall = holding_rates(tree, by=())
    assert len(overall) == 1
    assert overall.iloc[0]["holding"] == 17 and overall.iloc[0]["cells"] == 25
    assert overall.iloc[0]["rate"] == pytest.approx(17 / 25)


def test_inputs_count_distinct_inputs_and_cells_count_cells(tree):
    """`inputs` is how many inputs have a tested cell in the group (alpha: inputs 0-3, input 4
    pending; beta: 2), `cells` how many (input, layer) cells were tested."""
    by_model = holding_rates(tree, by=("model", "token_set"))
    assert row(by_model, model="alpha", token_set="all")[["inputs", "cells"]].tolist() == [4, 12]
    assert row(by_model, model="alpha", token_set="content")[["inputs", "cells"]].tolist() == [
        4, 11]
    assert row(by_model, model="beta", token_set="all")[["inputs", "cells"]].tolist() == [2, 2]
    overall = holding_rates(tree, by=())
    assert overall.iloc[0][["inputs", "cells"]].tolist() == [4 + 2, 25]  # per model, apart


def test_rates_group_by_input(tree):
    """Grouping by input: per input, its cells over layers (and token sets unless grouped)."""
    per_input = holding_rates(tree, by=("model", "input", "token_set"))
    first = row(per_input, model="alpha", input="img-001", token_set="content")
    assert first[["inputs", "cells", "holding", "skipped"]].tolist() == [1, 2, 2, 1]
    pending = row(per_input, model="alpha", input="img-004", token_set="all")
    assert pending[["inputs", "cells", "pending"]].tolist() == [0, 0, 3]
    assert np.isnan(pending["rate"])
    third = row(per_input, model="alpha", input="img-003", token_set="all")
    assert third[["holding", "cells", "disagreements"]].tolist() == [2, 3, 1]
    assert third["rate"] == pytest.approx(2 / 3)
    summed = per_input.groupby(["model", "token_set"], sort=False)[["holding", "cells"]].sum()
    by_model = holding_rates(tree, by=("model", "token_set")).set_index(["model", "token_set"])
    assert summed.to_dict() == by_model[["holding", "cells"]].to_dict()
    loose = holding_rates(tree, by=("input", "layer"), tol=1e-6)
    assert row(loose, input="img-003", layer=1)["holding"] == 2  # 5e-7 holds at 1e-6


def test_counts_are_summed_as_xarray_and_divided_once(tree):
    cells = cell_counts(tree)  # one cell per (model, layer, token_set), counts over inputs
    assert isinstance(cells, xr.Dataset) and cells.sizes["cell"] == 7
    assert cells["cells"].dtype == np.int64
    groups = group_counts(cells[["holding", "cells"]], ["token_set"])  # first: all, content
    assert groups["token_set"].values.tolist() == ["all", "content"]
    assert groups["holding"].values.tolist() == [8, 9]
    assert groups["cells"].values.tolist() == [14, 11]
    divided = rates(groups["holding"], groups["cells"])
    assert isinstance(divided, xr.Dataset) and divided["rate"].dims == ("group",)
    np.testing.assert_allclose(divided["rate"].values, [8 / 14, 9 / 11])
    np.testing.assert_allclose(divided["ci_low"].values[0], wilson_by_quadratic(8, 14)[0])
    empty = rates(xr.DataArray([0]), xr.DataArray([0]))
    assert np.isnan(empty["rate"].item())
    assert (empty["ci_low"].item(), empty["ci_high"].item()) == (0, 1)


def test_depth_bins_group_layers_by_relative_depth(tree):
    depth = holding_rates(tree, by=("model", "token_set", "depth"), depth_bins=3)
    last = row(depth, model="alpha", token_set="all", depth=2)
    assert (last["holding"], last["cells"]) == (1, 4)
    assert (last["depth_low"], last["depth_high"]) == (pytest.approx(2 / 3), 1.0)
    assert row(depth, model="beta", token_set="all", depth=0)["cells"] == 2
    halves = holding_rates(tree, by=("depth",), depth_bins=2)
    # alpha layers 0 (depth 0) and 1 (depth 0.5 -> upper half) and 2; beta layer 0
    assert row(halves, depth=0)[["holding", "cells"]].tolist() == [4 + 3 + 1, 4 + 4 + 2]
    assert row(halves, depth=1)[["holding", "cells"]].tolist() == [2 + 4 + 1 + 2, 4 + 4 + 4 + 3]
    assert row(halves, depth=1)["inputs"] == 4  # alpha's inputs 0-3


def test_tolerance_is_reapplied_from_stored_margins(tree):
    loose = holding_rates(tree, tol=1e-6)
    assert row(loose, model="alpha", layer=1, token_set="all")["holding"] == 3  # 5e-7 now holds
    assert row(loose, model="alpha", layer=2, token_set="all")["holding"] == 1
    strict = holding_rates(tree, tol=0.0)
    assert row(strict, model="alpha", layer=1, token_set="all")["holding"] == 2


def test_tolerance_reapplies_the_characterisation_and_recounts_disagreements(tree):
    # (input 3, layer 1, all): margin 5e-7, slack 0 -> a disagreement up to tol 5e-7 only
    assert holding_rates(tree, tol=0.0)["disagreements"].sum() == 1
    assert holding_rates(tree, tol=1e-6)["disagreements"].sum() == 0
    alpha = tree["alpha"].to_dataset()
    stored = holds_by_characterisation(alpha)
    assert bool(stored.sel(input="img-003", layer=1, token_set="all"))
    again = holds_by_characterisation(alpha, 1e-12) == stored  # at the sweep's own tol
    assert bool(again.where(alpha["status"] == 0, True).all())


def test_tolerance_reapplies_attaining_special_from_content_gaps(tree):
    every = tree["alpha"].to_dataset().sel(token_set="all", layer=2, head="mean")
    assert attaining_special(every).values[:4].tolist() == [False, True, True, False]
    assert attaining_special(every, 1e-7).values[:4].tolist() == [False, True, True, False]
    assert attaining_special(every, 1e-6).values[:4].tolist() == [False, True, False, False]


@pytest.mark.parametrize("loose", [1.1e-6, 1e-3, 0.5])
def test_tolerance_above_the_window_is_refused(tree, loose):
    with pytest.raises(InputError, match="window") as info:
        holding_rates(tree, tol=loose)
    assert "\n" not in str(info.value)


def test_baseline_node_sums_finished_chunks(tree):
    baseline = tree["baseline"].to_dataset()
    assert baseline["null"].values.tolist() == ["uniform"]  # a store from before named nulls
    baseline = baseline.sel(null="uniform")
    assert baseline["n"].values.tolist() == [2, 3]
    assert baseline["holding"].values.tolist() == [9, 2]
    assert baseline["trials"].values.tolist() == [20, 10]
    assert baseline["chunks_done"].values.tolist() == [2, 1]
    assert baseline["disagreements"].values.tolist() == [1, 0]
    np.testing.assert_allclose(baseline["rate"].values, [0.45, 0.2])
    low, high = wilson_by_quadratic(9, 20)
    assert baseline["ci_low"].values[0] == pytest.approx(low)
    assert baseline["ci_high"].values[0] == pytest.approx(high)


@pytest.mark.parametrize("bad", [-1e-3, float("nan"), float("inf")])
def test_bad_tolerance_is_an_input_error(tree, bad):
    with pytest.raises(InputError, match="tolerance"):
        holding_rates(tree, tol=bad)


def test_unknown_grouping_is_an_input_error(tree):
    with pytest.raises(InputError, match="'inputs'.*choose from") as error:
        holding_rates(tree, by=("model", "inputs"))
    assert "\n" not in str(error.value)


def test_tidy_view_gives_every_cell_across_models_lazily(store, tree):
    """`cells(store)`: one `cell` dim over both models, keys as coordinates, verdicts lazy and
    equal to each model's own (input, layer, head, token_set) array."""
    ds = cells(store)
    assert ds.sizes["cell"] == 5 * 3 * 1 * 2 + 2 * 1 * 1 * 1
    assert ds["margin"].chunks is not None  # dask: nothing read yet
    for key in ("model", "input", "layer", "relative_depth", "head", "token_set"):
        assert ds[key].dims == ("cell",), key
    alpha = ds.isel(cell=np.flatnonzero(ds["model"].values == "alpha"))
    own = tree["alpha"].to_dataset()
    for var in ("margin", "holds", "status", "n_kept", "kappa"):
        np.testing.assert_array_equal(alpha[var].values, own[var].values.reshape(-1), err_msg=var)
    at = alpha.isel(cell=int(np.flatnonzero(
        (alpha["input"].values == "img-001") & (alpha["layer"].values == 2)
        & (alpha["token_set"].values == "content"))[0]))
    assert int(at["status"]) == 1 and float(at["relative_depth"]) == 1.0
    assert int(at["n_tokens"]) == 5
    beta = ds.isel(cell=np.flatnonzero(ds["model"].values == "beta"))
    assert beta["margin"].values.tolist() == [0.0, 0.2]
    assert beta["input"].values.tolist() == ["img-000", "img-001"]
    tested = ds.where(ds["status"] == 0)  # skipped and pending cells dropped
    rate = tested["holds"].where(tested["status"] == 0).groupby(["model", "token_set"]).mean()
    expected = holding_rates(tree, by=("model", "token_set"))
    for r in expected.to_dict("records"):
        got = float(rate.sel(model=r["model"], token_set=r["token_set"]))
        assert got == pytest.approx(r["rate"]), r
    assert cells(store, models=["beta"]).sizes["cell"] == 2
    with pytest.raises(InputError, match="no model 'gamma'"):
        cells(store, models=["gamma"])


def test_missing_path_is_a_one_line_input_error(tmp_path):
    with pytest.raises(InputError, match="no sweep store") as error:
        open_results(tmp_path / "absent.zarr")
    assert "\n" not in str(error.value)


def test_directory_that_is_not_zarr_is_an_input_error(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(InputError, match="not a") as error:
        open_results(tmp_path)
    assert "\n" not in str(error.value)


def test_zarr_store_of_another_kind_is_an_input_error(tmp_path):
    zarr.open_group(tmp_path / "other.zarr", mode="w", zarr_format=3).attrs["format"] = "other/1"
    with pytest.raises(InputError, match="not a dobrushin-sweep store"):
        open_results(tmp_path / "other.zarr")


def test_results_not_matching_the_model_attrs_is_an_input_error(tmp_path):
    status = np.zeros((2, 2, 1), dtype=np.int8)
    path = write_store(
        tmp_path / "s.zarr", {"m": FixtureModel(np.zeros(status.shape), status, ("all",))}
    )
    zarr.open_group(path / "m", mode="r+").attrs["n_layers"] = 3
    with pytest.raises(InputError, match=r"m/results/kappa has shape \(2, 2, 1, 1\), expected"):
        open_results(path)


def test_xarrays_own_reader_opens_the_store_to_the_same_verdicts(store, tree):
    """The layout stays readable by `xr.open_datatree(engine="zarr")`: every result variable,
    value for value, as `open_results` gives it (which adds the coordinates and the one-line
    checks)."""
    import warnings

    import xarray as xr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the `.sweep` bookkeeping folder is not a Zarr node
        raw = xr.open_datatree(store, engine="zarr", consolidated=False, chunks={})
    for name in tree.attrs["models"]:
        for var in ("kappa", "margin", "holds", "slack", "status"):
            np.testing.assert_array_equal(raw[f"{name}/results"][var].values,
                                          tree[name][var].values, err_msg=f"{name}/{var}")


def test_group_counts_equal_xarray_groupby_in_order_of_first_appearance():
    rng = np.random.default_rng(3)
    size = 500
    keys = {"model": rng.choice(np.array(["b", "a@seed0@epoch5", "a@seed0", "c"], dtype=object),
                                size),
            "layer": rng.integers(0, 4, size), "token_set": rng.choice(
                np.array(["content", "all"], dtype=object), size)}
    depth = keys["layer"] / 4.0  # one relative depth per layer: constant within its groups
    counts = xr.Dataset({"holding": ("cell", rng.integers(0, 50, size)),
                         "cells": ("cell", rng.integers(50, 99, size))},
                        coords={**{k: ("cell", v) for k, v in keys.items()},
                                "relative_depth": ("cell", depth)})
    by = ["model", "layer", "token_set"]
    got = group_counts(counts, by, keep=["relative_depth"])
    oracle = counts[["holding", "cells"]].groupby(by).sum().stack(group=by)
    seen = list(dict.fromkeys(zip(*(keys[k].tolist() for k in by), strict=True)))
    assert list(zip(*(got[k].values.tolist() for k in by), strict=True)) == seen
    for i, group in enumerate(seen):
        expected = oracle.sel(group=group)
        assert got["holding"].values[i] == expected["holding"] and got["holding"].dtype == np.int64
        assert got["cells"].values[i] == expected["cells"]
        assert got["relative_depth"].values[i] == group[1] / 4.0


def test_a_report_of_the_store_in_memory_equals_the_lazy_one(tree):
    from storage.query.results import in_memory
    from sweep.report.tables import build_report, render_json

    loaded = in_memory(tree)
    assert all(not hasattr(v.data, "dask") for node in loaded.subtree
               for v in node.to_dataset().data_vars.values())
    assert list(loaded.children) == list(tree.children) and loaded.attrs == tree.attrs
    assert render_json(build_report(loaded, store="s", ci="bootstrap")) == \
        render_json(build_report(tree, store="s", ci="bootstrap"))
    lazy = in_memory(tree, budget=0)  # nothing fits: the results stay lazy
    assert hasattr(lazy["alpha"]["holds"].data, "dask")


def test_cells_keep_the_stores_model_order_when_grouped(store):
    ds = cells(store)
    order = ds["model"].to_index().categories.tolist()
    assert order == list(open_results(store).children)[:len(order)]
    grouped = ds["holds"].where(ds["status"] == 0).groupby("model").mean()
    assert grouped["model"].values.tolist() == order

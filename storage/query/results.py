"""Read a sweep store as an `xarray.DataTree` and reduce its verdicts to holding rates.

Opening is lazy: result arrays become dask arrays over their Zarr chunks, and the attention
arrays are never opened. Rates are reductions of mergeable counts (sums over inputs, divided
once at the end), so partial and resumed sweeps report exactly what is done. The counting is
xarray's (`cell_counts` here, `group_counts` and `rates` in `storage.query.counts`); `holding_rates`
turns the result into a pandas table only at the end, for the report to render.

Why not `xr.open_datatree(store, engine="zarr")` alone: it does open a sweep store, to the same
values (`tests/test_query.py` keeps it so), but it lists the root (warning on the `.sweep`
bookkeeping folder), puts the verdicts one level down (`/<model>/results`), has no coordinates
(input ids, token-set names, relative depth come from the model's attrs), and a store whose
arrays do not match `storage.layout` fails deep inside xarray. `open_results` reads the writer's
list of models, checks every array's dims and shape against the layout (one-line InputError
naming the array), and builds the coordinates; it stays a thin layer over zarr + dask.
"""

from __future__ import annotations

from collections.abc import Sequence

import dask
import dask.array as da
import numpy as np
import pandas as pd
import xarray as xr
import zarr

from storage.errors import InputError
from storage.layout import (
    BASELINE_GROUP,
    FORMAT,
    LEGACY_RESULT_DIMS,
    MEAN_HEAD,
    MODEL_VARS,
    NULLS_GROUP,
    OPTIONAL_RESULT_VARS,
    RESULT_VARS,
    RESULTS_GROUP,
    SLACK_WINDOW,
    ResultStatus,
    Var,
)
from storage.location import Location, StoreLike, locate
from storage.query.counts import group_counts, rates
from storage.query.nulls import baseline_dataset, matched_nulls_dataset
from storage.query.statistics import wilson_interval

GROUP_KEYS = ("model", "layer", "head", "token_set", "depth")
COUNT_COLUMNS = ("inputs", "holding", "pending", "skipped", "disagreements")


def open_results(store: StoreLike, storage_options: dict | None = None) -> xr.DataTree:
    """Open a sweep store lazily: one node per model (input, layer, head, token_set), below it
    a `nulls` node (null, token_set) of its size-matched nulls, and a baseline node (null, n).
    `head` is ["mean"] for a head-averaged model (and for a model group written before the head
    dimension), ["0", ..., "H-1"] for one that kept every head.

    `store`: a path, a URL (`s3://…`, with `storage_options`: `storage.location`) or a
    StoreRef. Reads results lazily (dask arrays), never attention.

    Raises InputError (one line) when `store` is missing or is not a dobrushin-sweep store.
    """
    location = locate(store, storage_options)
    path = location.ref.url
    root = _open_root(location)
    nodes: dict[str, xr.Dataset] = {"/": xr.Dataset(attrs=dict(root.attrs))}
    for name in root.attrs.get("models", []):  # the writer's list: no directory listing
        group = root.get(name)
        if not isinstance(group, zarr.Group):
            raise InputError(f"{path}: root attr models lists {name!r} but there is no such group")
        nodes[f"/{name}"] = _model_dataset(name, group, path)
        nulls = matched_nulls_dataset(group, path, name)
        if nulls is not None:
            nodes[f"/{name}/{NULLS_GROUP}"] = nulls
    baseline = root.get(BASELINE_GROUP)
    if isinstance(baseline, zarr.Group):
        nodes[f"/{BASELINE_GROUP}"] = baseline_dataset(baseline, path)
    return xr.DataTree.from_dict(nodes)


def model_names(tree: xr.DataTree) -> list[str]:
    """Names of the model nodes of a tree from `open_results`, in the store's `models` order."""
    return [name for name in tree.children if name != BASELINE_GROUP]


def holding_rates(
    tree: xr.DataTree,
    by: Sequence[str] = ("model", "layer", "token_set"),
    tol: float | None = None,
    depth_bins: int = 3,
) -> pd.DataFrame:
    """Tidy table of holding rates: one row per group of `by`, counts summed before dividing.

    Columns: the `by` keys (plus `relative_depth` when grouping by model and layer, and
    `depth_low`/`depth_high` when grouping by `depth`, the bin index of relative depth in
    `depth_bins` equal bins), then `inputs` (cells with status OK), `holding`, `rate`, `ci_low`,
    `ci_high` (95% Wilson), `pending` (not computed yet), `skipped` (empty row / too small) and
    `disagreements` (OK cells whose stored verdict and characterisation differ; expected 0).
    `tol` (<= SLACK_WINDOW) re-applies a tolerance to every stored verdict: holds := margin <=
    tol, holds_by_characterisation := slack <= tol (so disagreements are recounted too).
    Counts are of (input, head) cells: inputs for a head-averaged model, input-head pairs for a
    model that kept every head; `by` may include `head`.
    """
    return rates_from_cells(cell_counts(tree, tol), by, depth_bins)


def rates_from_cells(
    cells: xr.Dataset, by: Sequence[str] = ("model", "layer", "token_set"), depth_bins: int = 3
) -> pd.DataFrame:
    """`holding_rates` from `cell_counts`: compute the counts once, group them many ways.

    The counts are summed per group by xarray (`group_counts`) and divided once (`rates`); the
    result becomes a table only here, for the report to render.
    """
    by = list(dict.fromkeys(by))
    unknown = [key for key in by if key not in GROUP_KEYS]
    if unknown:
        raise InputError(f"cannot group holding rates by {unknown}: choose from {list(GROUP_KEYS)}")
    if depth_bins < 1:
        raise InputError(f"depth_bins must be a positive integer, got {depth_bins}")
    cells = cells.assign_coords(
        depth=("cell", depth_bin(cells["relative_depth"].values, depth_bins)))
    layers = "model" in by and "layer" in by  # one relative depth per group: the layer's own
    groups = group_counts(cells[list(COUNT_COLUMNS)], by, keep=["relative_depth"] if layers else [])
    columns = {key: groups[key].values for key in by}
    columns.update({name: groups[name].values for name in COUNT_COLUMNS})
    if layers:
        columns["relative_depth"] = groups["relative_depth"].values
    if "depth" in by:
        columns["depth_low"] = groups["depth"].values / depth_bins
        columns["depth_high"] = (groups["depth"].values + 1) / depth_bins
    columns.update({name: values.values for name, values in rates(
        groups["holding"], groups["inputs"]).items()})
    return pd.DataFrame(columns)


def cell_counts(tree: xr.DataTree, tol: float | None = None) -> xr.Dataset:
    """Counts per (model, layer, head, token_set) along one `cell` dim (coordinates model,
    layer, head, token_set, relative_depth): OK inputs, holding among them, pending, skipped,
    disagreements, each summed over the inputs by xarray."""
    tol = check_tol(tol)
    names = model_names(tree)
    computed = dask.compute(*[_counts(tree[name].to_dataset(), tol) for name in names])
    cells = [
        counts.stack(cell=("layer", "head", "token_set")).reset_index("cell")
        .assign_coords(model=("cell", np.full(
            counts["layer"].size * counts["head"].size * counts["token_set"].size, name,
            dtype=object)))
        for name, counts in zip(names, computed, strict=True)
    ]
    if not cells:
        empty = {key: ("cell", np.array([], dtype=dtype)) for key, dtype in (
            ("model", object), ("layer", np.int64), ("head", object), ("token_set", object),
            ("relative_depth", np.float64))}
        return xr.Dataset({name: ("cell", np.array([], dtype=np.int64))
                           for name in COUNT_COLUMNS}, coords=empty)
    cells = xr.concat(cells, dim="cell")
    return cells.assign({name: cells[name].astype(np.int64) for name in COUNT_COLUMNS})


def holds(ds: xr.Dataset, tol: float | None = None) -> xr.DataArray:
    """Verdict per cell: the stored `holds`, or `margin <= tol` when a tolerance is given."""
    return ds["holds"] if tol is None else ds["margin"] <= tol


def holds_by_characterisation(ds: xr.Dataset, tol: float | None = None) -> xr.DataArray:
    """The characterisation per cell: stored, or `slack <= tol` when a tolerance is given."""
    return ds["holds_by_characterisation"] if tol is None else ds["slack"] <= tol


def attaining_special(ds: xr.Dataset, tol: float | None = None) -> xr.DataArray:
    """Whether every attaining pair involves a special token: stored, or `content_gap > tol`
    when a tolerance is given (pairs within tol of kappa attain)."""
    return ds["attaining_special"] if tol is None else ds["content_gap"] > tol


def ok(ds: xr.Dataset) -> xr.DataArray:
    """Cells whose test has run and produced a verdict (status OK)."""
    return ds["status"] == ResultStatus.OK


def with_rates(table: pd.DataFrame, k: str, n: str, prefix: str = "") -> pd.DataFrame:
    """Add `rate`, `ci_low`, `ci_high` (95% Wilson) for `table[k]` out of `table[n]`.

    With no trials the rate is NaN and the interval (0, 1), as `workers.nulls.baseline` defines it.
    """
    table = table.copy()
    counts, totals = table[k].to_numpy(np.int64), table[n].to_numpy(np.int64)
    with np.errstate(divide="ignore", invalid="ignore"):
        table[f"{prefix}rate"] = counts / totals
    bounds = [wilson_interval(int(a), int(b)) for a, b in zip(counts, totals, strict=True)]
    low, high = np.array(bounds, dtype=np.float64).reshape(-1, 2).T
    table[f"{prefix}ci_low"], table[f"{prefix}ci_high"] = low, high
    return table


def depth_bin(relative_depth: np.ndarray, bins: int) -> np.ndarray:
    """Index of the equal-width relative-depth bin (0 = first, bins - 1 holds depth 1)."""
    index = np.floor(np.asarray(relative_depth, dtype=np.float64) * bins + 1e-9)
    return np.clip(index, 0, bins - 1).astype(np.int64)


def check_tol(tol: float | None) -> float | None:
    """`tol` as a float, or InputError unless it is None or a finite number in [0, W]: the
    stored slack and content_gap decide the verdicts exactly only up to W = SLACK_WINDOW."""
    if tol is None:
        return None
    value = float(tol)
    if not np.isfinite(value) or value < 0:
        raise InputError(f"tolerance must be a non-negative finite number, got {tol!r}")
    if value > SLACK_WINDOW:
        raise InputError(
            f"tolerance {value:g} is above {SLACK_WINDOW:g}, the window within which the stored "
            "slack and content_gap are exact: re-run the test stage with that tol instead"
        )
    return value


def _counts(ds: xr.Dataset, tol: float | None) -> xr.Dataset:
    status = ds["status"]
    done = ok(ds)
    return xr.Dataset(
        {
            "inputs": done.sum("input"),
            "holding": (done & holds(ds, tol)).sum("input"),
            "pending": (status == ResultStatus.NOT_COMPUTED).sum("input"),
            "skipped": (~done & (status != ResultStatus.NOT_COMPUTED)).sum("input"),
            "disagreements": (done & (holds(ds, tol) != holds_by_characterisation(ds, tol)))
            .sum("input"),
        }
    )


def _open_root(location: Location) -> zarr.Group:
    path = location.ref.url
    if location.read("zarr.json") is None:
        if location.any_key(""):
            raise InputError(f"{path} is not a Zarr v3 sweep store (it holds no zarr.json)")
        raise InputError(f"no sweep store at {path}: check the path or run `sweep run` first")
    try:
        root = zarr.open_group(location.zarr_store(read_only=True), mode="r",
                               use_consolidated=False)
    except (FileNotFoundError, ValueError, TypeError, KeyError) as error:
        raise InputError(f"{path} is not a Zarr v3 sweep store ({error})") from error
    found = root.attrs.get("format")
    if found != FORMAT:
        raise InputError(
            f"{path} is not a dobrushin-sweep store: root attr format is {found!r}, "
            f"expected {FORMAT!r}"
        )
    return root


def _array(group: zarr.Group, name: str, spec: Var, where: str) -> zarr.Array:
    array = group.get(name)
    if not isinstance(array, zarr.Array):
        raise InputError(f"{where}/{name} is missing: the store is incomplete or not a sweep store")
    dims = tuple(array.metadata.dimension_names or ())
    if dims != spec.dims:
        raise InputError(f"{where}/{name} has dimension_names {dims}, expected {spec.dims}")
    return array


def _model_dataset(name: str, group: zarr.Group, path: str) -> xr.Dataset:
    where = f"{path}/{name}"
    attrs = dict(group.attrs)
    missing = [key for key in ("n_layers", "token_sets") if key not in attrs]
    if missing:
        raise InputError(f"{where} lacks the model attrs {missing}: not a sweep model group")
    results = group.get(RESULTS_GROUP)
    if not isinstance(results, zarr.Group):
        raise InputError(f"{where}/{RESULTS_GROUP} is missing: the store is incomplete")
    ids = _array(group, "input_id", MODEL_VARS["input_id"], where)[...]
    input_id = np.array([str(i) for i in ids.tolist()], dtype=object)
    n_layers, token_sets = int(attrs["n_layers"]), [str(t) for t in attrs["token_sets"]]
    legacy = "head" not in group  # written before the head dimension: one head-averaged map
    if legacy:
        head = np.array([MEAN_HEAD], dtype=object)
    else:
        labels = _array(group, "head", MODEL_VARS["head"], where)[...]
        head = np.array([str(h) for h in labels.tolist()], dtype=object)
    expected = (input_id.shape[0], n_layers, len(head), len(token_sets))
    data_vars = {}
    for var, spec in RESULT_VARS.items():
        if var in OPTIONAL_RESULT_VARS and var not in results:
            continue  # written before the variable existed
        stored = Var(LEGACY_RESULT_DIMS, spec.dtype, spec.fill, spec.doc) if legacy else spec
        array = _array(results, var, stored, f"{where}/{RESULTS_GROUP}")
        values = da.from_zarr(array)
        if legacy:
            values = values[:, :, None, :]  # (input, layer, head, token_set): the mean head
        if values.shape != expected:
            raise InputError(
                f"{where}/{RESULTS_GROUP}/{var} has shape {array.shape}, expected {expected} "
                "(inputs, n_layers, heads, token_sets) from input_id, head and the model attrs"
            )
        data_vars[var] = (spec.dims, values)
    n_tokens = _array(group, "n_tokens", MODEL_VARS["n_tokens"], where)
    data_vars["n_tokens"] = (MODEL_VARS["n_tokens"].dims, da.from_zarr(n_tokens))
    layer = np.arange(n_layers)
    relative_depth = layer / (n_layers - 1) if n_layers > 1 else np.zeros(n_layers)
    coords = {
        "input": input_id,
        "layer": layer,
        "relative_depth": ("layer", relative_depth),
        "head": head,
        "token_set": token_sets,
    }
    return xr.Dataset(data_vars, coords=coords, attrs=attrs)

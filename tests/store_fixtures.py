"""Hand-built sweep stores following `storage.layout` exactly, for tests of the readers.

Tests choose verdicts (margins and statuses) by hand; everything else in a result cell is derived
consistently from them: bound = (1 + kappa)/2, kappa_factor = bound - margin, holds = margin <= tol,
slack = margin where the characterisation agrees with the definition (else 0 or X), content_gap =
+inf where attaining_special else 0, unless given.
Cells whose status is not OK keep the layout's fill values, as an unfinished sweep leaves them.
Models are head-averaged: their (input, layer, token_set) verdicts are stored with one `mean`
head.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import zarr

from storage.layout import (
    BASELINE_GROUP,
    BASELINE_VARS,
    FORMAT,
    MEAN_HEAD,
    MODEL_VARS,
    RESULT_VARS,
    RESULTS_GROUP,
    ResultStatus,
)
from workers.exact.token_kinds import TokenKind


@dataclass(frozen=True)
class FixtureModel:
    """Verdicts of one model; arrays are (input, layer, token_set) unless noted."""

    margin: np.ndarray
    status: np.ndarray
    token_sets: tuple[str, ...] = ("all", "content")
    tol: float = 1e-12
    kappa: float = 0.5
    attaining_special: np.ndarray | None = None
    attaining_kind: np.ndarray | None = None  # AttainingKind per cell; defaults to the fill
    holds_by_characterisation: np.ndarray | None = None  # defaults to margin <= tol
    slack: np.ndarray | None = None  # defaults to agree with holds_by_characterisation at tol
    content_gap: np.ndarray | None = None  # defaults to +inf where attaining_special, else 0
    rollout_kappa: np.ndarray | None = None
    rollout_bound: np.ndarray | None = None
    radius: np.ndarray | None = None  # the decision radius per cell; defaults to the fill (NaN)
    n_tokens: np.ndarray | None = None  # (input,); defaults to t_max for every input
    t_max: int = 5


@dataclass(frozen=True)
class FixtureBaseline:
    """Baseline counts per (size, chunk) — the layout from before named nulls — or, when `null`
    is given, per (null, size, chunk); holding -1 marks a chunk not done."""

    n: np.ndarray  # (size,)
    holding: np.ndarray  # (size, chunk) or (null, size, chunk)
    trials: np.ndarray  # as holding
    disagreements: np.ndarray  # as holding; -1 where the chunk is not done
    null: np.ndarray | None = None  # (null,) names; None: the (size, chunk) layout


def write_store(
    path: Path,
    models: dict[str, FixtureModel],
    baseline: FixtureBaseline | None = None,
    store_format: str = FORMAT,
) -> Path:
    """Write a sweep store at `path` holding `models` and `baseline`; return the path."""
    root = zarr.open_group(path, mode="w", zarr_format=3)
    root.attrs.update(
        {"format": store_format, "fingerprint": {}, "config": {}, "models": list(models)}
    )
    for name, model in models.items():
        _write_model(root.create_group(name), model)
    if baseline is not None:
        group = root.create_group(BASELINE_GROUP)
        for var, spec in BASELINE_VARS.items():
            values = getattr(baseline, var)
            if values is not None:
                _array(group, var, spec, values, spec.dims[-np.ndim(values):])
    return path


def _array(group: zarr.Group, name: str, spec, values: np.ndarray,
           dims: tuple[str, ...] | None = None) -> zarr.Array:
    values = np.asarray(values)
    chunks = (2,) + values.shape[1:] if values.ndim else ()
    array = group.create_array(
        name,
        shape=values.shape,
        dtype=str if spec.dtype == "str" else spec.dtype,
        fill_value=spec.fill,
        chunks=chunks,
        dimension_names=spec.dims if dims is None else dims,
    )
    array[...] = values
    return array


def _write_model(group: zarr.Group, model: FixtureModel) -> None:
    model = _with_head_axis(model)  # head-averaged: one `mean` head
    status = np.asarray(model.status, dtype=np.int8)
    n_inputs, n_layers, n_heads, n_sets = status.shape
    group.attrs.update(
        {
            "source": "fixture",
            "dataset": "fixture",
            "n_layers": n_layers,
            "n_heads": n_heads,
            "t_max": model.t_max,
            "token_sets": list(model.token_sets),
            "shard_size": 2,
            "n_inputs": n_inputs,
            "n_shards": -(-n_inputs // 2),
        }
    )
    n_tokens = model.n_tokens if model.n_tokens is not None else np.full(n_inputs, model.t_max)
    kinds = np.full((n_inputs, model.t_max), TokenKind.CONTENT, dtype=np.int8)
    kinds[:, 0] = TokenKind.CLS
    rng = np.random.default_rng(0)
    attention = rng.dirichlet(np.ones(model.t_max),
                              size=(n_inputs, n_layers, n_heads, model.t_max))
    model_values = {
        "input_id": np.array([f"img-{i:03d}" for i in range(n_inputs)]),
        "head": np.array([MEAN_HEAD]),
        "n_tokens": n_tokens,
        "token_kind": kinds,
        "input_digest": np.array([f"{i:064x}" for i in range(n_inputs)]),
        "attention": attention.astype(np.float32),  # (input, layer, head, query, key)
    }
    for var, spec in MODEL_VARS.items():
        _array(group, var, spec, model_values[var])
    results = group.create_group(RESULTS_GROUP)
    for var, spec in RESULT_VARS.items():
        _array(results, var, spec, _result_values(model, var, status, n_tokens))


def _with_head_axis(model: FixtureModel) -> FixtureModel:
    """`model` with a head axis (size 1) inserted in every (input, layer, token_set) array."""
    arrays = {name: np.asarray(getattr(model, name))[:, :, None]
              for name in ("margin", "status", "attaining_special", "attaining_kind",
                           "holds_by_characterisation", "slack", "content_gap", "rollout_kappa",
                           "rollout_bound", "radius")
              if getattr(model, name) is not None}
    return replace(model, **arrays)


def _result_values(model: FixtureModel, var: str, status: np.ndarray, n_tokens) -> np.ndarray:
    done = status == ResultStatus.OK
    margin = np.asarray(model.margin, dtype=np.float64)
    bound = (1.0 + model.kappa) / 2.0
    characterisation = (margin <= model.tol if model.holds_by_characterisation is None
                        else np.asarray(model.holds_by_characterisation))
    agrees = characterisation == (margin <= model.tol)
    slack = np.where(agrees, margin, np.where(characterisation, 0.0, X))
    special = (np.zeros(status.shape, dtype=bool) if model.attaining_special is None
               else np.asarray(model.attaining_special))
    content_gap = np.where(special, np.inf, 0.0)
    derived = {
        "kappa": np.full(status.shape, model.kappa),
        "kappa_factor": bound - margin,
        "bound": np.full(status.shape, bound),
        "margin": margin,
        "holds": margin <= model.tol,
        "holds_by_characterisation": characterisation,
        "pair_i": np.zeros(status.shape),
        "pair_j": np.ones(status.shape),
        "attaining_pairs": np.ones(status.shape),
        "attaining_special": model.attaining_special,
        "attaining_kind": model.attaining_kind,
        "slack": slack if model.slack is None else model.slack,
        "content_gap": content_gap if model.content_gap is None else model.content_gap,
        "n_kept": _n_kept(model.token_sets, n_tokens, status.shape),
        "status": status,
        "rollout_kappa": model.rollout_kappa,
        "rollout_bound": model.rollout_bound,
        "radius": model.radius,
    }
    spec = RESULT_VARS[var]
    fill = np.full(status.shape, spec.fill, dtype=spec.dtype)
    if var == "status":
        return status
    if derived[var] is None:
        return fill
    return np.where(done, np.asarray(derived[var]).astype(spec.dtype), fill)


def _n_kept(token_sets: tuple[str, ...], n_tokens, shape: tuple[int, ...]) -> np.ndarray:
    """Tokens kept per cell: every token for `all`, all but the CLS token for `content`."""
    dropped = np.array([1 if name == "content" else 0 for name in token_sets])
    return np.broadcast_to(np.asarray(n_tokens)[:, None, None, None] - dropped, shape)


OK, PENDING, EMPTY = ResultStatus.OK, ResultStatus.NOT_COMPUTED, ResultStatus.EMPTY_ROW
X = 1e-2  # a margin that fails at any tolerance below it


def hand_store(path: Path) -> Path:
    """The small store the query and report tests count by hand.

    alpha: 5 inputs, 3 layers (relative depth 0, 0.5, 1), token sets (all, content); input 4
    is pending everywhere; (input 1, layer 2, content) lost a row (EMPTY_ROW). Margins, by layer,
    for inputs 0-3 (stored tol 1e-12; `-` = skipped)::

        all      layer 0: 0 0 0 0      -> 4/4     content  layer 0: 0 0 0 X  -> 3/4
                 layer 1: 0 X 0 5e-7   -> 2/4               layer 1: 0 0 0 0  -> 4/4
                 layer 2: X X X 0      -> 1/4               layer 2: 0 - X 0  -> 2/3

    The characterisation disagrees with the definition at (input 3, layer 1, all) only (its slack
    is 0: at tol 1e-6 both hold). Every attaining pair involves a special token at (inputs 1, 2,
    layer 2, all); content gaps there +inf and 5e-7 (not special any more at tol 1e-6).
    beta: 2 inputs, 1 layer, token set (all,): margins 0 and 0.2 -> 1/2.
    baseline: n = 2: chunks (5/10, 4/10, not done) -> 9/20; n = 3: (2/10, -, -) -> 2/10.
    """
    all_margins = np.array([[0, 0, X], [0, X, X], [0, 0, X], [0, 5e-7, 0], [0, 0, 0]])
    content_margins = np.array([[0, 0, 0], [0, 0, np.nan], [0, 0, X], [X, 0, 0], [0, 0, 0]])
    margin = np.stack([all_margins, content_margins], axis=-1)  # (input, layer, token_set)
    status = np.full(margin.shape, OK, dtype=np.int8)
    status[4] = PENDING
    status[1, 2, 1] = EMPTY
    special = np.zeros(margin.shape, dtype=bool)
    special[[1, 2], 2, 0] = True  # two of the three failing all-token cells of layer 2
    characterisation = margin <= 1e-12
    characterisation[3, 1, 0] = True  # one disagreement with the definition (margin 5e-7)
    content_gap = np.where(special, np.inf, 0.0)
    content_gap[2, 2, 0] = 5e-7
    rollout_bound = np.broadcast_to(np.array([0.9, 0.8, 0.4])[None, :, None], margin.shape)
    rollout_kappa = np.broadcast_to(np.array([0.9, 0.6, 0.1])[None, :, None], margin.shape)
    alpha = FixtureModel(
        margin=margin,
        status=status,
        attaining_special=special,
        holds_by_characterisation=characterisation,
        content_gap=content_gap,
        rollout_kappa=rollout_kappa,
        rollout_bound=rollout_bound,
        n_tokens=np.array([5, 5, 4, 5, 5]),
    )
    beta = FixtureModel(
        margin=np.array([[[0.0]], [[0.2]]]),
        status=np.full((2, 1, 1), OK, dtype=np.int8),
        token_sets=("all",),
        t_max=3,
    )
    baseline = FixtureBaseline(
        n=np.array([2, 3]),
        holding=np.array([[5, 4, -1], [2, -1, -1]]),
        trials=np.array([[10, 10, 10], [10, 10, 10]]),
        disagreements=np.array([[0, 1, -1], [0, -1, -1]]),
    )
    return write_store(path, {"alpha": alpha, "beta": beta}, baseline)


def stored_arrays(store) -> dict[str, np.ndarray]:
    """Every array of a sweep store (model groups and baseline), by path, wherever it lives
    (a folder, a URL or a `StoreRef` with its options)."""
    from storage.location import locate

    root = zarr.open_group(locate(store).zarr_store(read_only=True), mode="r")
    out = {}
    for group in [*root.attrs["models"], *(["baseline"] if "baseline" in root else [])]:
        for path, array in root[group].members(max_depth=None):
            if isinstance(array, zarr.Array):
                out[f"{group}/{path}"] = array[:]
    return out


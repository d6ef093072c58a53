"""Names, dims and dtypes of everything in a sweep store: the contract between writers and readers.

One Zarr v3 store per sweep (a directory). Layout::

    /                         attrs: config (resolved, JSON), fingerprint, versions, format,
                                 models (names of the model groups)
    /<model>/                 attrs: source, dataset, n_layers, n_heads, t_max, token_sets,
                                     shard_size, n_inputs, n_shards
    /<model>/input_id         (input,)                     str   stable input ids
    /<model>/head             (head,)                      str   "mean", or "0".."H-1"
    /<model>/n_tokens         (input,)                     int32 real tokens of each input
    /<model>/token_kind       (input, token)               int8  TokenKind, PAD beyond n_tokens
    /<model>/input_digest     (input,)                     str   content digest of each input
    /<model>/attention        (input, layer, head, query, key)  float32, zero beyond n_tokens
    /<model>/results/<var>    see RESULT_VARS     one value per (input, layer, head, token_set)
    /<model>/nulls/holding    (null, token_set, chunk)     int64 size-matched null: holding
    /<model>/nulls/trials     (null, token_set, chunk)     int64 trials drawn (0: no tested cell)
    /<model>/nulls/disagreements (null, token_set, chunk)  int64 definition != characterisation
    /<model>/nulls/null       (null,)                      str   null names (workers.nulls)
                              attrs: nulls, token_sets, trials, seed, chunk_trials, tol
    /baseline/holding         (null, size, chunk)          int64 holding matrices per trial chunk
    /baseline/trials          (null, size, chunk)          int64 trials per trial chunk
    /baseline/disagreements   (null, size, chunk)          int64 definition != characterisation
    /baseline/n               (size,)                      int64 matrix sizes
    /baseline/null            (null,)                      str   null names (workers.nulls)
                              attrs: nulls, sizes, trials, seed, chunk_trials, tol

Stores written before named nulls have (size, chunk) baseline arrays and no `null` array: the
readers take them as the `uniform` null (whose stream is unchanged).

Heads: a model whose `heads` option is `mean` (the default) keeps one head-averaged map per layer,
`head` = ["mean"] (size 1); with `each` it keeps every head, `head` = ["0", ..., "H-1"], and every
result variable has one cell per head: an (input, layer, head, token_set) cell is one matrix
tested. `n_heads` (attr) is the size of the `head` dimension. Model groups written before the
head dimension have (input, layer, query, key) attention, (input, layer, token_set) results
(LEGACY_RESULT_DIMS), no `head` array and no `n_heads`: they hold head-averaged maps, the readers
take them as one `mean` head, and `storage.store` writes a resumed one in its own layout (only a
`mean` model can resume it: `heads` is part of the model's fingerprint).

The model group's attrs also hold `training` (the record of a model the project trained) once
its preparation task has run.

Bookkeeping that is not Zarr data lives in `<store>/.sweep/` (BOOKKEEPING_DIR): the lock file,
completion markers (`markers/<model or baseline>/<stage>-<index>.done|.failed`, written only
after the data they vouch for, with the checksums of its chunks: `storage.markers`,
`storage.integrity`) and cached checkpoints. Zarr warns ("not recognized as a component") when it
lists the root; a finished run consolidates the metadata into the root's zarr.json
(`storage.store.consolidate`), so plain xarray reads that and lists nothing, and this project's
readers take the model names from the root attribute `models` instead of listing.

Result arrays have two layouts, one value for value the same: while a model is tested, one chunk
per shard (`model_arrays`: each test task writes its own chunks, so concurrent writers never
share an object); once every shard of the model is tested, the driver rewrites each result
array as a few objects (`storage.compaction`: the Zarr v3 sharding codec, chunks and shards of
`compact_chunks`, chunk keys `c.0.0.0.0`), records them in the marker
`markers/<model>/compact.done` (COMPACT_STAGE) and deletes the per-shard chunks.

Every array carries `_ARRAY_DIMENSIONS`-free Zarr v3 `dimension_names` equal to its dims here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FORMAT = "dobrushin-sweep/1"
BASELINE_GROUP = "baseline"
RESULTS_GROUP = "results"
STAGES = ("extract", "test")
BASELINE_STAGE = "baseline"
NULLS_GROUP = "nulls"  # size-matched nulls, inside each model group
NULLS_STAGE = "nulls"
PREPARE_STAGE = "prepare"  # a model's preparation (training); its marker is named `prepare`
COMPACT_STAGE = "compact"  # a model's results rewritten as few objects; its marker: `compact`
BOOKKEEPING_DIR = ".sweep"
SLACK_WINDOW = 1e-6
"""W: the stored `slack` and `content_gap` (`workers.exact.equality.EqualityResult`) are exact up to
max(tol, W) and +inf above it, so every tolerance-dependent verdict can be re-applied from them
at any tolerance <= W."""


@dataclass(frozen=True)
class Var:
    """One stored variable: its dims (Zarr `dimension_names`), dtype and fill value."""

    dims: tuple[str, ...]
    dtype: str
    fill: object
    doc: str
    compressed: bool = True  # zstd (zarr's default); False: raw chunks


MODEL_VARS: dict[str, Var] = {
    "input_id": Var(("input",), "str", "", "stable id of the input within its dataset"),
    "n_tokens": Var(("input",), "int32", 0, "real tokens of the input (all token set)"),
    "token_kind": Var(("input", "token"), "int8", -1, "workers.exact.token_kinds.TokenKind per "
                                                      "token"),
    "input_digest": Var(
        ("input",), "str", "", "sha256 of what the extraction read (workers.inputs.digests; '' "
                               "before)"
    ),
    "head": Var(("head",), "str", "", "MEAN_HEAD (heads averaged), or each head's index"),
    "attention": Var(
        ("input", "layer", "head", "query", "key"), "float32", 0.0,
        "attention probabilities (head-averaged for the MEAN_HEAD head), rows over the input's "
        "real tokens",
        compressed=False,  # float32 probabilities barely compress (zstd: 7% on attention-like
        # ViT-B stacks) and zstd cost 3x the CPU of a raw read and of a raw write
    ),
}

DEVICE_ROLLOUT = "device_rollout_kappa"
"""The model group's array (input, layer, head, token_set) float64 of the rollout's kappa that the
extraction computed on its device (`rollout_device: extraction` only; NaN where not computed);
the test task copies it into results/rollout_kappa."""
DEVICE_ROLLOUT_VAR = Var(("input", "layer", "head", "token_set"), "float64", np.nan,
                         "kappa of the rollout computed on the extraction device "
                         "(workers.exact.device_rollout)")

MEAN_HEAD = "mean"  # the label of the one head of a head-averaged model
RESULT_DIMS = ("input", "layer", "head", "token_set")
LEGACY_RESULT_DIMS = ("input", "layer", "token_set")  # model groups from before the head dim
LEGACY_ATTENTION_DIMS = ("input", "layer", "query", "key")



def head_labels(heads: str, n_heads: int) -> list[str]:
    """The `head` coordinate of a model: [MEAN_HEAD] for `heads` mean, else "0".."n_heads-1"."""
    return [MEAN_HEAD] if heads == "mean" else [str(h) for h in range(n_heads)]


RESULT_VARS: dict[str, Var] = {
    "kappa": Var(RESULT_DIMS, "float64", np.nan, "Dobrushin coefficient of A"),
    "kappa_factor": Var(RESULT_DIMS, "float64", np.nan, "Dobrushin coefficient of M = (I + A)/2"),
    "bound": Var(RESULT_DIMS, "float64", np.nan, "(1 + kappa)/2"),
    "margin": Var(RESULT_DIMS, "float64", np.nan, "bound - kappa_factor (>= 0 up to rounding)"),
    "holds": Var(RESULT_DIMS, "bool", False, "margin <= tol (the definition)"),
    "holds_by_characterisation": Var(
        RESULT_DIMS, "bool", False, "an attaining pair is mutually self-dominant (the theorem)"
    ),
    "pair_i": Var(
        RESULT_DIMS, "int32", -1, "first token of the returned pair, on the input's token axis "
        "(-1: none)",
    ),
    "pair_j": Var(
        RESULT_DIMS, "int32", -1, "second token of the returned pair, on the input's token axis "
        "(-1: none)",
    ),
    "attaining_pairs": Var(RESULT_DIMS, "int64", -1, "pairs attaining kappa within tol"),
    "attaining_special": Var(
        RESULT_DIMS, "bool", False, "every attaining pair involves a special token"
    ),
    "attaining_kind": Var(
        RESULT_DIMS, "int8", -1, "AttainingKind: the token kinds of the pairs attaining kappa "
        "within tol (-1 none)",
    ),
    "slack": Var(
        RESULT_DIMS, "float64", np.nan, "min over pairs of the combined slack (kappa - kappa_ij)/2 "
        "+ s_ij/2: holds_by_characterisation == (slack <= tol); exact up to "
        "SLACK_WINDOW, +inf above it",
    ),
    "content_gap": Var(
        RESULT_DIMS, "float64", np.nan, "min over pairs without a special token of kappa - "
        "kappa_ij: attaining_special == (content_gap > tol); exact up to SLACK_WINDOW, +inf above "
        "it or when every pair has a special token",
    ),
    "radius": Var(
        RESULT_DIMS, "float64", np.nan, "decision radius: no stochastic perturbation of the "
        "tested matrix smaller than it in the row-l1 norm changes the verdict "
        "(workers.exact.radius)",
    ),
    "n_kept": Var(RESULT_DIMS, "int32", 0, "tokens in the token set (matrix size n)"),
    "status": Var(
        RESULT_DIMS, "int8", -1, "ResultStatus: -1 not computed, 0 ok, 1 empty row, 2 no token, "
        "3 one token, 4 singular complement",
    ),
    "rollout_kappa": Var(
        RESULT_DIMS, "float64", np.nan, "kappa of the rollout M_l ... M_1 (Abnar & Zuidema order)"
    ),
    "rollout_bound": Var(
        RESULT_DIMS, "float64", np.nan, "product of the layerwise bounds up to layer l"
    ),
}

BASELINE_DIMS = ("null", "size", "chunk")
LEGACY_BASELINE_DIMS = ("size", "chunk")  # stores from before named nulls: uniform only

BASELINE_VARS: dict[str, Var] = {
    "n": Var(("size",), "int64", 0, "matrix size"),
    "null": Var(("null",), "str", "", "null model name (workers.nulls.registry.NULLS)"),
    "holding": Var(BASELINE_DIMS, "int64", -1, "matrices where the bound is tight, per chunk"),
    "trials": Var(BASELINE_DIMS, "int64", 0, "matrices drawn, per chunk"),
    "disagreements": Var(
        BASELINE_DIMS, "int64", -1,
        "matrices where holds and holds_by_characterisation differ, per chunk (expected 0)",
    ),
}

MATCHED_DIMS = ("null", "token_set", "chunk")

MATCHED_VARS: dict[str, Var] = {
    "null": Var(("null",), "str", "", "null model name (workers.nulls.registry.NULLS)"),
    "holding": Var(MATCHED_DIMS, "int64", -1, "size-matched draws where the bound is tight"),
    "trials": Var(MATCHED_DIMS, "int64", 0, "size-matched draws (0 when no cell was tested)"),
    "disagreements": Var(
        MATCHED_DIMS, "int64", -1,
        "draws where holds and holds_by_characterisation differ, per chunk (expected 0)",
    ),
}


OPTIONAL_RESULT_VARS = ("radius",)
"""Result variables a store written before them lacks: readers leave them out, writers skip them."""

Shaped = tuple[Var, tuple[int, ...], tuple[int, ...]]  # a variable, its shape and chunk shape


def model_arrays(*, n_inputs: int, shard_size: int, n_layers: int, n_heads: int, t_max: int,
                 n_sets: int) -> dict[str, Shaped]:
    """Every array of a model group (path inside the group -> variable, shape, chunks): a shard
    owns whole chunks of the per-input arrays and results, an input one attention chunk."""
    n, h, s = n_inputs, n_heads, n_sets
    out: dict[str, Shaped] = {
        "input_id": (MODEL_VARS["input_id"], (n,), (shard_size,)),
        "head": (MODEL_VARS["head"], (h,), (h,)),
        "n_tokens": (MODEL_VARS["n_tokens"], (n,), (shard_size,)),
        "token_kind": (MODEL_VARS["token_kind"], (n, t_max), (shard_size, t_max)),
        "input_digest": (MODEL_VARS["input_digest"], (n,), (shard_size,)),
        "attention": (MODEL_VARS["attention"], (n, n_layers, h, t_max, t_max),
                      (1, n_layers, h, t_max, t_max)),
    }
    for name, var in RESULT_VARS.items():
        out[f"{RESULTS_GROUP}/{name}"] = (var, (n, n_layers, h, s), (shard_size, n_layers, h, s))
    return out


COMPACT_CHUNK_CELLS = 1 << 17
"""Cells (input x layer x head x token_set) of one chunk of a compacted result array: 1 MiB of
float64, what one read decodes."""
COMPACT_SHARD_CELLS = 1 << 23
"""Cells of one object (a shard of chunks) of a compacted result array: 64 MiB of float64, so a
50,000-input model of 24 layers x 3 token sets is one object per variable."""
COMPACT_SEPARATOR = "."  # chunk keys of a compacted array (`c.0.0.0.0`): never a per-shard key


def compact_chunks(shape: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(chunk shape, shard shape) of a compacted result array of `shape` (input first): whole
    rows of inputs, COMPACT_CHUNK_CELLS per chunk and COMPACT_SHARD_CELLS per shard at most (one
    input at least), the shard a whole number of chunks."""
    n, rest = shape[0], tuple(shape[1:])
    per_input = max(1, int(np.prod(rest, dtype=np.int64)))
    chunk = max(1, min(n, COMPACT_CHUNK_CELLS // per_input))
    chunks_per_shard = max(1, min(-(-n // chunk), COMPACT_SHARD_CELLS // (chunk * per_input)))
    return (chunk, *rest), (chunk * chunks_per_shard, *rest)


def matched_arrays(*, n_nulls: int, n_sets: int, n_chunks: int) -> dict[str, Shaped]:
    """Every array of a model's size-matched nulls group (`NULLS_GROUP`)."""
    shape = (n_nulls, n_sets, n_chunks)
    return {"null": (MATCHED_VARS["null"], (n_nulls,), (n_nulls,)),
            **{name: (MATCHED_VARS[name], shape, (1, n_sets, 1))
               for name in ("holding", "trials", "disagreements")}}


def baseline_arrays(*, n_nulls: int, n_sizes: int, n_chunks: int) -> dict[str, Shaped]:
    """Every array of the baseline group (`BASELINE_GROUP`)."""
    shape = (n_nulls, n_sizes, n_chunks)
    return {"n": (BASELINE_VARS["n"], (n_sizes,), (n_sizes,)),
            "null": (BASELINE_VARS["null"], (n_nulls,), (n_nulls,)),
            **{name: (BASELINE_VARS[name], shape, (1, 1, 1))
               for name in ("holding", "trials", "disagreements")}}


def zarr_data_type(var: Var) -> str:
    """The `data_type` of `var` in a Zarr v3 array's metadata."""
    return "string" if var.dtype == "str" else var.dtype


class ResultStatus:
    """Values of the `status` result variable."""

    NOT_COMPUTED = -1
    OK = 0
    EMPTY_ROW = 1  # a kept row lost all its mass when restricted to the token set
    TOO_SMALL = 2  # the token set keeps no token at all
    ONE_TOKEN = 3  # the token set keeps a single token: no pair, the theorem says nothing
    SINGULAR = 4  # content-complement: I - A_SS is singular (the special tokens hold a closed
    # class: some special tokens attend only among themselves), so no complement exists


class AttainingKind:
    """Values of the `attaining_kind` result variable: which token kinds the pairs attaining
    kappa(A) (kappa - kappa_ij <= tol, as `attaining_pairs` counts them) involve.

    Each pair has a class: CONTENT_ONLY (two content tokens), the kind of its special token for a
    special-content pair (CLS, REGISTER, SEP, DIST: the `TokenKind` codes), SPECIAL_SPECIAL (two
    special tokens). A cell stores the class its attaining pairs share, or MIXED when they differ.
    """

    NONE = -1  # no verdict (status not OK)
    CONTENT_ONLY = 0
    CLS = 1
    REGISTER = 2
    SEP = 3
    DIST = 4
    SPECIAL_SPECIAL = 5
    MIXED = 6
    NAMES = {-1: "none", 0: "content-only", 1: "CLS", 2: "register", 3: "SEP", 4: "DIST",
             5: "special-special", 6: "mixed"}

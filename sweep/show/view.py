"""One input up close, from the store alone: per layer κ(A), κ(M), the margin, the verdict and the
pair (i, j) attaining κ that the sweep returned, with the pair's token kinds and its
self-dominance entries A_ii, A_ji, A_jj, A_ij in the matrix that was tested.

The verdicts are the store's. The store keeps a pair only where one attaining κ is mutually
self-dominant (A_ii >= A_ji and A_jj >= A_ij: the bound is tight there); for the other layers the
pair shown is found here, in the matrix that was tested, as the pair attaining κ closest to
self-dominance (`attaining_pair`, O(n³) for one matrix). The tested matrix is rebuilt from the
stored attention: A for `all` and `content-pairs`, A[C,C] renormalised for `content`
(`workers.exact.equality.restrict`), the stochastic complement on C for `content-complement`
(`workers.exact.readings.stochastic_complement`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from storage.attention import check_not_dropped
from storage.errors import InputError
from storage.layout import MEAN_HEAD, RESULTS_GROUP, ResultStatus
from storage.location import StoreLike
from storage.store import open_model, open_root
from workers.exact.equality import DEFAULT_TOL, restrict
from workers.exact.readings import stochastic_complement
from workers.exact.token_kinds import TOKEN_SETS, TokenKind, keep_mask, reading_label

KIND_NAMES = {TokenKind.CONTENT: "content", TokenKind.CLS: "CLS", TokenKind.REGISTER: "register",
              TokenKind.SEP: "SEP", TokenKind.DIST: "DIST", TokenKind.PAD: "pad"}
STATUS_NAMES = {ResultStatus.NOT_COMPUTED: "not computed", ResultStatus.OK: "ok",
                ResultStatus.EMPTY_ROW: "a row lost its mass", ResultStatus.TOO_SMALL: "no token",
                ResultStatus.ONE_TOKEN: "one token", ResultStatus.SINGULAR: "no complement"}
SHOWN = ("status", "kappa", "kappa_factor", "bound", "margin", "holds",
         "holds_by_characterisation", "pair_i", "pair_j", "attaining_pairs")


@dataclass(frozen=True)
class LayerRow:
    """One layer's stored verdict and its attaining pair's self-dominance entries."""

    layer: int
    status: int
    kappa: float  # κ(A) of the tested matrix
    kappa_factor: float  # κ(M), M = (I + A)/2
    margin: float  # bound - κ(M): 0 where the bound is tight
    holds: bool
    holds_by_characterisation: bool
    pair: tuple[int, int] | None  # on the input's token axis
    attaining_pairs: int
    entries: tuple[float, float, float, float] | None  # A_ii, A_ji, A_jj, A_ij (tested matrix)
    pair_computed: bool = False  # True: found here (the store keeps no pair where not tight)

    @property
    def verdict(self) -> str:
        if self.status != ResultStatus.OK:
            return STATUS_NAMES.get(self.status, f"status {self.status}")
        return "tight" if self.holds else "not tight"

    @property
    def self_dominant(self) -> bool | None:
        """Whether the pair is mutually self-dominant (A_ii >= A_ji and A_jj >= A_ij)."""
        if self.entries is None:
            return None
        a_ii, a_ji, a_jj, a_ij = self.entries
        return bool(a_ii >= a_ji and a_jj >= a_ij)


@dataclass(frozen=True)
class InputView:
    """One input of one model: its tokens, its attention (layers shown) and its layer rows."""

    model: str
    input_id: str
    index: int  # position on the store's input axis
    n_inputs: int
    head: str
    token_set: str
    token_kind: np.ndarray  # (n_tokens,) int8 TokenKind
    attention: np.ndarray  # (layers shown, n_tokens, n_tokens) float32, head `head`
    rows: tuple[LayerRow, ...]
    tol: float | None  # the sweep's tolerance (root config), None if not recorded

    @property
    def n_tokens(self) -> int:
        return int(self.token_kind.size)


def read_input(store: StoreLike, model: str, input_id: str, *, layers: list[int] | None = None,
               token_set: str = "all", head: str | None = None) -> InputView:
    """The view of input `input_id` of `model`: InputError (one line, naming what exists) for an
    unknown model, input, layer, head or token set, or an input not extracted yet."""
    group = open_model(store, model)
    ids = [str(i) for i in group["input_id"][...].tolist()]
    if input_id not in ids:
        shown = ", ".join(ids[:3]) + (", ..." if len(ids) > 3 else "")
        raise InputError(f"model {model!r} has no input {input_id!r}: its {len(ids)} input ids "
                         f"are {shown}")
    index = ids.index(input_id)
    attrs = dict(group.attrs)
    token_sets = [str(t) for t in attrs["token_sets"]]
    if token_set not in token_sets:
        raise InputError(f"--token-set {token_set!r}: model {model!r} was tested on "
                         f"{', '.join(token_sets)}")
    heads = [str(h) for h in group["head"][...].tolist()] if "head" in group else [MEAN_HEAD]
    head = heads[0] if head is None else head
    if head not in heads:
        raise InputError(f"--head {head!r}: model {model!r} keeps heads {', '.join(heads)}")
    n_layers = int(attrs["n_layers"])
    layers = list(range(n_layers)) if layers is None else layers
    bad = [layer for layer in layers if not 0 <= layer < n_layers]
    if bad:
        raise InputError(f"--layer {bad[0]}: model {model!r} has layers 0..{n_layers - 1}")
    n = int(group["n_tokens"][index])
    if n == 0:
        raise InputError(f"model {model!r} input {input_id!r}: not extracted yet (its shard has "
                         "not run); `sweep status` says what is pending")
    check_not_dropped(store, model, attrs, index, input_id)
    kinds = np.asarray(group["token_kind"][index, :n], dtype=np.int8)
    attention = _read_attention(group["attention"], index, layers, heads.index(head), n)
    values = _result_values(group, index, heads.index(head), token_sets.index(token_set))
    tol = open_root(store).attrs.get("config", {}).get("tol")
    rows = tuple(
        _layer_row(layer, {name: column[layer] for name, column in values.items()},
                   attention[k], kinds, token_set, DEFAULT_TOL if tol is None else tol)
        for k, layer in enumerate(layers)
    )
    return InputView(model, input_id, index, len(ids), head, token_set, kinds, attention, rows,
                     tol)


def _read_attention(array, index: int, layers: list[int], head: int, n: int) -> np.ndarray:
    """(layers shown, n, n) float32: one head of one input, layer by layer (never the whole
    stack: every head of a large model at 518 px is gigabytes); a group written before the head
    dimension has (input, layer, query, key) and its one head."""
    if len(array.shape) == 4:
        return np.stack([array[index, layer, :n, :n] for layer in layers])
    return np.stack([array[index, layer, head, :n, :n] for layer in layers])


def _result_values(group, index: int, head: int, token_set: int) -> dict[str, np.ndarray]:
    """Each shown result variable of one input, per layer (a legacy group has no head axis)."""
    results = group[RESULTS_GROUP]
    out = {}
    for name in SHOWN:
        array = results[name]
        if len(array.shape) == 3:  # (input, layer, token_set): before the head dimension
            out[name] = np.asarray(array[index, :, token_set])
        else:
            out[name] = np.asarray(array[index, :, head, token_set])
    return out


def tested_matrix(a: np.ndarray, kinds: np.ndarray, token_set: str
                  ) -> tuple[np.ndarray | None, np.ndarray]:
    """(the matrix the sweep tested for `token_set`, the token-axis index of each of its rows):
    A for `all` and `content-pairs` (pairs restricted, rows full), A[C,C] renormalised for
    `content`, the stochastic complement on C for `content-complement`; None where it does not
    exist (an empty row, a singular complement)."""
    x = np.asarray(a, dtype=np.float64)
    x = x / x.sum(axis=1, keepdims=True)  # float32 rows miss 1 by ~1e-7, as the test renormalises
    if token_set in ("all", "content-pairs"):
        return x, np.arange(x.shape[0])
    keep = keep_mask(kinds, token_set)
    if token_set == "content":
        restricted = restrict(x, keep)
        return restricted.matrix, restricted.kept
    if token_set == "content-complement":
        return stochastic_complement(x, keep), np.flatnonzero(keep)
    raise InputError(f"unknown token set {token_set!r}: choose from {sorted(TOKEN_SETS)}")


def attaining_pair(x: np.ndarray, tol: float, rows: np.ndarray | None = None
                   ) -> tuple[int, int, int]:
    """(i, j, count): of the pairs of rows of `x` (positions in `x`; `rows`: only pairs of these
    rows) whose κ_ij = ½ Σ_k |x_ik - x_jk| is within `tol` of κ(x), the one with the least
    self-dominance gap (A_ji - A_ii)₊ + (A_ij - A_jj)₊ (the kernel's choice), and how many
    there are. O(n³) for one matrix: a few seconds at n = 1370."""
    rows = np.arange(x.shape[0]) if rows is None else np.asarray(rows)
    kappa_ij = np.full((x.shape[0], x.shape[0]), -np.inf)  # (i, j), i < j
    for k, i in enumerate(rows[:-1]):
        others = rows[k + 1:]
        kappa_ij[i, others] = 0.5 * np.abs(x[i] - x[others]).sum(axis=1)
    ii, jj = np.nonzero(kappa_ij.max() - kappa_ij <= tol)
    gap = np.maximum(x[jj, ii] - x[ii, ii], 0.0) + np.maximum(x[ii, jj] - x[jj, jj], 0.0)
    best = int(np.argmin(gap))
    return int(ii[best]), int(jj[best]), int(ii.size)


def _layer_row(layer: int, values: dict, a: np.ndarray, kinds: np.ndarray,
               token_set: str, tol: float) -> LayerRow:
    """The layer's stored verdict; its pair: the one the sweep stored (a mutually self-dominant
    attaining pair, kept only where the bound is tight), else the attaining pair closest to
    self-dominance, found in the tested matrix (`attaining_pair`)."""
    status = int(values["status"])
    pair, entries, computed = None, None, False
    matrix, kept = tested_matrix(a, kinds, token_set) if status == ResultStatus.OK else \
        (None, None)
    if matrix is not None:
        i, j = int(values["pair_i"]), int(values["pair_j"])
        if i >= 0 and j >= 0 and i in kept and j in kept:
            p, q = int(np.searchsorted(kept, i)), int(np.searchsorted(kept, j))
        else:
            rows = (np.flatnonzero(keep_mask(kinds, token_set)) if token_set == "content-pairs"
                    else None)
            p, q, _ = attaining_pair(matrix, tol, rows)
            computed = True
        pair = (int(kept[p]), int(kept[q]))
        entries = (float(matrix[p, p]), float(matrix[q, p]), float(matrix[q, q]),
                   float(matrix[p, q]))
    return LayerRow(layer=layer, status=status, kappa=float(values["kappa"]),
                    kappa_factor=float(values["kappa_factor"]), margin=float(values["margin"]),
                    holds=bool(values["holds"]),
                    holds_by_characterisation=bool(values["holds_by_characterisation"]),
                    pair=pair, attaining_pairs=int(values["attaining_pairs"]), entries=entries,
                    pair_computed=computed)


def kind_name(kind: int) -> str:
    return KIND_NAMES.get(TokenKind(int(kind)), str(kind))


def token_summary(kinds: np.ndarray) -> str:
    """'30 tokens: CLS at 0, SEP at 29, 28 content' (positions of the special tokens)."""
    parts = []
    for kind in (TokenKind.CLS, TokenKind.DIST, TokenKind.REGISTER, TokenKind.SEP):
        where = np.flatnonzero(kinds == kind)
        if where.size:
            span = (str(where[0]) if where.size == 1 else
                    f"{where[0]}-{where[-1]}" if np.all(np.diff(where) == 1) else
                    ",".join(map(str, where)))
            parts.append(f"{KIND_NAMES[kind]} at {span}")
    parts.append(f"{int(np.sum(kinds == TokenKind.CONTENT))} content")
    return f"{kinds.size} tokens: " + ", ".join(parts)


def render_table(view: InputView, about: str = "", labels: list[str] | None = None) -> str:
    """The terminal view: a header (what the input is, its tokens, the reading) and one row per
    layer. `labels`: a name per token (text tokens, patch positions), shown beside the pair."""
    head = "" if view.head == MEAN_HEAD else f" · head {view.head}"
    lines = [f"{view.model} · input {view.input_id} (#{view.index} of {view.n_inputs}) · "
             f"{token_summary(view.token_kind)}{head}",
             f"reading: {reading_label(view.token_set)}" + (
                 "" if view.tol is None else f" · tight: margin <= {view.tol:g}")]
    if about:
        lines.append(f"input: {about}")
    lines.append("")

    def token(t: int) -> str:
        name = kind_name(view.token_kind[t])
        label = f" {labels[t]!r}" if labels is not None and t < len(labels) else ""
        return f"{t} {name}{label}"

    header = ["layer", "verdict", "κ(A)", "κ(M)", "margin", "pair (i, j)", "A_ii", "A_ji",
              "A_jj", "A_ij", "self-dominant", "pairs at κ"]
    table = [header]
    for row in view.rows:
        entries = ["–"] * 4 if row.entries is None else [f"{v:.4f}" for v in row.entries]
        dominant = {None: "–", True: "yes", False: "no"}[row.self_dominant]
        table.append([
            str(row.layer), row.verdict, _number(row.kappa), _number(row.kappa_factor),
            _number(row.margin, "{:.3g}"),
            "–" if row.pair is None else f"{token(row.pair[0])} · {token(row.pair[1])}"
            + ("*" if row.pair_computed else ""),
            *entries, dominant, "–" if row.attaining_pairs < 0 else str(row.attaining_pairs),
        ])
    widths = [max(len(r[c]) for r in table) for c in range(len(header))]
    for r in table:
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(r, widths, strict=True))
                     .rstrip())
    if any(row.pair_computed for row in view.rows):
        lines += ["", "* the store keeps a pair only where the bound is tight: this pair attains "
                  "κ(A) and is the closest to self-dominance, found in the tested matrix"]
    return "\n".join(lines) + "\n"


def _number(value: float, form: str = "{:.4f}") -> str:
    return "–" if not math.isfinite(value) else form.format(value)

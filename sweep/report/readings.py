"""Report tables for the readings of "content tokens": each token set named with its reading,
and the attribution of the all-token failures to the token kinds of their attaining pairs."""

from __future__ import annotations

import dask
import numpy as np
import pandas as pd
import xarray as xr

from storage.layout import AttainingKind
from storage.query.results import holds, model_names, ok, with_rates
from workers.exact.token_kinds import CONTENT_READINGS, reading_label

KIND_ORDER = [AttainingKind.CONTENT_ONLY, AttainingKind.CLS, AttainingKind.REGISTER,
              AttainingKind.SEP, AttainingKind.DIST, AttainingKind.SPECIAL_SPECIAL,
              AttainingKind.MIXED, AttainingKind.NONE]


def label_readings(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with a `reading` column (the token set named with its reading, e.g.
    'content (A[C,C], renormalised)') right after `token_set`; unchanged without `token_set`."""
    if "token_set" not in frame.columns or "reading" in frame.columns:
        return frame
    labelled = frame.copy()
    position = list(labelled.columns).index("token_set") + 1
    labelled.insert(position, "reading", [reading_label(str(t)) for t in labelled["token_set"]])
    return labelled


def reading_column(token_set: str) -> str:
    """The column-name stem of a reading in the attribution table: 'content-pairs' ->
    'content_pairs'."""
    return token_set.replace("-", "_")


def attribution(tree: xr.DataTree, tol: float | None) -> pd.DataFrame:
    """The all-token failures of each model decomposed by the token kinds of their attaining
    pairs (the stored `attaining_kind`: content-only, CLS, register, SEP, DIST, special-special,
    mixed), with, per content reading the store holds, how many of those input-layer pairs have
    a verdict there (`<reading>_tested`) and hold there (`<reading>_holding`).

    One row per (model, kind) that occurs; `failures` sums over a model's rows to its number of
    all-token failures, and `rate` is the kind's share of them (95% Wilson interval). `tol`
    re-applies the tolerance to which pairs fail, on every reading; the kinds stay those found
    at the sweep's tolerance.
    """
    rows: list[dict] = []
    for name in model_names(tree):
        ds = tree[name].to_dataset()
        present = [str(t) for t in ds["token_set"].values]
        if "all" not in present:
            continue
        every = ds.sel(token_set="all")
        readings = [r for r in CONTENT_READINGS if r in present]
        others = [ds.sel(token_set=reading) for reading in readings]
        failing, kinds, *tested = (np.asarray(v) for v in dask.compute(  # (input, layer, head)
            ok(every) & ~holds(every, tol), every["attaining_kind"], *(
                part for other in others for part in (ok(other), ok(other) & holds(other, tol)))))
        counts = [int(np.count_nonzero(failing))]
        for kind in KIND_ORDER:
            cell = failing & (kinds == kind)
            counts.append(int(np.count_nonzero(cell)))
            for done, holding in zip(tested[::2], tested[1::2], strict=True):
                counts += [int(np.count_nonzero(cell & done)),
                           int(np.count_nonzero(cell & holding))]
        total, counts = counts[0], iter(counts[1:])
        for kind in KIND_ORDER:
            row = {"model": name, "kind": AttainingKind.NAMES[kind], "failures": next(counts),
                   "failing_all": total}
            for reading in readings:
                stem = reading_column(reading)
                row[f"{stem}_tested"], row[f"{stem}_holding"] = next(counts), next(counts)
            if row["failures"]:
                rows.append(row)
    table = pd.DataFrame(rows)
    if table.empty:
        return pd.DataFrame(columns=["model", "kind", "failures", "failing_all", "rate",
                                     "ci_low", "ci_high"])
    stems = [c for c in table.columns if c.endswith(("_tested", "_holding"))]
    for stem in stems:  # a reading some model lacks: None (JSON null), not NaN in an int column
        table[stem] = pd.Series([None if pd.isna(v) else int(v) for v in table[stem]],
                                index=table.index, dtype=object)
    return with_rates(table, "failures", "failing_all")


def attribution_markdown(table: pd.DataFrame) -> list[str]:
    """The attribution as Markdown lines: per model and kind, the failures, their share, and
    `holding/tested` on each content reading."""
    if table.empty:
        return ["(no all-token failures)", ""]
    stems = [c[: -len("_tested")] for c in table.columns if c.endswith("_tested")]
    header = ["model", "kind of the attaining pairs", "failures", "share [95% CI]",
              *[f"holds on {reading_label(s.replace('_', '-'))}" for s in stems]]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in table.to_dict("records"):
        share = (f"{100 * r['rate']:.1f}% [{100 * r['ci_low']:.1f}%, {100 * r['ci_high']:.1f}%]"
                 f" ({r['failures']}/{r['failing_all']})")
        cells = [str(r["model"]), str(r["kind"]), str(r["failures"]), share]
        for stem in stems:
            tested, holding = r[f"{stem}_tested"], r[f"{stem}_holding"]
            cells.append("–" if pd.isna(tested) else f"{holding}/{tested}")
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]

"""The study's tables from a results tree, and their renderings as Markdown, CSV and JSON.

`build_report` reduces a tree from `storage.query.open_results` to six sections of tidy tables
(counts first, rates and 95% Wilson intervals from them); the renderers only format.

A cell is one tested matrix: (input, layer) for a head-averaged model, (input, layer, head) for a
model that kept every head (option `heads: each`); every table counts cells, and such models
also get a per-head table (`heads`).
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, fields, replace

import dask
import numpy as np
import pandas as pd
import xarray as xr

from storage.errors import InputError
from storage.layout import BASELINE_GROUP
from storage.location import redact_url
from storage.query.counts import group_counts, rates
from storage.query.results import (
    attaining_special,
    cell_counts,
    check_tol,
    depth_bin,
    holds,
    model_names,
    ok,
    rates_from_cells,
    with_rates,
)
from sweep.report import findings as findings_rules
from sweep.report import training as report_training
from sweep.report.controls import NEWCOMBE, PAIRED, controls_table, markdown_section
from sweep.report.intervals import (
    CI_METHODS,
    Bootstrap,
    bootstrap_controls,
    bootstrap_head_differences,
    bootstrap_lifts,
    bootstrap_summary,
    interval_table,
    per_input_counts,
    rate_resamples,
)
from sweep.report.nulls import lift_lines, null_lifts
from sweep.report.precision import PRECISION_INTRO, precision_markdown, precision_table
from sweep.report.readings import attribution, attribution_markdown, label_readings
from sweep.report.seeds import markdown_section as seeds_section
from sweep.report.seeds import seeds_table
from workers.exact.token_kinds import reading_label

DEPTH_BINS = 3  # the depth section's relative-depth bins: thirds
LAST_THIRD = 2  # index of the last of them
RATE_COLUMNS = ["inputs", "cells", "holding", "rate", "ci_low", "ci_high"]


@dataclass(frozen=True)
class Report:
    """The six sections of the study as tidy tables (one row per group, counts and rates)."""

    store: str
    tol: float | None  # None: the verdicts stored by the sweep
    sweep_tol: float | None  # the tolerance the sweep's config recorded, if any
    summary: pd.DataFrame  # 1. model, token_set: holding rate over input-layer pairs
    rates: pd.DataFrame  # 2. model, layer, relative_depth, token_set
    depth: pd.DataFrame  # 3. model, token_set, depth third
    failures: pd.DataFrame  # 3. model, token_set: share of failures in the last third
    rescue: pd.DataFrame  # 4. model: all-token failures that hold on content tokens
    special_pairs: pd.DataFrame  # 4. model: attaining pairs that involve a special token
    attribution: pd.DataFrame  # 4. model, kind: all-token failures by their attaining pairs
    baseline: pd.DataFrame  # 5. n: random row-stochastic matrices
    token_counts: pd.DataFrame  # 5. model, token_set: matrix sizes n of the model's inputs
    rollout: pd.DataFrame  # 6. model, token_set: full-rollout kappa against the product bound
    controls: pd.DataFrame  # model, control, token_set: trained vs random-init rates
    training: dict  # 7. model name -> training record (models trained by the project)
    nulls: pd.DataFrame | None = None  # 1. model, token_set, null: size-matched null and lift
    heads: pd.DataFrame | None = None  # 2. model, head, token_set (models that kept each head)
    precision: pd.DataFrame | None = None  # 1. model, token_set, dtype: decided at its rounding
    ci_method: str = "wilson"  # how every ci_low/ci_high was made: wilson (Newcombe for
    # differences) or bootstrap (the cluster bootstrap over inputs: `sweep.report.intervals`)
    intervals: pd.DataFrame | None = None  # 1. model, token_set: Wilson beside the bootstrap
    seeds: pd.DataFrame | None = None  # model, token_set: rates across training seeds
    findings: pd.DataFrame | None = None  # model, token_set, kind: what the intervals support
    trajectory: pd.DataFrame | None = None  # model, checkpoint, token_set: tightness over
    # training (`sweep.report.training.trajectory_table`); None without checkpoint sweeps
    trajectory_layers: pd.DataFrame | None = None  # ... and layer: per-layer paired
    # differences from the initialisation (`sweep.report.training.layer_trajectory_table`)
    trajectory_pairs: pd.DataFrame | None = None  # model, other, checkpoint, token_set: two
    # comparable trajectories (e.g. two objectives), paired by seed (`...training`)


def build_report(tree: xr.DataTree, store: str = "", tol: float | None = None,
                 ci: str = "wilson", bootstrap: Bootstrap | None = None) -> Report:
    """Reduce a results tree to the study's tables; `tol` re-applies a tolerance to margins.
    `ci`: "wilson" (Wilson, Newcombe for differences), or "bootstrap": every headline rate,
    trained - control difference and lift gets the cluster-bootstrap interval over inputs
    (`bootstrap`: resamples and seed), and the `intervals` table compares the two."""
    if ci not in CI_METHODS:
        raise InputError(f"--ci {ci!r}: choose one of {', '.join(CI_METHODS)}")
    report = _build_wilson(tree, redact_url(store), tol)
    pairs, head_intervals = findings_rules.head_pairs(tree), None
    if ci != "wilson":
        how = bootstrap or Bootstrap()
        counts = per_input_counts(tree, report.tol)
        samples = rate_resamples(counts, how)  # each rate's resamples, drawn once
        report = replace(
            report, ci_method=ci,
            summary=bootstrap_summary(report.summary, samples),
            controls=bootstrap_controls(report.controls, counts, how),
            nulls=None if report.nulls is None else bootstrap_lifts(report.nulls, samples, how),
            intervals=label_readings(interval_table(report.summary, counts, samples)),
        )
        head_intervals = bootstrap_head_differences(pairs, counts, how)
    findings = findings_rules.build_findings(  # from the intervals the report prints
        report.summary, report.rates, report.controls, report.nulls, report.seeds,
        pairs, ci_method=report.ci_method, head_intervals=head_intervals)
    trajectory = report_training.trajectory_table(report.summary, report.controls,
                                                  report.nulls, report.training)
    if trajectory.empty:
        return replace(report, findings=findings)
    pairs_table = report_training.trajectory_pairs(
        report.summary, report_training.comparable_trajectories(tree))
    over_training = pd.concat([report_training.trajectory_findings(trajectory, report.ci_method),
                               report_training.pair_findings(pairs_table)], ignore_index=True)
    findings = pd.concat([findings, over_training], ignore_index=True) if findings is not None \
        else over_training
    return replace(report, findings=findings, trajectory=trajectory,
                   trajectory_layers=report_training.layer_trajectory_table(report.rates),
                   trajectory_pairs=None if pairs_table.empty else pairs_table)


def _build_wilson(tree: xr.DataTree, store: str, tol: float | None) -> Report:
    """The report with Wilson (and Newcombe) intervals."""
    tol = check_tol(tol)
    cells = cell_counts(tree, tol)  # read the verdicts once, group them three ways
    depth = rates_from_cells(cells, by=("model", "token_set", "depth"), depth_bins=DEPTH_BINS)
    order = model_names(tree)
    summary = rates_from_cells(cells, by=("model", "token_set"))
    return Report(
        store=store,
        tol=tol,
        sweep_tol=tree.attrs.get("config", {}).get("tol"),
        summary=label_readings(summary),
        rates=label_readings(rates_from_cells(cells)),
        depth=label_readings(_in_store_order(depth, order, ["token_set", "depth"])),
        failures=label_readings(_in_store_order(failures_by_depth(cells), order, ["token_set"])),
        rescue=special_token_rescue(tree, tol),
        special_pairs=special_pairs(tree, tol),
        attribution=attribution(tree, tol),
        baseline=baseline_table(tree),
        token_counts=label_readings(token_counts(tree)),
        rollout=label_readings(rollout_gap(tree)),
        controls=label_readings(controls_table(summary)),
        training=report_training.training_records(tree),
        nulls=null_lifts(tree, summary),
        heads=head_rates(tree, cells),
        precision=precision_table(tree),
        seeds=label_readings(seeds_table(summary)),
    )


def per_head_models(tree: xr.DataTree) -> list[str]:
    """The models that kept every head (more than one entry on `head`), in store order."""
    return [name for name in model_names(tree) if tree[name].sizes["head"] > 1]


def head_rates(tree: xr.DataTree, cells: xr.Dataset) -> pd.DataFrame | None:
    """Per model that kept every head, per head and token set: the holding rate over its
    input-layer cells. None when every model is head-averaged."""
    models = per_head_models(tree)
    if not models:
        return None
    kept = cells.isel(cell=np.flatnonzero(np.isin(cells["model"].values, models)))
    return label_readings(rates_from_cells(kept, by=("model", "head", "token_set")))


def failures_by_depth(cells: xr.Dataset) -> pd.DataFrame:
    """Per model and token set, from `cell_counts`: failures (cells - holding, over every layer)
    and the share of them in the last third of the layers (relative depth), summed by xarray."""
    failures = cells["cells"] - cells["holding"]
    last = depth_bin(cells["relative_depth"].values, DEPTH_BINS) == LAST_THIRD
    counts = xr.Dataset({"failures": failures,
                         "last_third": failures.where(xr.DataArray(last, dims="cell"), 0)})
    groups = group_counts(counts, ("model", "token_set"))
    groups = groups.merge(rates(groups["last_third"], groups["failures"]))
    columns = ["model", "token_set", "failures", "last_third", "rate", "ci_low", "ci_high"]
    return pd.DataFrame({column: groups[column].values for column in columns})


def _in_store_order(table: pd.DataFrame, models: list[str], then: list[str]) -> pd.DataFrame:
    """`table`'s rows sorted by model in the store's order, then by the columns `then`."""
    order = {name: index for index, name in enumerate(models)}
    return table.sort_values(["model", *then], kind="stable", ignore_index=True,
                             key=lambda column: column.map(order) if column.name == "model"
                             else column)


def special_token_rescue(tree: xr.DataTree, tol: float | None) -> pd.DataFrame:
    """Of the input-layer pairs that fail on all tokens, how many hold on content tokens."""
    names, lazy = [], []
    for name in _models_with(tree, ("all", "content")):
        ds = tree[name].to_dataset()
        every, content = ds.sel(token_set="all"), ds.sel(token_set="content")
        failing = ok(every) & ~holds(every, tol)  # (input, layer, head)
        tested = failing & ok(content)
        lazy.append((failing.sum(), tested.sum(), (tested & holds(content, tol)).sum()))
        names.append(name)
    rows = [
        {"model": name, "failing_all": int(a), "content_tested": int(b), "holding_content": int(c)}
        for name, (a, b, c) in zip(names, dask.compute(*lazy), strict=True)
    ]
    columns = ["model", "failing_all", "content_tested", "holding_content"]
    return with_rates(pd.DataFrame(rows, columns=columns), "holding_content", "content_tested")


def special_pairs(tree: xr.DataTree, tol: float | None) -> pd.DataFrame:
    """How often every attaining pair involves a special token, on all tokens: overall and
    among the failing pairs (attaining pairs within `tol` of kappa, or the sweep's own)."""
    names, lazy = [], []
    for name in _models_with(tree, ("all",)):
        every = tree[name].to_dataset().sel(token_set="all")
        done, special = ok(every), attaining_special(every, tol)
        failing = done & ~holds(every, tol)
        lazy.append((done.sum(), (done & special).sum(), failing.sum(), (failing & special).sum()))
        names.append(name)
    columns = ["model", "cells", "special", "failing", "failing_special"]
    rows = [
        dict(zip(columns, [name, *map(int, counts)], strict=True))
        for name, counts in zip(names, dask.compute(*lazy), strict=True)
    ]
    table = with_rates(pd.DataFrame(rows, columns=columns), "special", "cells")
    return with_rates(table, "failing_special", "failing", prefix="failing_")


def baseline_table(tree: xr.DataTree) -> pd.DataFrame:
    """The baseline node as records: null, n, trials, holding, rate, CI, disagreements, chunks
    done."""
    columns = ["null", "n", "trials", "holding", "rate", "ci_low", "ci_high", "disagreements",
               "chunks_done", "chunks"]
    if BASELINE_GROUP not in tree.children:
        return pd.DataFrame(columns=columns)
    return tree[BASELINE_GROUP].to_dataset().to_dataframe().reset_index()[columns]


def token_counts(tree: xr.DataTree) -> pd.DataFrame:
    """Per model and token set: the matrix sizes n its tested inputs produced (min/median/max)."""
    tables = []
    for name in model_names(tree):
        ds = tree[name].to_dataset()
        tested = ds["n_kept"].where(ok(ds))  # NaN: no verdict
        # the largest over layers and heads (dask's max refuses an empty array: no inputs)
        kept = (tested.max(["layer", "head"]) if ds.sizes["input"]
                else tested.isel(layer=0, head=0)).compute()
        tables.append(_per_token_set(name, _spread(kept, "n").assign(inputs=kept.count("input"))))
    columns = ["model", "token_set", "inputs", "n_min", "n_median", "n_max"]
    return _concat(tables, columns)


def rollout_gap(tree: xr.DataTree) -> pd.DataFrame:
    """At the last layer (the full rollout): kappa of the rollout against the product of the
    layerwise bounds, as medians and the spread of their ratio kappa / bound."""
    tables = []
    for name in model_names(tree):
        last = tree[name].to_dataset().isel(layer=-1)
        kappa, bound = (_samples(last[var].where(ok(last))).compute()  # (input x head, token_set)
                        for var in ("rollout_kappa", "rollout_bound"))
        keep = np.isfinite(kappa) & np.isfinite(bound) & (bound > 0)
        kappa, bound = kappa.where(keep), bound.where(keep)
        table = _spread(kappa / bound, "ratio").assign(
            inputs=keep.sum("input"), kappa_median=kappa.median("input"),
            bound_median=bound.median("input"))
        tables.append(_per_token_set(name, table, keep=("layer",)))
    columns = ["model", "token_set", "layer", "inputs", "kappa_median", "bound_median",
               "ratio_median", "ratio_min", "ratio_max"]
    return _concat(tables, columns)


def render_markdown(report: Report) -> str:
    """The six sections as a Markdown document."""
    tol = f"margin <= {report.tol:g} (re-applied)" if report.tol is not None else (
        "as stored by the sweep" + ("" if report.sweep_tol is None else
                                    f" (margin <= {report.sweep_tol:g})"))
    method = ("95% Wilson (Newcombe for differences)" if report.ci_method == "wilson" else
              "headline rates, trained - control differences and lifts: 95% cluster bootstrap "
              "over inputs (paired for trained - control; the null's own uncertainty in each "
              "lift); every other table: 95% Wilson")
    out = [f"# Dobrushin bound tightness: {report.store}", "",
           f"Intervals (ci_method {report.ci_method}): {method}.", "",
           f"Verdicts: {tol}. `k/n` counts input-layer pairs with a "
           "verdict; pending = not computed yet, skipped = no verdict: the token set kept fewer "
           "than two tokens, a row lost its mass, or the complement does not exist; "
           "disagreements = verdicts where the definition and the characterisation differ.", ""]
    if report.heads is not None:
        models = ", ".join(dict.fromkeys(report.heads["model"]))
        out += [f"Every head of {models} is a matrix of its own (option `heads: each`): their "
                "counts are of input-layer-head cells, and their per-head rates follow the "
                "per-layer table.", ""]
    out += findings_rules.headline_section(report.findings)
    out += ["## 1. Headline: share of input-layer pairs where the bound is tight", ""]
    out += _headline(report.summary)
    bootstrapped = report.ci_method == "bootstrap"
    out += markdown_section(report.controls, PAIRED if bootstrapped else NEWCOMBE)
    if report.nulls is not None:
        lift_ci = ("95% cluster bootstrap over inputs with the null's binomial uncertainty"
                   if bootstrapped else "95% Newcombe interval")
        out += ["Beside size-matched nulls (random matrices at the sizes of the model's own "
                "tested matrices; the null's rate, then the lift observed - null in percentage "
                f"points, {lift_ci}):", ""]
        out += lift_lines(report.nulls)
    if report.seeds is not None:
        out += seeds_section(report.seeds)
    out += ["## 2. Per layer", ""]
    out += _table(report.rates, ["model", "layer", "relative_depth", "reading"], rates=True)
    if report.heads is not None:
        out += ["Per head (models that kept every head):", ""]
        out += _table(report.heads, ["model", "head", "reading"], rates=True)
    out += ["## 3. Depth: where failures happen", ""]
    out += _table(report.depth, ["model", "reading", "depth_low", "depth_high"], rates=True)
    out += ["Share of the failures that happen in the last third of the layers:", ""]
    out += _table(report.failures, ["model", "reading", "last_third", "failures"], rates=True,
                  counts=False)
    out += ["## 4. Special tokens", "",
            "The pairs that fail on all tokens, by the token kinds of the pairs attaining kappa "
            "(at the sweep's tolerance; mixed = attaining pairs of several kinds), and how many "
            "of them hold on each content reading (holding/tested):", ""]
    out += attribution_markdown(report.attribution)
    out += ["Of the pairs that fail on all tokens, the share that hold on content tokens "
            f"({reading_label('content')}):", ""]
    out += _table(report.rescue, ["model", "failing_all", "holding_content", "content_tested"],
                  rates=True, counts=False)
    out += ["How often every attaining pair (all tokens) involves a special token:", ""]
    pairs = report.special_pairs.assign(
        all_pairs=_fraction(report.special_pairs, "special", "cells", ""),
        failing_pairs=_fraction(report.special_pairs, "failing_special", "failing", "failing_"),
    )
    out += _table(pairs, ["model", "all_pairs", "failing_pairs"])
    out += ["## 5. Baseline: random row-stochastic matrices", ""]
    out += _table(report.baseline, ["null", "n", "chunks_done", "chunks", "disagreements"],
                  rates=True, n="trials")
    out += ["The models' own matrix sizes n (tested inputs):", ""]
    out += _table(report.token_counts, ["model", "reading", "inputs", "n_min", "n_median",
                                        "n_max"])
    out += ["## 6. Whole rollout: kappa of the full rollout against the product of the bounds", ""]
    out += _table(report.rollout, list(report.rollout.columns))
    out += report_training.render_markdown(report.training)
    if report.trajectory is not None:
        over_training = None if report.findings is None else report.findings[
            report.findings["kind"].isin(report_training.FINDING_KINDS)]
        out += report_training.trajectory_markdown(report.trajectory, over_training)
        out += report_training.layer_markdown(report.trajectory_layers)
        out += report_training.pair_markdown(report.trajectory_pairs)
    out += ["## Detail: intervals and precision", ""]
    if report.intervals is not None:
        out += ["Per-input (cluster bootstrap) beside Wilson intervals of the headline rates: "
                "width ratio = bootstrap / Wilson width, design effect = bootstrap variance / "
                "binomial variance of independent cells:", ""]
        out += _table(report.intervals, list(report.intervals.columns))
    out += ["Verdicts at the data's precision:", "", *PRECISION_INTRO]
    out += precision_markdown(report.precision)
    if report.findings is not None:
        out += findings_rules.markdown_section(report.findings)
    return "\n".join(out)


def table_names() -> list[str]:
    """The report's tables, by their JSON keys (what `render_csv` can write)."""
    return [f.name for f in fields(Report)
            if f.type in ("pd.DataFrame", "pd.DataFrame | None", pd.DataFrame)]


ABSENT_TABLES = {"heads": "no model keeps each head (option heads: each)",
                 "intervals": "the bootstrap table needs --ci bootstrap",
                 "precision": "the store was written before decision radii",
                 "trajectory": "no model is swept over its checkpoints (checkpoints: or "
                               "revision:)",
                 "trajectory_layers": "no model is swept over its checkpoints (checkpoints: or "
                                      "revision:)",
                 "trajectory_pairs": "no two trajectories of one family on one dataset"}
"""Why an optional table (a `Report` field that may be None) is missing from a store's report."""


def render_csv(report: Report, table: str = "rates") -> str:
    """The per-layer rates table (the JSON `rates` records) as CSV with one header row, or
    another of the report's tables by its JSON key (e.g. `controls`)."""
    buffer = io.StringIO()
    if table != "rates":
        frame = getattr(report, table)
        if frame is None:
            raise InputError(f"{report.store}: no {table!r} table: {ABSENT_TABLES[table]}")
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(frame.columns)
        for record in _records(frame):
            writer.writerow(["" if value is None else value for value in record.values()])
        return buffer.getvalue()
    columns = ["model", "layer", "relative_depth", "token_set", "reading", *RATE_COLUMNS,
               "pending", "skipped", "disagreements"]
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    for record in _records(report.rates[columns]):
        writer.writerow(["" if record[c] is None else record[c] for c in columns])
    return buffer.getvalue()


def render_json(report: Report) -> str:
    """One JSON object: store, tol, rates, summary, baseline and the other sections' records."""
    document = {"store": report.store, "tol": report.tol, "sweep_tol": report.sweep_tol,
                "ci_method": report.ci_method}
    for field in fields(Report):
        value = getattr(report, field.name)
        if isinstance(value, pd.DataFrame):
            method = report.ci_method if field.name in BOOTSTRAPPED_TABLES else "wilson"
            document[field.name] = [{"ci_method": method, **record}  # a record's own wins
                                    for record in _records(value)]
    document["training"] = report.training  # model name -> training record
    return json.dumps(document, indent=2, allow_nan=False) + "\n"


BOOTSTRAPPED_TABLES = ("summary", "controls", "nulls", "intervals")
"""The tables whose intervals `--ci bootstrap` makes by the cluster bootstrap over inputs; the
others keep Wilson intervals (their records say `ci_method: wilson`)."""

RENDERERS = {"text": render_markdown, "json": render_json, "csv": render_csv}
"""The renderers by `--format` name (`text`: the Markdown document)."""


def _models_with(tree: xr.DataTree, token_sets: tuple[str, ...]) -> list[str]:
    return [
        name for name in model_names(tree)
        if set(token_sets) <= set(tree[name]["token_set"].values.tolist())
    ]


def _spread(values: xr.DataArray, name: str) -> xr.Dataset:
    """`{name}_min`, `{name}_median`, `{name}_max` over the `input` dim of `values`, NaN (no
    value) left out; NaN where there is no value at all."""
    if not values.sizes["input"]:  # min and max have no identity: one NaN entry is no value
        values = values.pad(input=(0, 1))
    return xr.Dataset({f"{name}_{stat}": getattr(values, stat)("input")
                       for stat in ("min", "median", "max")})


def _samples(values: xr.DataArray) -> xr.DataArray:
    """`values` with its `input` and `head` dims as one `input` dim: each stored head of each
    input is one sample (one per input when heads are averaged)."""
    stacked = values.stack(sample=("input", "head"))
    return stacked.drop_vars(["sample", "input", "head"]).rename(sample="input")


def _per_token_set(model: str, table: xr.Dataset, keep: tuple[str, ...] = ()) -> pd.DataFrame:
    """A model's (token_set) reductions as rows: model, token_set, the scalar coords in `keep`,
    the variables."""
    table = table.drop_vars([c for c in table.coords if c not in ("token_set", *keep)])
    return table.to_dataframe().reset_index().assign(model=model)


def _concat(tables: list[pd.DataFrame], columns: list[str]) -> pd.DataFrame:
    if not tables:
        return pd.DataFrame(columns=columns)
    return pd.concat(tables, ignore_index=True)[columns]


def _records(frame: pd.DataFrame) -> list[dict]:
    """Rows as JSON-ready dicts: numpy scalars to Python, NaN to None."""
    return [{key: _plain(value) for key, value in row.items()} for row in
            frame.to_dict("records")]


def _plain(value):
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _percent(value: float) -> str:
    return "–" if not math.isfinite(value) else f"{100 * value:.1f}%"


def _fraction(frame: pd.DataFrame, k: str, n: str, prefix: str) -> pd.Series:
    return pd.Series(
        [f"{_rate_and_interval(r, prefix)} ({r[k]}/{r[n]})" for r in frame.to_dict("records")],
        index=frame.index, dtype=object,
    )


def _rate_and_interval(record: dict, prefix: str = "") -> str:
    """`58.3% [32.0%, 80.7%]`, or `–` when there is nothing to count yet."""
    rate = record[f"{prefix}rate"]
    if not math.isfinite(rate):
        return "–"
    low, high = record[f"{prefix}ci_low"], record[f"{prefix}ci_high"]
    return f"{_percent(rate)} [{_percent(low)}, {_percent(high)}]"


def _headline(summary: pd.DataFrame) -> list[str]:
    """One row per model, one column per token set: rate [CI] (holding/cells)."""
    if summary.empty:  # every model has token sets: a row each, tested or not
        return ["(no models in this store yet: `sweep run` adds the models its config lists)",
                ""]
    cells = summary.assign(cell=_fraction(summary, "holding", "cells", ""))
    wide = cells.pivot(index="model", columns="token_set", values="cell")
    order = list(dict.fromkeys(summary["token_set"]))
    totals = summary.groupby("model", sort=False)[["pending", "disagreements"]].sum()
    wide = wide.reindex(index=list(dict.fromkeys(summary["model"])), columns=order).fillna("–")
    wide = wide.rename(columns=reading_label)
    wide = wide.reset_index().assign(pending=totals["pending"].to_numpy(),
                                     disagreements=totals["disagreements"].to_numpy())
    return _table(wide, list(wide.columns))


def _table(frame: pd.DataFrame, columns: list[str], rates: bool = False, counts: bool = True,
           k: str = "holding", n: str = "cells") -> list[str]:
    """A Markdown table of `columns`, plus `k/n` (when `counts`), rate and 95% CI when `rates`.
    Hand-built: DataFrame.to_markdown (tabulate) pads every cell to its column's width, which
    would change every report's bytes and widen its long tables for no reader's gain."""
    if frame.empty:
        return ["(no rows)", ""]
    header = [c.replace("_", " ") for c in columns]
    if rates:
        header += ([f"{k}/{n}"] if counts else []) + ["rate [95% CI]"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in frame.to_dict("records"):
        cells = [_cell(r[c]) for c in columns]
        if rates:
            cells += [f"{r[k]}/{r[n]}"] if counts else []
            cells.append(_rate_and_interval(r))
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


def _cell(value) -> str:
    value = _plain(value)
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)

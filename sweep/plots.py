"""The study's figures as PNG files: rate against depth, the baseline against n, and margins.

Figures are built with `matplotlib.figure.Figure` (Agg canvas, no pyplot state), one file each.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import xarray as xr
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from storage.query import model_names, ok
from sweep.report import Report
from workers.token_kinds import TOKEN_SETS, reading_label

MARGIN_FLOOR = 1e-17  # margins at or below this (exact zeros included) share the leftmost bin
TOKEN_SET_LABELS = {name: reading_label(name) for name in TOKEN_SETS}  # names the reading


CAPTIONS = {
    "depth.png": "Holding rate by relative depth, per model and reading (bands: 95% Wilson).",
    "margins.png": "Distribution of the margins bound - κ(M) per model and reading "
                   "(0 = bound tight).",
    "baseline.png": "Random row-stochastic matrices: holding rate against n, with the models' "
                    "median n marked.",
}


def report_figures(tree: xr.DataTree, report: Report) -> dict[str, Figure]:
    """The figures by file name: depth.png, margins.png, and baseline.png when the store has a
    baseline (captions in `CAPTIONS`)."""
    tol = report.tol if report.tol is not None else report.sweep_tol
    figures = {"depth.png": depth_figure(report), "margins.png": margin_figure(tree, tol)}
    if not report.baseline.empty:
        figures["baseline.png"] = baseline_figure(report)
    return figures


def write_plots(tree: xr.DataTree, report: Report, out_dir: Path) -> list[Path]:
    """Write depth.png, baseline.png (when the store has a baseline) and margins.png."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, figure in report_figures(tree, report).items():
        path = out_dir / name
        figure.savefig(path, dpi=120, bbox_inches="tight")
        paths.append(path)
    return paths


def depth_figure(report: Report) -> Figure:
    """One panel per model: holding rate (95% Wilson band) against relative depth, per token set."""
    models = list(dict.fromkeys(report.rates["model"])) or ["(no results)"]
    columns = min(3, len(models))
    rows = math.ceil(len(models) / columns)
    figure = Figure(figsize=(4.6 * columns, 3.6 * rows), layout="constrained")
    axes = figure.subplots(rows, columns, squeeze=False, sharey=True).ravel()
    for ax, model in zip(axes, models, strict=False):
        rates = report.rates[report.rates["model"] == model]
        for token_set, group in rates.groupby("token_set", sort=False):
            group = group[group["inputs"] > 0].sort_values("relative_depth")
            x = group["relative_depth"].to_numpy()
            line, = ax.plot(x, group["rate"], marker="o", ms=3,
                            label=TOKEN_SET_LABELS.get(token_set, token_set))
            low, high = group["ci_low"].to_numpy(), group["ci_high"].to_numpy()
            if len(x) == 1:  # a band needs two layers: show the interval as an error bar
                ax.errorbar(x, group["rate"], yerr=[group["rate"] - low, high - group["rate"]],
                            color=line.get_color(), capsize=3)
            ax.fill_between(x, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
        inputs = int(rates["inputs"].max()) if len(rates) else 0
        ax.set_title(f"{model} (up to {inputs} inputs per layer)", fontsize=10)
        ax.set_xlabel("relative depth (0 = first layer, 1 = last)")
        ax.set_xlim(-0.03, 1.03)
        ax.set_ylim(-0.03, 1.03)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="best")
    for ax in axes[: len(axes) : columns]:
        ax.set_ylabel("share of inputs where bound is tight")
    for ax in axes[len(models):]:
        ax.set_visible(False)
    verdicts = "stored verdicts" if report.tol is None else f"margin ≤ {report.tol:g}"
    figure.suptitle(f"Tightness of the layerwise bound by depth ({verdicts}; bands: 95% Wilson)")
    return figure


def baseline_figure(report: Report) -> Figure:
    """Baseline holding rate against n (95% Wilson), with the models' median n marked."""
    figure = Figure(figsize=(7.5, 4.5), layout="constrained")
    ax = figure.subplots()
    done = report.baseline[report.baseline["trials"] > 0]
    n = np.unique(done["n"].to_numpy())
    for null, rows in done.groupby("null", sort=False):  # one line per null model
        rate = rows["rate"].to_numpy()
        error = np.vstack([rate - rows["ci_low"].to_numpy(), rows["ci_high"].to_numpy() - rate])
        ax.errorbar(rows["n"].to_numpy(), rate, yerr=error, marker="o", ms=4, capsize=3,
                    label=f"null {null}: random row-stochastic matrices (95% Wilson)")
    sizes = report.token_counts[report.token_counts["inputs"] > 0]
    colours = {"all": "tab:red", "content": "tab:blue"}
    for record in sizes.to_dict("records"):
        ax.axvline(record["n_median"], color=colours.get(record["token_set"], "tab:gray"),
                   linestyle=":", linewidth=1.2)
    for model, group in sizes.groupby("model", sort=False):  # one label per model
        ax.annotate(f"{model} ", (group["n_median"].max(), 0.98),
                    xycoords=("data", "axes fraction"), rotation=90, fontsize=8,
                    ha="left", va="top")
    for token_set, colour in colours.items():
        if (sizes["token_set"] == token_set).any():
            ax.plot([], [], color=colour, linestyle=":",
                    label=f"models' median n, {TOKEN_SET_LABELS[token_set]}")
    if len(n) and n.max() / max(n.min(), 1) > 20:
        ax.set_xscale("log")
        ax.set_xticks(n, [str(v) for v in n])
        ax.minorticks_off()
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("matrix size n (tokens)")
    ax.set_ylabel("share of matrices where bound is tight")
    ax.set_ylim(0, max([0.55, *(1.05 * done["ci_high"].dropna())]))
    if done.empty:
        ax.text(0.5, 0.5, "no baseline chunk finished yet", transform=ax.transAxes,
                ha="center", va="center", color="gray")
    ax.grid(alpha=0.3)
    figure.legend(loc="outside lower center", ncols=2, fontsize=8)
    ax.set_title("Baseline: random matrices against the models' own token counts")
    return figure


def margin_figure(tree: xr.DataTree, tol: float | None = None) -> Figure:
    """Per token set, histograms of log10 margins (bound - kappa_factor) per model."""
    token_sets = list(dict.fromkeys(
        str(t) for name in model_names(tree) for t in tree[name]["token_set"].values
    )) or ["all"]
    figure = Figure(figsize=(5.2 * len(token_sets), 4.0), layout="constrained")
    axes = figure.subplots(1, len(token_sets), squeeze=False, sharey=True).ravel()
    edges = np.linspace(math.log10(MARGIN_FLOOR), 0.0, 35)
    for ax, token_set in zip(axes, token_sets, strict=True):
        for name in model_names(tree):
            ds = tree[name].to_dataset()
            if token_set not in ds["token_set"].values:
                continue
            cell = ds.sel(token_set=token_set)
            margin = cell["margin"].where(ok(cell)).values.ravel()
            margin = margin[np.isfinite(margin)]
            logged = np.log10(np.clip(margin, MARGIN_FLOOR, 1.0))
            ax.hist(logged, bins=edges, histtype="step", linewidth=1.4,
                    label=f"{name} ({margin.size} pairs)")
        if tol:
            ax.axvline(math.log10(tol), color="black", linestyle="--", linewidth=1,
                       label=f"tolerance {tol:g}")
        ax.set_yscale("log")
        ax.set_title(TOKEN_SET_LABELS.get(token_set, token_set), fontsize=10)
        ax.set_xlabel(f"log10 margin (bound − κ(M)); ≤ {MARGIN_FLOOR:g} and 0 at left edge")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    axes[0].set_ylabel("input-layer pairs")
    figure.suptitle("Distribution of margins (0 = bound tight)")
    return figure

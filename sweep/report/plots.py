"""The study's figures as PNG files: rate against depth, the baseline against n, and margins.

Each figure carries the comparison the report is about: per model and token set (small
multiples), the model beside its random-init control and, for depth, the band of its
size-matched nulls; never several models overlaid in one panel.

Figures are built with `matplotlib.figure.Figure` (Agg canvas, no pyplot state), one file each,
and drawn with mathtext off (`PLAIN_TEXT`): a name holding `$` (a model of someone else's store)
is text, never a formula that fails to parse.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib
import numpy as np
import xarray as xr
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from storage.query.results import model_names, ok
from sweep.config.controls import control_pairs
from sweep.report.tables import Report
from workers.exact.token_kinds import TOKEN_SETS, reading_label
from workers.models.registry import TRAINED_FAMILIES

MARGIN_FLOOR = 1e-17  # margins at or below this (exact zeros included) share the leftmost bin
TOKEN_SET_LABELS = {name: reading_label(name) for name in TOKEN_SETS}  # names the reading
NULL_COLOURS = ("tab:gray", "tab:green", "tab:purple", "tab:brown", "tab:pink")
PLAIN_TEXT = {"text.parse_math": False}  # every label as written: `$` is no formula (item 9)


CAPTIONS = {
    "depth.png": "Holding rate by relative depth, per model and reading (bands: 95% Wilson).",
    "margins.png": "Distribution of the margins bound - κ(M) per model and reading "
                   "(0 = bound tight).",
    "baseline.png": "Random row-stochastic matrices: holding rate against n, with the models' "
                    "median n marked.",
    "training.png": "Tightness over training: holding rate at each checkpoint per model and "
                    "reading (mean over seeds, 95% interval: t across seeds, or over inputs with "
                    "one seed; dots: each seed), beside the random-init control's band and the "
                    "size-matched nulls' band.",
}


def weights_label(tree: xr.DataTree, name: str) -> str:
    """What a model's weights are, for a figure's legend: `pretrained model`, `trained model`
    (trained by the project: FT-Transformers, the digits ViT), `random weights` (a preset
    built without weights, such as the tiny encoders) or `random-init control`; from the spec
    its group
    records (`fingerprint_inputs`); `model` when it records none."""
    spec = dict(dict(tree[name].attrs.get("fingerprint_inputs", {})).get("model", {}))
    if not spec:
        return "model"
    if spec.get("random_init"):
        return "random-init control"
    if spec.get("family") in TRAINED_FAMILIES:  # FT-Transformers, the digits ViT
        return "trained model"
    return "pretrained model" if spec.get("pretrained", True) else "random weights (untrained)"


@matplotlib.rc_context(PLAIN_TEXT)
def report_figures(tree: xr.DataTree, report: Report) -> dict[str, Figure]:
    """The figures by file name: depth.png, margins.png, baseline.png when the store has a
    baseline, training.png when a model was swept over its checkpoints (captions in
    `CAPTIONS`)."""
    tol = report.tol if report.tol is not None else report.sweep_tol
    labels = {name: weights_label(tree, name) for name in model_names(tree)}
    figures = {"depth.png": depth_figure(report, labels),
               "margins.png": margin_figure(tree, tol)}
    if not report.baseline.empty:
        figures["baseline.png"] = baseline_figure(report)
    if report.trajectory is not None:
        figures["training.png"] = trajectory_figure(report)
    return figures


@matplotlib.rc_context(PLAIN_TEXT)
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


def panels(models: list[str]) -> list[tuple[str, str | None]]:
    """(model, its random-init control or None) for each model that gets panels of its own: every
    model but the controls whose model is in `models` (those are drawn in their model's panel)."""
    controls = dict(control_pairs(models))
    drawn = set(controls.values())
    return [(name, controls.get(name)) for name in models if name not in drawn]


def _grid(rows: int, columns: int, width: float, height: float) -> tuple[Figure, np.ndarray]:
    figure = Figure(figsize=(width * columns, height * rows + 0.9), layout="constrained")
    return figure, figure.subplots(rows, columns, squeeze=False, sharex=True, sharey=True)


def _legend_below(figure: Figure, axes: np.ndarray) -> None:
    """One legend for the whole figure, below the panels (never over the data)."""
    handles: dict[str, object] = {}
    for ax in axes.ravel():
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    if handles:
        figure.legend(list(handles.values()), list(handles), loc="outside lower center",
                      ncols=min(3, len(handles)), fontsize=8)


def _rate_line(ax, rows, colour: str, label: str, style: str = "-") -> None:
    """Holding rate against relative depth with its 95% Wilson band (an error bar at one layer)."""
    rows = rows[rows["cells"] > 0].sort_values("relative_depth")
    if rows.empty:
        return
    x, rate = rows["relative_depth"].to_numpy(), rows["rate"].to_numpy()
    low, high = rows["ci_low"].to_numpy(), rows["ci_high"].to_numpy()
    ax.plot(x, rate, style, marker="o", ms=3, color=colour, label=label)
    if len(x) == 1:
        ax.errorbar(x, rate, yerr=[rate - low, high - rate], color=colour, capsize=3)
    ax.fill_between(x, low, high, color=colour, alpha=0.18, linewidth=0)


@matplotlib.rc_context(PLAIN_TEXT)
def depth_figure(report: Report, labels: dict[str, str] | None = None) -> Figure:
    """One panel per model and token set: the model's holding rate against relative depth, its
    random-init control's in the same panel, and the band of each of its size-matched nulls
    (95% Wilson: the null's rate at the model's own matrix sizes, the same at every depth); a
    panel without null bands says so. `labels`: each model's legend label (`weights_label`;
    default "trained model")."""
    labels = labels or {}
    rates = report.rates
    models = list(dict.fromkeys(rates["model"]))
    shown = panels(models) or [("(no results)", None)]
    token_sets = list(dict.fromkeys(rates["token_set"])) or ["all"]
    figure, axes = _grid(len(shown), len(token_sets), 4.3, 2.9)
    nulls = report.nulls if report.nulls is not None else None
    for r, (model, control) in enumerate(shown):
        for c, token_set in enumerate(token_sets):
            ax = axes[r, c]
            mine = rates[(rates["model"] == model) & (rates["token_set"] == token_set)]
            here = None
            if nulls is not None:
                here = nulls[(nulls["model"] == model) & (nulls["token_set"] == token_set)
                             & (nulls["trials"] > 0)]
            if (here is None or here.empty) and not mine.empty:
                ax.text(0.02, 0.03, "no null bands: no size-matched nulls for this model "
                        "(matched_nulls:)", transform=ax.transAxes, fontsize=6.5,
                        color="dimgray", va="bottom")
            if here is not None:
                for k, record in enumerate(here.to_dict("records")):
                    colour = NULL_COLOURS[k % len(NULL_COLOURS)]
                    ax.axhspan(record["ci_low"], record["ci_high"], color=colour, alpha=0.22,
                               linewidth=0, label=f"size-matched null: {record['null']}")
                    ax.axhline(record["rate"], color=colour, linewidth=0.8, linestyle=":")
            _rate_line(ax, mine, "tab:blue", labels.get(model, "trained model"))
            if control is not None:
                theirs = rates[(rates["model"] == control) & (rates["token_set"] == token_set)]
                _rate_line(ax, theirs, "tab:orange", "random-init control", "--")
            inputs = int(mine["inputs"].max()) if len(mine) else 0
            ax.set_title(f"{model} · {TOKEN_SET_LABELS.get(token_set, token_set)}\n"
                         f"(up to {inputs} inputs per layer)", fontsize=8)
            if mine.empty:
                ax.text(0.5, 0.5, "not tested on this token set", transform=ax.transAxes,
                        ha="center", va="center", color="gray", fontsize=8)
            ax.set_xlim(-0.03, 1.03)
            ax.set_ylim(-0.03, 1.03)
            ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("relative depth (0 = first layer, 1 = last)")
    for ax in axes[:, 0]:
        ax.set_ylabel("share tight")
    _legend_below(figure, axes)
    verdicts = "stored verdicts" if report.tol is None else f"margin ≤ {report.tol:g}"
    figure.suptitle(f"Tightness of the layerwise bound by depth, beside the random-init control "
                    f"and size-matched nulls ({verdicts}; bands: 95% Wilson)", fontsize=10)
    return figure


@matplotlib.rc_context(PLAIN_TEXT)
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


@matplotlib.rc_context(PLAIN_TEXT)
def margin_figure(tree: xr.DataTree, tol: float | None = None) -> Figure:
    """One panel per model and token set: the ECDF of log10 margins (bound - κ(M)) of the model
    and of its random-init control; at the tolerance line it reads the share tight."""
    models = model_names(tree)
    shown = panels(models) or [("(no results)", None)]
    token_sets = list(dict.fromkeys(
        str(t) for name in models for t in tree[name]["token_set"].values)) or ["all"]
    figure, axes = _grid(len(shown), len(token_sets), 4.3, 2.7)
    for r, (model, control) in enumerate(shown):
        for c, token_set in enumerate(token_sets):
            ax = axes[r, c]
            for name, colour, style, label in ((model, "tab:blue", "-",
                                                weights_label(tree, model)
                                                if model in models else "trained model"),
                                               (control, "tab:orange", "--",
                                                "random-init control")):
                logged = _log_margins(tree, name, token_set)
                if logged is None or not logged.size:
                    continue
                x = np.sort(logged)
                ax.step(np.r_[x[0], x], np.r_[0.0, np.arange(1, x.size + 1) / x.size],
                        where="post", color=colour, linestyle=style, label=label)
            if tol:
                ax.axvline(math.log10(tol), color="black", linestyle=":", linewidth=1,
                           label=f"tolerance {tol:g}")
            ax.set_title(f"{model} · {TOKEN_SET_LABELS.get(token_set, token_set)}", fontsize=8)
            ax.set_xlim(math.log10(MARGIN_FLOOR) - 0.5, 0.2)
            ax.set_ylim(-0.02, 1.02)
            ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel(f"log10 margin (≤ {MARGIN_FLOOR:g} and 0 at the left)")
    for ax in axes[:, 0]:
        ax.set_ylabel("share of pairs ≤ x")
    _legend_below(figure, axes)
    figure.suptitle("Margins bound − κ(M), as ECDFs: model beside its random-init control "
                    "(0 = bound tight)", fontsize=10)
    return figure


def _log_margins(tree: xr.DataTree, name: str | None, token_set: str) -> np.ndarray | None:
    """log10 of the model's margins with a verdict on `token_set`, clipped to [MARGIN_FLOOR, 1];
    None when there is no such model or token set."""
    if name not in tree.children or token_set not in tree[name]["token_set"].values:
        return None
    cell = tree[name].to_dataset().sel(token_set=token_set)
    margin = cell["margin"].where(ok(cell)).values.ravel()
    margin = margin[np.isfinite(margin)]
    return np.log10(np.clip(margin, MARGIN_FLOOR, 1.0))


TRAJECTORY_COLOURS = ("tab:blue", "tab:red", "tab:green", "tab:purple", "tab:brown")


@matplotlib.rc_context(PLAIN_TEXT)
def trajectory_figure(report: Report) -> Figure:
    """Rate against checkpoint (evenly spaced, in order), one panel per reading, every
    trajectory (model: e.g. one per training objective) in a colour of its own: the mean with its
    interval and each seed's rate; the size-matched nulls' band (grey: the lowest to the highest
    null rate of every trajectory)."""
    table = report.trajectory
    token_sets = list(dict.fromkeys(table["token_set"]))
    models = list(dict.fromkeys(table["model"]))
    figure, axes = _grid(len(token_sets), 1, 7.0, 3.2)
    for ax, token_set in zip(axes[:, 0], token_sets, strict=True):
        mine = table[table["token_set"] == token_set]
        labels = list(dict.fromkeys(mine["checkpoint"]))
        bands = mine.groupby("checkpoint", sort=False)
        ax.fill_between(np.arange(len(labels)), bands["null_low"].min().reindex(labels),
                        bands["null_high"].max().reindex(labels), color="tab:gray", alpha=0.3,
                        label="size-matched nulls (lowest to highest rate)")
        for i, model in enumerate(models):
            colour = TRAJECTORY_COLOURS[i % len(TRAJECTORY_COLOURS)]
            rows = mine[mine["model"] == model]
            x = np.array([labels.index(c) for c in rows["checkpoint"]], dtype=float)
            x += 0.12 * (models.index(model) - (len(models) - 1) / 2)  # side by side
            low, high = rows["ci_low"].to_numpy(), rows["ci_high"].to_numpy()
            mean = rows["rate_mean"].to_numpy()
            ax.errorbar(x, mean, yerr=[np.clip(mean - low, 0, None),
                                       np.clip(high - mean, 0, None)],
                        color=colour, marker="o", capsize=3, label=f"{model} (mean, 95% CI)")
            for k, seeds in zip(x, rows["rates"], strict=True):
                values = [v for v in seeds if v is not None]
                ax.scatter([k] * len(values), values, s=6, color=colour, alpha=0.5, zorder=3)
        ax.set_xticks(np.arange(len(labels)), [c.replace("epoch ", "") for c in labels])
        ax.set_xlabel("checkpoint (epoch)")
        ax.set_ylim(-0.02, 1.02)
        ax.set_ylabel("holding rate")
        ax.set_title(TOKEN_SET_LABELS.get(token_set, token_set), fontsize=10)
    _legend_below(figure, axes)
    return figure

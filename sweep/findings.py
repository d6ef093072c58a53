"""Findings computed from the report's own tables: only what their intervals support.

Each finding is a record {model, token_set, kind, estimate, ci_low, ci_high, text, ci_method}
(ci_method: what made its interval); the rules:

- `vs_control` (controls table: difference trained - control, its 95% interval),
  `vs_null:<null>` (nulls table: the lift observed - null) and `seeds_vs_control` (seeds table:
  the mean difference over seeds, its between-seed t interval): *tighter* when the interval lies
  above 0, *looser* when below 0, *indistinguishable* when it includes 0 (or touches it).
- `failures_by_layer` (per-layer table; layers counted from 0, as the report counts them): the
  failures (pairs with a verdict that do not hold) of each layer, and the share of them in the
  layer with the most (95% Wilson interval). Failures *concentrate* in that layer only when the
  interval's lower end is above the layer's share of the tested pairs (its share if failures
  fell evenly); otherwise no layer is singled out. Groups with one layer or no failure: counts
  only.
- `per_head_vs_head_mean` (a model that kept every head beside the same model head-averaged, on
  the same inputs): the per-head rate minus the head-mean rate, Newcombe's interval from the two
  Wilson intervals, with both rates in the text.

Pure: tables in, records out (`sweep.report` passes its tables and `head_pairs`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence

import pandas as pd
import xarray as xr

from storage.query import model_names
from storage.statistics import wilson_interval
from sweep.report_controls import newcombe_interval

COLUMNS = ["model", "token_set", "kind", "estimate", "ci_low", "ci_high", "text", "ci_method"]
VERDICTS = {1: "tighter than", -1: "looser than", 0: "indistinguishable from"}


def side(low: float, high: float) -> int:
    """+1 when the interval [low, high] lies above 0, -1 below 0, 0 when it includes 0."""
    return 1 if low > 0 else -1 if high < 0 else 0


def compare(model: str, token_set: str, kind: str, estimate: float, low: float, high: float,
            other: str, note: str = "", ci_method: str = "wilson") -> dict | None:
    """A comparison finding: `model` tighter than / looser than / indistinguishable from
    `other`, by where the interval of the difference lies; None when it is undefined (NaN)."""
    if not all(math.isfinite(v) for v in (estimate, low, high)):
        return None
    verdict = side(low, high)
    text = (f"{model} ({token_set}): {VERDICTS[verdict]} {other}: {_points(estimate)} "
            f"[{_points(low)}, {_points(high)}]{note}"
            + ("" if verdict else " (the interval includes 0)"))
    return {"model": model, "token_set": token_set, "kind": kind, "estimate": estimate,
            "ci_low": low, "ci_high": high, "text": text, "ci_method": ci_method}


def control_findings(controls: pd.DataFrame, ci_method: str = "wilson") -> list[dict]:
    """`vs_control` from the controls table (difference, ci_low, ci_high per model, set), whose
    intervals `ci_method` made."""
    return [compare(r["model"], r["token_set"], "vs_control", r["difference"], r["ci_low"],
                    r["ci_high"], f"its control {r['control']}", ci_method=ci_method)
            for r in controls.to_dict("records")]


def null_findings(nulls: pd.DataFrame | None, ci_method: str = "wilson") -> list[dict]:
    """`vs_null:<null>` from the nulls table (lift, lift_ci_low, lift_ci_high per model, set,
    null), whose intervals `ci_method` made."""
    if nulls is None:
        return []
    return [compare(r["model"], r["token_set"], f"vs_null:{r['null']}", r["lift"],
                    r["lift_ci_low"], r["lift_ci_high"], f"the size-matched {r['null']} null",
                    ci_method=ci_method)
            for r in nulls.to_dict("records")]


def seed_findings(seeds: pd.DataFrame | None) -> list[dict]:
    """`seeds_vs_control` from the seeds table (mean trained - control difference over seeds,
    its between-seed t interval)."""
    if seeds is None:
        return []
    return [compare(r["model"], r["token_set"], "seeds_vs_control", r["difference_mean"],
                    r["difference_ci_low"], r["difference_ci_high"],
                    "its controls across seeds", f" (mean over {r['n_seeds']} seeds)",
                    ci_method="t-over-seeds")
            for r in seeds.to_dict("records")]


def depth_findings(rates: pd.DataFrame) -> list[dict]:
    """`failures_by_layer` per model and token set from the per-layer table (model, layer,
    token_set, inputs, holding)."""
    out = []
    for (model, token_set), group in rates.groupby(["model", "token_set"], sort=False):
        group = group.sort_values("layer")
        layers = [int(v) for v in group["layer"]]
        failures = [int(n) - int(k) for n, k in zip(group["inputs"], group["holding"],
                                                   strict=True)]
        tested, total = [int(n) for n in group["inputs"]], sum(failures)
        counts = ", ".join(f"layer {layer}: {f}" for layer, f in zip(layers, failures,
                                                                      strict=True))
        if total == 0 or len(layers) < 2:
            continue
        top = max(range(len(layers)), key=lambda i: failures[i])  # the first of equal counts
        share = failures[top] / total
        low, high = wilson_interval(failures[top], total)
        even = tested[top] / sum(tested)
        where = (f"they concentrate in layer {layers[top]}: {failures[top]} of {total} "
                 f"({_percent(share)} [{_percent(low)}, {_percent(high)}]), above its "
                 f"{_percent(even)} share of the tested pairs" if low > even else
                 f"no layer is singled out: the most, layer {layers[top]}, holds {failures[top]} "
                 f"of {total} ({_percent(share)} [{_percent(low)}, {_percent(high)}]), "
                 f"against its {_percent(even)} share of the tested pairs")
        out.append({"model": model, "token_set": token_set, "kind": "failures_by_layer",
                    "estimate": share, "ci_low": low, "ci_high": high, "ci_method": "wilson",
                    "text": f"{model} ({token_set}): failures by layer (from 0) {counts}; "
                            f"{where}"})
    return out


def head_findings(summary: pd.DataFrame, pairs: Iterable[tuple[str, str]]) -> list[dict]:
    """`per_head_vs_head_mean` for each (head-mean model, per-head model) pair, per token set,
    from the headline table (model, token_set, holding, inputs, rate, ci_low, ci_high)."""
    pairs = list(pairs)
    if not pairs:
        return []
    by_key = {(r["model"], r["token_set"]): r for r in summary.to_dict("records")}
    out = []
    for mean_model, each_model in pairs:
        for token_set in dict.fromkeys(summary.loc[summary["model"] == each_model, "token_set"]):
            each, mean = by_key.get((each_model, token_set)), by_key.get((mean_model, token_set))
            if mean is None or not (each["inputs"] and mean["inputs"]):
                continue
            low, high = newcombe_interval(each["rate"], (each["ci_low"], each["ci_high"]),
                                          mean["rate"], (mean["ci_low"], mean["ci_high"]))
            note = (f" (per head {_percent(each['rate'])}, {each['holding']}/{each['inputs']} "
                    f"input-layer-head cells; head mean {_percent(mean['rate'])}, "
                    f"{mean['holding']}/{mean['inputs']} input-layer pairs)")
            out.append(compare(each_model, token_set, "per_head_vs_head_mean",
                               each["rate"] - mean["rate"], low, high,
                               f"the head-mean rate of {mean_model}", note,
                               ci_method="newcombe"))
    return out


def build_findings(summary: pd.DataFrame, rates: pd.DataFrame, controls: pd.DataFrame,
                   nulls: pd.DataFrame | None = None, seeds: pd.DataFrame | None = None,
                   head_pairs: Sequence[tuple[str, str]] = (),
                   ci_method: str = "wilson") -> pd.DataFrame:
    """Every finding the report's tables support, as a table of `COLUMNS`: per model, its
    controls, nulls, seeds, depth and heads findings, in that order. `ci_method`: what made the
    controls' and nulls' intervals (the report's); each record names its own."""
    records = [r for r in (*control_findings(controls, ci_method), *seed_findings(seeds),
                           *null_findings(nulls, ci_method), *depth_findings(rates),
                           *head_findings(summary, head_pairs)) if r is not None]
    order = {name: i for i, name in enumerate(dict.fromkeys(summary["model"]))}
    for name, i in list(order.items()):  # a replicated model: after its replicates' findings
        base = name.split("@seed")[0]
        if base != name:
            order[base] = max(order.get(base, i), i + 0.5)
    records.sort(key=lambda r: order.get(r["model"], len(order)))  # stable: rules keep order
    return pd.DataFrame(records, columns=COLUMNS)


def head_pairs(tree: xr.DataTree) -> list[tuple[str, str]]:
    """(head-mean model, per-head model) pairs of `tree`: models whose fingerprint inputs are the
    same but for the spec's `heads` (same source, options, dataset and inputs)."""
    def key(name: str) -> str:
        inputs = dict(tree[name].attrs.get("fingerprint_inputs", {}))
        spec = {k: v for k, v in dict(inputs.get("model", {})).items() if k != "heads"}
        return json.dumps({**inputs, "model": spec}, sort_keys=True)

    names = model_names(tree)
    each = [n for n in names if tree[n].sizes.get("head", 1) > 1]
    means = {key(n): n for n in names if n not in each and "fingerprint_inputs" in tree[n].attrs}
    return [(means[key(n)], n) for n in each if key(n) in means]


def markdown_section(findings: pd.DataFrame) -> list[str]:
    """The Findings section: how the rules read, then one line per finding."""
    out = ["## Findings", "",
           "Computed from the intervals above (sweep.findings): tighter / looser only where the "
           "95% interval excludes 0, indistinguishable where it includes 0; failures by layer in "
           "counts (layers from 0), said to concentrate only where the share's interval lies "
           "above the layer's share of the tested pairs.", ""]
    if findings.empty:
        return [*out, "(no findings: no controls, nulls, seeds, multi-layer failures or kept "
                "heads in this store)", ""]
    return [*out, *(f"- {text}" for text in findings["text"]), ""]


def _percent(value: float) -> str:
    return f"{100 * value:.1f}%"


def _points(value: float) -> str:
    return f"{100 * value:+.1f} pp"

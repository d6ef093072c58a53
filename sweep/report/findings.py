"""Findings computed from the report's own tables: only what their intervals support.

Each finding is a record {model, token_set, kind, estimate, ci_low, ci_high, text, ci_method}
(ci_method: what made its interval); the rules:

- `vs_control` (controls table: difference trained - control, its 95% interval; one
  comparison per model and token set, not corrected): *tighter* when the interval lies above 0,
  *looser* when below 0, *indistinguishable* when it includes 0 (or touches it).
- `vs_null:<null>` (nulls table: the lift observed - null): the same words, read on the lift's
  interval at the Bonferroni level over the model's `comparisons` (every null on every token
  set: `lift_sim_low`/`lift_sim_high`, so that a model's null findings hold together at 95%;
  `sweep.report.nulls`); ci_method `<method>-bonferroni`.
- `seeds_vs_control` (seeds table: the mean trained - control difference over a model's seeds,
  its t interval with k - 1 degrees of freedom): *tighter* / *looser* as above; an interval
  that includes 0 is *not resolved across seeds* and says "low power" (k seeds leave k - 1
  degrees of freedom: t(0.975, 2) = 4.30 at k = 3), never that the effect is absent; the text
  also counts the single seeds' own (paired) intervals above and below 0 (controls table).
- `seeds_pooled_vs_control` (seeds table, when more than one model has seed replicates): the
  mean of every replicate's trained - control difference over all those models, per token set,
  with its t interval over the runs (each training run one draw; the runs' tables differ, so
  the figure is the mean over them, not any one table's); *not resolved* / low power as above.
- `failures_by_layer` (per-layer table; layers counted from 0, as the report counts them): the
  failures (pairs with a verdict that do not hold) of each layer, and each layer's share of them
  with a Wilson interval at the Bonferroni level for L layers (the L intervals hold together at
  95%). Failures *concentrate* in every layer whose interval's lower end is above its share of
  the tested pairs (its share if failures fell evenly); otherwise no layer is singled out, and
  the layer with the most is shown. The failing cells of one input count as independent draws
  (the table holds counts, not inputs). Groups with one layer or no failure: none.
- `per_head_vs_head_mean` (a model that kept every head beside the same model head-averaged, on
  the same inputs): the per-head rate minus the head-mean rate, with both rates in the text; its
  interval is the paired bootstrap over the shared inputs (`--ci bootstrap`, like trained -
  control) or Newcombe's from the two Wilson intervals (`--ci wilson`).

Pure: tables in, records out (`sweep.report` passes its tables and `head_pairs`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence

import pandas as pd
import xarray as xr

from storage.query.results import model_names
from storage.query.statistics import wilson_interval
from sweep.config.checkpoints import CHECKPOINT_NAME
from sweep.config.seeds import SEED_NAME
from sweep.report.controls import newcombe_interval
from sweep.report.nulls import simultaneous_level, simultaneous_z
from sweep.report.seeds import t_interval
from sweep.report.training import FINDING_KINDS as OVER_TRAINING  # named by trajectory

COLUMNS = ["model", "token_set", "kind", "estimate", "ci_low", "ci_high", "text", "ci_method"]
VERDICTS = {1: "tighter than", -1: "looser than", 0: "indistinguishable from"}


def side(low: float, high: float) -> int:
    """+1 when the interval [low, high] lies above 0, -1 below 0, 0 when it includes 0."""
    return 1 if low > 0 else -1 if high < 0 else 0


def compare(model: str, token_set: str, kind: str, estimate: float, low: float, high: float,
            other: str, note: str = "", ci_method: str = "wilson",
            undecided: str = "") -> dict | None:
    """A comparison finding: `model` tighter than / looser than / indistinguishable from
    `other`, by where the interval of the difference lies; None when it is undefined (NaN).
    `undecided`: what replaces "indistinguishable from" and its note when the interval
    includes 0 (the seeds' "not resolved ... (low power)")."""
    if not all(math.isfinite(v) for v in (estimate, low, high)):
        return None
    verdict = side(low, high)
    if verdict == 0 and undecided:
        text = (f"{model} ({token_set}): {undecided} {other}: {_points(estimate)} "
                f"[{_points(low)}, {_points(high)}]{note}")
    else:
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
    """`vs_null:<null>` from the nulls table (lift, and lift_sim_low, lift_sim_high: its
    interval at the Bonferroni level over the model's `comparisons`, made by `ci_method`, per
    model, set, null): a model's null findings hold together at 95%."""
    if nulls is None:
        return []
    out = []
    for r in nulls.to_dict("records"):
        m = int(r["comparisons"])
        note = (f" (Bonferroni over {r['model']}'s {m} null comparisons: each interval at "
                f"{_level(simultaneous_level(m))})") if m > 1 else ""
        out.append(compare(r["model"], r["token_set"], f"vs_null:{r['null']}", r["lift"],
                           r["lift_sim_low"], r["lift_sim_high"],
                           f"the size-matched {r['null']} null", note,
                           ci_method=f"{ci_method}-bonferroni"))
    return out


LOW_POWER = "not resolved against"


def _seed_counts(controls: pd.DataFrame | None, model: str, token_set: str) -> str:
    """`; single seeds: a of k paired intervals above 0, b below` from the controls table rows
    of `model`'s replicates on `token_set` ("" when the table has none)."""
    if controls is None or controls.empty:
        return ""
    rows = [r for r in controls.to_dict("records") if r["token_set"] == token_set
            and (match := SEED_NAME.match(str(r["model"]))) and match["model"] == model
            and math.isfinite(r["ci_low"]) and math.isfinite(r["ci_high"])]
    if not rows:
        return ""
    above = sum(r["ci_low"] > 0 for r in rows)
    below = sum(r["ci_high"] < 0 for r in rows)
    return (f"; single seeds: {above} of {len(rows)} intervals above 0, {below} below "
            f"(each seed against its own control)")


def _low_power_note(k: int) -> str:
    return (f" (mean over {k} seeds, t interval with {k - 1} degrees of freedom; it includes 0: "
            f"low power, not evidence that training has no effect)")


def seed_findings(seeds: pd.DataFrame | None,
                  controls: pd.DataFrame | None = None) -> list[dict]:
    """`seeds_vs_control` from the seeds table (mean trained - control difference over seeds,
    its t interval over them), with the single seeds' intervals counted from `controls`."""
    if seeds is None:
        return []
    out = []
    for r in seeds.to_dict("records"):
        k = sum(d is not None for d in r["differences"] or [])
        counts = _seed_counts(controls, r["model"], r["token_set"])
        low, high = r["difference_ci_low"], r["difference_ci_high"]
        decided = math.isfinite(low) and math.isfinite(high) and side(low, high) != 0
        note = (f" (mean over {k} seeds, t interval with {k - 1} degrees of freedom)"
                if decided else _low_power_note(k))
        out.append(compare(r["model"], r["token_set"], "seeds_vs_control",
                           r["difference_mean"], low, high, "its controls across seeds",
                           note + counts, ci_method="t-over-seeds",
                           undecided=LOW_POWER))
    return out


def pooled_seed_findings(seeds: pd.DataFrame | None) -> list[dict]:
    """`seeds_pooled_vs_control`, per token set, when more than one model has seed replicates
    with controls: the mean of all their runs' trained - control differences, its t interval
    over the runs."""
    if seeds is None or seeds.empty:
        return []
    out = []
    for token_set, group in seeds.groupby("token_set", sort=False):
        runs = {r["model"]: [d for d in (r["differences"] or []) if d is not None
                             and math.isfinite(d)] for r in group.to_dict("records")}
        runs = {model: values for model, values in runs.items() if values}
        if len(runs) < 2:
            continue
        values = [d for v in runs.values() for d in v]
        mean, low, high = t_interval(values)
        name = " + ".join(runs)
        decided = math.isfinite(low) and side(low, high) != 0
        k = len(values)
        note = (f" (mean over {k} training runs: "
                + ", ".join(f"{model} {len(v)}" for model, v in runs.items())
                + f"; t interval with {k - 1} degrees of freedom, each run one draw against its "
                f"own control; the tables differ, so this is their average, not any one's"
                + (")" if decided else "; it includes 0: low power, not evidence that training "
                   "has no effect)"))
        out.append(compare(name, str(token_set), "seeds_pooled_vs_control", mean, low, high,
                           "their controls, pooled over seeds and tables", note,
                           ci_method="t-over-runs", undecided=LOW_POWER))
    return out


def depth_findings(rates: pd.DataFrame) -> list[dict]:
    """`failures_by_layer` per model and token set from the per-layer table (model, layer,
    token_set, cells, holding): every layer whose share of the failures has a simultaneous
    95% Wilson interval above its share of the tested pairs concentrates them."""
    out = []
    for (model, token_set), group in rates.groupby(["model", "token_set"], sort=False):
        group = group.sort_values("layer")
        layers = [int(v) for v in group["layer"]]
        failures = [int(n) - int(k) for n, k in zip(group["cells"], group["holding"],
                                                   strict=True)]
        tested, total = [int(n) for n in group["cells"]], sum(failures)
        counts = ", ".join(f"layer {layer}: {f}" for layer, f in zip(layers, failures,
                                                                      strict=True))
        if total == 0 or len(layers) < 2:
            continue
        z = simultaneous_z(len(layers))
        intervals = [wilson_interval(f, total, z) for f in failures]
        evens = [n / sum(tested) for n in tested]
        above = [i for i in range(len(layers)) if intervals[i][0] > evens[i]]
        top = max(range(len(layers)), key=lambda i: failures[i])  # the first of equal counts
        shares = [_share(f, total, interval) for f, interval in zip(failures, intervals,
                                                                     strict=True)]
        if above:
            where = "they concentrate in " + "; and in ".join(
                f"layer {layers[i]}: {shares[i]}, above its {_percent(evens[i])} share of the "
                f"tested pairs" for i in above)
        else:
            where = (f"no layer is singled out: the most, layer {layers[top]}, holds "
                     f"{shares[top]}, against its {_percent(evens[top])} share of the tested "
                     f"pairs")
        first = above[0] if above else top
        out.append({"model": model, "token_set": token_set, "kind": "failures_by_layer",
                    "estimate": failures[first] / total, "ci_low": intervals[first][0],
                    "ci_high": intervals[first][1], "ci_method": "wilson-bonferroni",
                    "text": f"{model} ({token_set}): failures by layer (from 0) {counts}; "
                            f"{where}"})
    return out


def head_findings(summary: pd.DataFrame, pairs: Iterable[tuple[str, str]],
                  intervals: dict[tuple[str, str, str], tuple[float, float]] | None = None,
                  ci_method: str = "bootstrap") -> list[dict]:
    """`per_head_vs_head_mean` for each (head-mean model, per-head model) pair, per token set,
    from the headline table (model, token_set, holding, cells, rate, ci_low, ci_high): the
    difference's interval from `intervals` ((per-head, head-mean, token set) -> ends, made by
    `ci_method`) where given, else Newcombe's from the table's two Wilson intervals."""
    pairs = list(pairs)
    if not pairs:
        return []
    by_key = {(r["model"], r["token_set"]): r for r in summary.to_dict("records")}
    out = []
    for mean_model, each_model in pairs:
        for token_set in dict.fromkeys(summary.loc[summary["model"] == each_model, "token_set"]):
            each, mean = by_key.get((each_model, token_set)), by_key.get((mean_model, token_set))
            if mean is None or not (each["cells"] and mean["cells"]):
                continue
            if intervals is None:
                method = "newcombe"
                low, high = newcombe_interval(each["rate"], (each["ci_low"], each["ci_high"]),
                                              mean["rate"], (mean["ci_low"], mean["ci_high"]))
            else:
                method = ci_method
                low, high = intervals.get((each_model, mean_model, token_set),
                                          (math.nan, math.nan))
            note = (f" (per head {_percent(each['rate'])}, {each['holding']}/{each['cells']} "
                    f"input-layer-head cells; head mean {_percent(mean['rate'])}, "
                    f"{mean['holding']}/{mean['cells']} input-layer pairs)")
            out.append(compare(each_model, token_set, "per_head_vs_head_mean",
                               each["rate"] - mean["rate"], low, high,
                               f"the head-mean rate of {mean_model}", note,
                               ci_method=method))
    return out


def build_findings(summary: pd.DataFrame, rates: pd.DataFrame, controls: pd.DataFrame,
                   nulls: pd.DataFrame | None = None, seeds: pd.DataFrame | None = None,
                   head_pairs: Sequence[tuple[str, str]] = (),
                   ci_method: str = "wilson",
                   head_intervals: dict[tuple[str, str, str], tuple[float, float]] | None = None,
                   ) -> pd.DataFrame:
    """Every finding the report's tables support, as a table of `COLUMNS`: per model, its
    controls, nulls, seeds, depth and heads findings, in that order. `ci_method`: what made the
    controls', nulls' and `head_intervals`' intervals (the report's; without `head_intervals`
    the heads' come from Newcombe on the summary's Wilson intervals); each record names its
    own."""
    records = [r for r in (*control_findings(controls, ci_method),
                           *seed_findings(seeds, controls), *pooled_seed_findings(seeds),
                           *null_findings(nulls, ci_method), *depth_findings(rates),
                           *head_findings(summary, head_pairs, head_intervals, ci_method))
               if r is not None]
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


HEADLINE_LIMIT = 10
HEADLINE_ORDER = ("vs_control", "seeds_pooled_vs_control", "seeds_vs_control",
                  "over_training_vs_control", "over_training_vs_nulls", "vs_null",
                  "per_head_vs_head_mean", "failures_by_layer")
"""The kinds a headline draws from, most telling first (see `headline`): the separations (from
the controls, across seeds, over training, from the nulls, per head) before the per-layer
failure lists."""


def trajectory_of(model: str) -> str:
    """The trajectory a model belongs to, as its over-training findings name it:
    `vit@seed0@epoch5` and `vit@seed0` -> `vit`; a name with neither suffix unchanged."""
    checkpoint = CHECKPOINT_NAME.match(model)
    base = checkpoint["model"] if checkpoint else model
    seeded = SEED_NAME.match(base)
    return seeded["model"] if seeded else base


def headline(findings: pd.DataFrame, limit: int = HEADLINE_LIMIT) -> pd.DataFrame:
    """At most `limit` findings to read first, ranked by HEADLINE_ORDER (then in the report's
    order): a model against its control, the findings across seeds, over training and against
    the nulls (each model's *weakest* null per token set: the smallest lift, what holds against
    every null), the per-head comparisons, then failures that concentrate in a layer. Left to
    the full list: random-init controls' own comparisons; a seed replicate's comparisons where
    its seeds have a finding (it says more; with one seed the replicate's own stay); the null
    comparisons and failures of a model swept over its checkpoints (its checkpoints and the
    trained model itself) where its trajectory has findings over training (they say it per
    checkpoint). Rows are the findings' own, unchanged."""
    if findings.empty:
        return findings
    rows = findings.reset_index(drop=True)
    kinds = rows["kind"].str.split(":").str[0]
    control = rows["model"].str.endswith("@random-init")
    across_seeds = {(m, t) for m, t, k in zip(rows["model"], rows["token_set"], kinds,
                                              strict=True) if k == "seeds_vs_control"}
    replicate = pd.Series([(match["model"], t) in across_seeds if (match := SEED_NAME.match(m))
                           else False for m, t in zip(rows["model"], rows["token_set"],
                                                      strict=True)], index=rows.index)
    trajectories = set(rows.loc[kinds.isin(OVER_TRAINING), "model"])
    swept = pd.Series([m not in trajectories and trajectory_of(m) in trajectories
                       for m in rows["model"]], index=rows.index)
    keep = kinds.isin(HEADLINE_ORDER) & ~control
    keep &= ~((kinds == "vs_control") | (kinds == "vs_null")) | ~replicate
    keep &= ~((kinds == "vs_null") | (kinds == "failures_by_layer")) | ~swept
    keep &= (kinds != "failures_by_layer") | rows["text"].str.contains("they concentrate in")
    chosen = rows[keep].assign(_kind=kinds[keep])
    nulls = chosen[chosen["_kind"] == "vs_null"]
    weakest = nulls.loc[nulls.groupby(["model", "token_set"], sort=False)["estimate"].idxmin()]
    chosen = chosen[chosen["_kind"] != "vs_null"]
    chosen = pd.concat([chosen, weakest.assign(_kind="vs_null")])
    rank = chosen["_kind"].map({kind: i for i, kind in enumerate(HEADLINE_ORDER)})
    chosen = chosen.assign(_rank=rank, _at=chosen.index).sort_values(["_rank", "_at"])
    return chosen.drop(columns=["_kind", "_rank", "_at"]).head(limit)


def headline_section(findings: pd.DataFrame | None) -> list[str]:
    """The report's first section: the `headline` findings, and where the others are."""
    if findings is None or findings.empty:
        return []
    top = headline(findings)
    if top.empty:
        return []
    return ["## Headline findings", "",
            f"The {len(top)} findings to read first, of {len(findings)} (each model against its "
            "control, across seeds, over training, against its weakest size-matched null, "
            "then failures that concentrate in a layer); every finding, with how they are "
            "computed, ends the report.", "", *(f"- {text}" for text in top["text"]), ""]


def markdown_section(findings: pd.DataFrame) -> list[str]:
    """The Findings section: how the rules read, then one line per finding."""
    out = ["## Findings", "",
           "Computed from the intervals above (sweep.report.findings): tighter / looser only where "
           "the "
           "95% interval excludes 0, indistinguishable where it includes 0; against the nulls, "
           "on intervals widened (Bonferroni) so that a model's comparisons with every null on "
           "every token set hold together at 95%; across training seeds, 'not resolved (low "
           "power)' where the t interval over the seeds includes 0, with the figure pooled over "
           "every replicated model's runs; failures by layer in counts (layers from 0), said to "
           "concentrate only where the share's interval (simultaneous over the layers) lies "
           "above the layer's share of the tested pairs.",
           ""]
    if findings.empty:
        return [*out, "(no findings: no controls, nulls, seeds, multi-layer failures or kept "
                "heads in this store)", ""]
    return [*out, *(f"- {text}" for text in findings["text"]), ""]


def _share(failures: int, total: int, interval: tuple[float, float]) -> str:
    return (f"{failures} of {total} ({_percent(failures / total)} "
            f"[{_percent(interval[0])}, {_percent(interval[1])}])")


def _percent(value: float) -> str:
    return f"{100 * value:.1f}%"


def _level(value: float) -> str:
    """A confidence level as a percentage without trailing zeros: 99.5%, 99.75%."""
    return f"{100 * value:.4f}".rstrip("0").rstrip(".") + "%"


def _points(value: float) -> str:
    return f"{100 * value:+.1f} pp"

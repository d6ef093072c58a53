"""The report's training sections: each trained model's record, as the store keeps it, and the
tightness over training (the rate at each checkpoint, `trajectory_table`) with its findings.

A model trained by the project (FT-Transformer) has its training record (`prepare_model`'s) in
its group's `training` attribute. `training_records` collects them (JSON: `training`, model name
-> record); `render_markdown` prints one row per model: the test and validation scores, where
early stopping kept the weights and what ended training, the split and the wall time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from storage.query.results import model_names
from sweep.config.checkpoints import CHECKPOINT_NAME, checkpoint_groups
from sweep.config.controls import control_name
from sweep.config.seeds import SEED_NAME
from sweep.report.seeds import t_interval

COLUMNS = ("model", "metric", "test", "val", "best epoch", "epochs run", "stopped by",
           "train/val/test rows", "params", "wall s")


def training_records(tree: xr.DataTree) -> dict[str, dict[str, Any]]:
    """Model name -> its training record, for the models of `tree` that have one (store order)."""
    records = {}
    for name in model_names(tree):
        record = tree[name].attrs.get("training")
        if record:
            records[name] = dict(record)
    return records


def shown_records(records: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """`records` less the checkpoint models (`<name>@epoch<k>`) whose trained model is there too:
    they share its one training run, so its row says it once."""
    return {name: r for name, r in records.items()
            if not ((m := CHECKPOINT_NAME.match(name)) and m["epoch"] is not None
                    and m["model"] in records)}


def render_markdown(records: dict[str, dict[str, Any]]) -> list[str]:
    """The training section's Markdown lines: a heading, a note and one row per trained model."""
    out = ["## 7. Training: models trained by the project", ""]
    records = shown_records(records)
    if not records:
        return [*out, "(no trained models)", ""]
    out += ["Test and validation scores of the kept weights (the epoch of lowest validation "
            "loss); `stopped by` says whether early stopping (patience) or the epoch cap ended "
            "training. Attention is measured on the rows named by each model's `split` option; "
            "a model's checkpoints (`<name>@epoch<k>`) share its row (one training run).",
            "", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for name, r in records.items():
        split = r.get("split", {})
        cells = [
            name, r.get("metric", "–"), _score(r.get("test_score")), _score(r.get("val_score")),
            r.get("best_epoch", "–"), r.get("epochs_run", "–"), r.get("stopped_by", "–"),
            "/".join(str(split.get(part, "–")) for part in ("train", "val", "test")),
            r.get("n_params", "–"), _score(r.get("wall_s"), "{:.1f}"),
        ]
        out.append("| " + " | ".join(str(c) for c in cells) + " |")
    return [*out, ""]


def _score(value: Any, form: str = "{:.4f}") -> str:
    return "–" if value is None else form.format(value)


# Tightness over training: a model's checkpoints (`sweep.config.checkpoints`), across its seeds.

TRAJECTORY_COLUMNS = [
    "model", "checkpoint", "epoch", "epochs", "token_set", "seeds", "rates", "input_ci_low",
    "input_ci_high", "rate_mean", "ci_low", "ci_high", "interval", "control_rate",
    "control_ci_low", "control_ci_high", "difference", "difference_ci_low", "difference_ci_high",
    "null_low", "null_high", "lift_low", "lift_low_ci_low", "lift_low_ci_high", "lift_high",
    "lift_high_ci_low", "lift_high_ci_high"]
"""One row per trajectory (a model, its seeds pooled), checkpoint and token set:

- `epoch`: the checkpoint's epoch (for `best`, when every seed's best epoch agrees; NaN else),
  `epochs`: each seed's;
- `rates` (per seed) with `input_ci_low`/`input_ci_high` (each seed's interval over its inputs:
  the headline's, Wilson or cluster bootstrap); `rate_mean` with `ci_low`/`ci_high`, across seeds
  (`interval` = "seeds": the 95% t interval of `sweep.report.seeds`) or, with one seed, the
  seed's own interval over inputs (`interval` = "inputs");
- `control_*`: the random-init controls (each seed's own), the same way; `difference` = trained -
  control: across seeds the t interval of the paired per-seed differences, with one seed the
  controls table's interval;
- `null_low`/`null_high`: the band of the size-matched nulls (the lowest and the highest null
  rate of every null and seed at this checkpoint); `lift_low` = rate - the highest null rate
  and `lift_high` = rate - the lowest, each with its interval (t across seeds, or the nulls
  table's Bonferroni interval with one seed): above every null when `lift_low`'s interval is
  above 0, below every null when `lift_high`'s is below 0.
"""


def trajectory_table(summary: pd.DataFrame, controls: pd.DataFrame,
                     nulls: pd.DataFrame | None,
                     records: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """The tightness-over-training rows (TRAJECTORY_COLUMNS) from the report's headline,
    controls and nulls tables and the training records (the best epoch of each seed)."""
    by_key = {(r["model"], r["token_set"]): r for r in summary.to_dict("records")}
    diff = {(r["model"], r["token_set"]): r for r in controls.to_dict("records")}
    null_rows: dict[tuple[str, str], list[dict]] = {}
    for r in ([] if nulls is None else nulls.to_dict("records")):
        null_rows.setdefault((r["model"], r["token_set"]), []).append(r)
    rows = [_trajectory_row(model, label, token_set, names, by_key, diff, null_rows, records)
            for model, label, names, token_sets in _checkpoints(summary)
            for token_set in token_sets]
    frame = pd.DataFrame(rows, columns=TRAJECTORY_COLUMNS)
    floats = [c for c in TRAJECTORY_COLUMNS if c.startswith(("rate_", "ci_", "control_",
                                                             "difference", "null_", "lift_"))]
    return frame.astype({c: np.float64 for c in floats})


def _checkpoints(frame: pd.DataFrame) -> Iterator[tuple[str, str, dict[Any, str], list[str]]]:
    """(trajectory, checkpoint label, seed -> model name, token sets) of every checkpoint of
    every trajectory among `frame`'s models, in order."""
    for model, seeds in _trajectories(dict.fromkeys(frame["model"])).items():
        members = [n for names in seeds.values() for n in names.values()]
        token_sets = list(dict.fromkeys(frame.loc[frame["model"].isin(members), "token_set"]))
        for label in dict.fromkeys(label for names in seeds.values() for label in names):
            yield model, label, {s: names[label] for s, names in seeds.items()
                                 if label in names}, token_sets


def _trajectories(models: Iterable[str]) -> dict[str, dict[Any, dict[str, str]]]:
    """Trajectory -> seed (None without replicates) -> checkpoint label -> model name."""
    out: dict[str, dict[Any, dict[str, str]]] = {}
    for base, members in checkpoint_groups(models).items():
        match = SEED_NAME.match(base)
        model, seed = (match["model"], int(match["seed"])) if match else (base, None)
        out.setdefault(model, {})[seed] = dict((label, name) for label, name in members)
    return out


def _trajectory_row(model: str, label: str, token_set: str, names: dict[Any, str],
                    by_key: dict, diff: dict, null_rows: dict, records: dict) -> dict[str, Any]:
    seeds = list(names)
    mine = [by_key.get((names[s], token_set), {}) for s in seeds]
    rates = [float(r.get("rate", math.nan)) for r in mine]
    controls = [by_key.get((control_name(_base(names[s])), token_set)) for s in seeds]
    several = len(seeds) > 1
    row: dict[str, Any] = {
        "model": model, "checkpoint": label, "token_set": token_set,
        "epoch": _epoch(label, [records.get(names[s], {}) for s in seeds]),
        "epochs": [records.get(names[s], {}).get("best_epoch") if label == "best" else
                   _epoch(label, []) for s in seeds],
        "seeds": seeds if seeds != [None] else [], "rates": _listed(rates),
        "input_ci_low": _listed([float(r.get("ci_low", math.nan)) for r in mine]),
        "input_ci_high": _listed([float(r.get("ci_high", math.nan)) for r in mine]),
        "interval": "seeds" if several else "inputs"}
    row["rate_mean"], row["ci_low"], row["ci_high"] = _pooled(rates, mine)
    if all(c is not None for c in controls):
        control_rates = [float(c["rate"]) for c in controls]
        row["control_rate"], row["control_ci_low"], row["control_ci_high"] = _pooled(
            control_rates, controls)
        differences = [r - c for r, c in zip(rates, control_rates, strict=True)]
        if several:
            row["difference"], row["difference_ci_low"], row["difference_ci_high"] = \
                t_interval(differences)
        else:
            paired = diff.get((_base(names[seeds[0]]), token_set))
            paired = paired if label == "best" else None
            row["difference"] = differences[0]
            row["difference_ci_low"], row["difference_ci_high"] = (
                (paired["ci_low"], paired["ci_high"]) if paired is not None else
                _newcombe(mine[0], controls[0]))
    null_sets = [null_rows.get((names[s], token_set), []) for s in seeds]
    if all(null_sets):
        highest = [max(float(n["rate"]) for n in ns) for ns in null_sets]
        lowest = [min(float(n["rate"]) for n in ns) for ns in null_sets]
        row["null_low"], row["null_high"] = min(lowest), max(highest)
        for side, bound, pick in (("low", highest, max), ("high", lowest, min)):
            lifts = [r - b for r, b in zip(rates, bound, strict=True)]
            if several:
                estimate, low, high = t_interval(lifts)
            else:
                chosen = pick(null_sets[0], key=lambda n: float(n["rate"]))
                estimate, low, high = (lifts[0], float(chosen["lift_sim_low"]),
                                       float(chosen["lift_sim_high"]))
            row[f"lift_{side}"], row[f"lift_{side}_ci_low"], row[f"lift_{side}_ci_high"] = (
                estimate, low, high)
    return row


def _base(name: str) -> str:
    """The trained model a checkpoint model belongs to (its control's owner)."""
    match = CHECKPOINT_NAME.match(name)
    return match["model"] if match else name


def _epoch(label: str, records: list[dict[str, Any]]) -> float:
    """The epoch of a checkpoint: its own, or for `best` the seeds' best epoch when they agree."""
    if label.startswith("epoch "):
        return float(label.split()[1])
    epochs = {r.get("best_epoch") for r in records}
    return float(epochs.pop()) if len(epochs) == 1 and None not in epochs else math.nan


def _pooled(rates: list[float], rows: list[dict]) -> tuple[float, float, float]:
    """Mean and 95% interval: across seeds (t) when there are several, else over inputs."""
    if len(rates) > 1:
        mean, low, high = t_interval(rates)
        return mean, _within(low), _within(high)
    return rates[0], float(rows[0].get("ci_low", math.nan)), float(rows[0].get("ci_high",
                                                                                math.nan))


def _newcombe(trained: dict, control: dict) -> tuple[float, float]:
    from sweep.report.controls import newcombe_interval

    return newcombe_interval(float(trained["rate"]), (trained["ci_low"], trained["ci_high"]),
                             float(control["rate"]), (control["ci_low"], control["ci_high"]))


def _within(value: float) -> float:
    return value if not math.isfinite(value) else min(max(value, 0.0), 1.0)


def _listed(values: list[float]) -> list[float | None]:
    return [v if math.isfinite(v) else None for v in values]


LAYER_COLUMNS = ["model", "checkpoint", "token_set", "layer", "seeds", "rates", "rate_mean",
                 "ci_low", "ci_high", "differences", "difference", "difference_ci_low",
                 "difference_ci_high", "interval"]
"""One row per trajectory, checkpoint, token set and layer: the layer's rate in each seed
(`rates`, over that seed's inputs) with their mean and t interval across seeds, and each seed's
paired difference from its initialisation at the same layer and inputs (`differences`: the
layer's rate at the checkpoint - the seed's random-init control's, which is epoch 0's weights),
with their mean and t interval across seeds. `interval`: "seeds" (t across seeds; the unit is
the training run) or "none" (one seed: a layer's verdicts over one run's inputs say nothing of
another run, docs/training.md)."""


def layer_trajectory_table(rates: pd.DataFrame) -> pd.DataFrame:
    """The per-layer rows (LAYER_COLUMNS) from the report's per-layer rates table."""
    rate = {(r["model"], int(r["layer"]), r["token_set"]): float(r["rate"])
            for r in rates.to_dict("records")}
    layers: dict[str, list[int]] = {}
    for model, layer, _ in rate:
        layers.setdefault(model, []).append(layer)
    rows = []
    for model, label, names, token_sets in _checkpoints(rates):
        depth = sorted(set().union(*(layers.get(n, []) for n in names.values())))
        for token_set in token_sets:
            for layer in depth:
                mine = [rate.get((names[s], layer, token_set), math.nan) for s in names]
                initial = [rate.get((control_name(_base(names[s])), layer, token_set),
                                    math.nan) for s in names]
                differences = [r - c for r, c in zip(mine, initial, strict=True)]
                several = sum(math.isfinite(d) for d in differences) > 1
                mean, low, high = t_interval(mine)
                d_mean, d_low, d_high = t_interval(differences)
                rows.append({
                    "model": model, "checkpoint": label, "token_set": token_set,
                    "layer": layer, "seeds": [s for s in names if s is not None],
                    "rates": _listed(mine), "rate_mean": mean, "ci_low": _within(low),
                    "ci_high": _within(high), "differences": _listed(differences),
                    "difference": d_mean, "difference_ci_low": d_low,
                    "difference_ci_high": d_high,
                    "interval": "seeds" if several else "none"})
    frame = pd.DataFrame(rows, columns=LAYER_COLUMNS)
    return frame.astype({c: np.float64 for c in LAYER_COLUMNS
                         if c.startswith(("rate_", "ci_", "difference"))
                         and c != "differences"})


def layer_markdown(table: pd.DataFrame | None) -> list[str]:
    """Per trajectory and token set: a row per checkpoint, a column per layer, each cell the
    mean paired difference from the initialisation with its t interval across seeds."""
    if table is None or table.empty:
        return []
    out = ["Per layer: checkpoint - initialisation at the same layer and inputs, mean over seeds "
           "in percentage points [95% t interval across seeds; the unit is the training run, "
           "so a layer's near-identical verdicts over one run's inputs count once]:", ""]
    for (model, token_set), group in table.groupby(["model", "token_set"], sort=False):
        layers = sorted(dict.fromkeys(group["layer"]))
        out += [f"{model} ({token_set}):", "",
                "| checkpoint | " + " | ".join(f"layer {k}" for k in layers) + " |",
                "|---|" + "---|" * len(layers)]
        for label, rows in group.groupby("checkpoint", sort=False):
            cells = {int(r["layer"]): f"{_pp(r['difference'])} [{_pp(r['difference_ci_low'])}, "
                     f"{_pp(r['difference_ci_high'])}]" for r in rows.to_dict("records")}
            out.append(f"| {label} | " + " | ".join(cells.get(k, "–") for k in layers) + " |")
        out.append("")
    return out


PAIR_COLUMNS = ["model", "other", "checkpoint", "token_set", "seeds", "differences",
                "difference", "difference_ci_low", "difference_ci_high", "interval"]
"""One row per pair of comparable trajectories (`comparable_trajectories`: e.g. the same ViT
trained with two objectives), checkpoint they share and token set: `model`'s rate minus
`other`'s in each seed they share (paired by seed: the same split, and the same initial weights
where the architectures match), with the mean and its t interval across those seeds
(`interval`: "seeds"; "none" with fewer than two)."""


def comparable_trajectories(tree: xr.DataTree) -> list[tuple[str, str]]:
    """Pairs (model, other) of the trajectories of `tree` trained by the same family on the
    same dataset, `other` the one first in store order."""
    key: dict[str, str] = {}
    for model, seeds in _trajectories(model_names(tree)).items():
        name = next(iter(next(iter(seeds.values())).values()))
        attrs = tree[name].attrs
        spec, dataset = attrs.get("model_spec", {}), attrs.get("dataset_spec", {})
        key[model] = f"{spec.get('family')}|{sorted(dataset.items())}"
    models = list(key)
    return [(a, b) for i, a in enumerate(models) for b in models[:i] if key[a] == key[b]]


def trajectory_pairs(summary: pd.DataFrame, pairs: list[tuple[str, str]]) -> pd.DataFrame:
    """The PAIR_COLUMNS rows of `pairs` from the report's headline table."""
    rate = {(r["model"], r["token_set"]): float(r["rate"]) for r in summary.to_dict("records")}
    groups = _trajectories(dict.fromkeys(summary["model"]))
    rows = []
    for model, other in pairs:
        mine, theirs = groups[model], groups[other]
        seeds = [s for s in mine if s in theirs]
        labels = [label for label in dict.fromkeys(
            label for s in seeds for label in mine[s]) if all(
            label in mine[s] and label in theirs[s] for s in seeds)]
        for label in labels:
            for token_set in dict.fromkeys(summary["token_set"]):
                differences = [rate.get((mine[s][label], token_set), math.nan)
                               - rate.get((theirs[s][label], token_set), math.nan) for s in seeds]
                if not any(math.isfinite(d) for d in differences):
                    continue
                mean, low, high = t_interval(differences)
                rows.append({"model": model, "other": other, "checkpoint": label,
                             "token_set": token_set, "seeds": [s for s in seeds if s is not None],
                             "differences": _listed(differences), "difference": mean,
                             "difference_ci_low": low, "difference_ci_high": high,
                             "interval": "seeds" if math.isfinite(low) else "none"})
    frame = pd.DataFrame(rows, columns=PAIR_COLUMNS)
    return frame.astype({c: np.float64 for c in ("difference", "difference_ci_low",
                                                 "difference_ci_high")})


def pair_findings(table: pd.DataFrame) -> pd.DataFrame:
    """Per pair of trajectories and token set, at `best` (the kept weights): whether `model` is
    tighter or looser than `other`, read on the t interval across seeds. Records with the
    findings table's columns (kind `over_training_compared`)."""
    rows = []
    for r in table[table["checkpoint"] == BEST_LABEL].to_dict("records"):
        side = _side(r["difference_ci_low"], r["difference_ci_high"])
        seeds = f"t across {len(r['seeds'])} seeds, paired by seed"
        interval = (f"{_pp(r['difference'])} pp [{_pp(r['difference_ci_low'])}, "
                    f"{_pp(r['difference_ci_high'])}]")
        if side:
            word = "tighter" if side == 1 else "looser"
            text = (f"{r['model']} ({r['token_set']}): {word} than {r['other']} at the kept "
                    f"weights, {interval} ({seeds})")
        else:
            text = (f"{r['model']} ({r['token_set']}): not resolved from {r['other']} at the "
                    f"kept weights, {interval} ({seeds}): no difference shown, which is not "
                    f"evidence of none")
        rows.append({"model": r["model"], "token_set": r["token_set"],
                     "kind": "over_training_compared", "estimate": r["difference"],
                     "ci_low": r["difference_ci_low"], "ci_high": r["difference_ci_high"],
                     "text": text, "ci_method": "t across seeds"})
    return pd.DataFrame(rows, columns=["model", "token_set", "kind", "estimate", "ci_low",
                                       "ci_high", "text", "ci_method"])


def pair_markdown(table: pd.DataFrame | None) -> list[str]:
    """The comparison of trajectories: a row per pair, checkpoint and token set."""
    if table is None or table.empty:
        return []
    out = ["Trajectories side by side (the same family on the same dataset, e.g. one "
           "architecture trained by two objectives): model - other in percentage points, mean "
           "over the seeds both have, paired by seed [95% t interval across seeds]:", "",
           "| model - other | checkpoint | token set | difference [95% CI] | per seed |",
           "|---|---|---|---|---|"]
    for r in table.to_dict("records"):
        out.append(f"| {r['model']} - {r['other']} | {r['checkpoint']} | {r['token_set']} | "
                   f"{_pp(r['difference'])} [{_pp(r['difference_ci_low'])}, "
                   f"{_pp(r['difference_ci_high'])}] | "
                   f"{', '.join(_pp(v) for v in r['differences'])} |")
    return [*out, ""]


BEST_LABEL = "best"
FINDING_KINDS = ("over_training_vs_control", "over_training_vs_nulls", "over_training_compared")


def trajectory_findings(table: pd.DataFrame, ci_method: str) -> pd.DataFrame:
    """Per trajectory and token set, two findings read on the table's intervals: at which
    checkpoints the trained rate separates from its control (the difference's interval excludes
    0) and from the nulls (above every null: `lift_low`'s interval above 0; below every null:
    `lift_high`'s below 0), in either direction; the first such checkpoint and whether it stays
    separated to the last. Records with the findings table's columns."""
    rows = []
    for (model, token_set), group in table.groupby(["model", "token_set"], sort=False):
        group = group.to_dict("records")
        interval = "t across seeds" if group[0]["interval"] == "seeds" else ci_method
        vs_control = [(g, _side(g["difference_ci_low"], g["difference_ci_high"])) for g in group]
        vs_nulls = [(g, 1 if _side(g["lift_low_ci_low"], g["lift_low_ci_high"]) == 1 else
                     -1 if _side(g["lift_high_ci_low"], g["lift_high_ci_high"]) == -1 else 0)
                    for g in group]
        for kind, sides, what, column in (
                (FINDING_KINDS[0], vs_control, "its random-init control", "difference"),
                (FINDING_KINDS[1], vs_nulls, "every size-matched null", None)):
            rows.append(_finding(model, token_set, kind, sides, what, column, interval))
    return pd.DataFrame(rows, columns=["model", "token_set", "kind", "estimate", "ci_low",
                                       "ci_high", "text", "ci_method"])


def _side(low: float, high: float) -> int:
    if not (math.isfinite(low) and math.isfinite(high)):
        return 0
    return 1 if low > 0 else -1 if high < 0 else 0


def _finding(model: str, token_set: str, kind: str, sides: list, what: str,
             column: str | None, interval: str) -> dict[str, Any]:
    separated = [(g, s) for g, s in sides if s != 0]
    words = {1: "tighter than", -1: "looser than"}
    if not separated:
        at, estimate, low, high = sides[-1][0], math.nan, math.nan, math.nan
        text = (f"{model} ({token_set}): not resolved from {what} at any checkpoint (every "
                f"95% interval includes 0: no difference shown, which is not evidence of none)")
    else:
        at, direction = separated[0]
        tail = [s for _, s in sides[sides.index((at, direction)):]]
        stays = all(s == direction for s in tail)
        above = [g["checkpoint"] for g, s in sides if s == 1]
        below = [g["checkpoint"] for g, s in sides if s == -1]
        after = "stays so at every later checkpoint" if stays else "does not stay so"
        text = (f"{model} ({token_set}): first separates from {what} at {at['checkpoint']} "
                f"({words[direction]}), and {after}; tighter at: {', '.join(above) or 'none'}; "
                f"looser at: {', '.join(below) or 'none'}")
        if column is None:
            column = "lift_low" if direction == 1 else "lift_high"
        estimate, low, high = at[column], at[f"{column}_ci_low"], at[f"{column}_ci_high"]
    return {"model": model, "token_set": token_set, "kind": kind, "estimate": estimate,
            "ci_low": low, "ci_high": high, "text": text, "ci_method": interval}


def trajectory_markdown(table: pd.DataFrame | None, findings: pd.DataFrame | None) -> list[str]:
    """The section's Markdown: how to read it, one row per checkpoint and token set, findings."""
    out = ["## Tightness over training: the rate at each checkpoint", ""]
    if table is None or table.empty:
        return [*out, "(no model swept over its checkpoints in this store)", ""]
    out += ["Per model swept over its checkpoints (`checkpoints:` epochs, `best` = the kept "
            "weights; or `revision:`), the holding rate at each checkpoint: the mean over seeds "
            "with its 95% interval (t across seeds; with one seed, over inputs), each seed's "
            "rate, the random-init control (epoch 0's weights for a model trained here), "
            "trained - control in percentage points, and the size-matched nulls' band (lowest "
            "to highest null rate).", "",
            "Unit of the intervals across seeds: the training run (seed). A seed's verdicts "
            "cluster by layer (at initialisation a layer's verdict is nearly the same for "
            "every input), and its layers share one run, so each seed's rate (and paired "
            "difference) is one observation; with one seed the interval is over that run's "
            "inputs and says nothing of another run.", "",
            "| model | checkpoint | epoch | token set | rate [95% CI] | per seed | control "
            "[95% CI] | trained - control [95% CI] | nulls' band |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in table.to_dict("records"):
        per_seed = ", ".join(_pct(v) for v in r["rates"])
        epoch = (f"{int(r['epoch'])}" if math.isfinite(r["epoch"]) else
                 ", ".join("–" if e is None else str(int(e)) for e in r["epochs"]) or "–")
        out.append(
            f"| {r['model']} | {r['checkpoint']} | {epoch} | {r['token_set']} | "
            f"{_pct(r['rate_mean'])} [{_pct(r['ci_low'])}, {_pct(r['ci_high'])}] | {per_seed} | "
            f"{_pct(r['control_rate'])} [{_pct(r['control_ci_low'])}, "
            f"{_pct(r['control_ci_high'])}] | {_pp(r['difference'])} "
            f"[{_pp(r['difference_ci_low'])}, {_pp(r['difference_ci_high'])}] | "
            f"{_pct(r['null_low'])}–{_pct(r['null_high'])} |")
    out.append("")
    if findings is not None and not findings.empty:
        out += ["Findings over training (from the intervals above):", ""]
        out += [f"- {r['text']}" for r in findings.to_dict("records")]
        out.append("")
    return out


def _pct(value: float | None) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{100 * value:.1f}%"


def _pp(value: float | None) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{100 * value:+.1f}"


def over_training(tree: xr.DataTree, tol: float | None = None) -> xr.Dataset:
    """The checkpoint models of `tree` as one xarray Dataset: `holding`, `inputs`, `cells`,
    `rate` (= holding / cells) over
    (model, seed, checkpoint, token_set): model = the trajectory's name (seeds pooled), seed =
    -1 without replicates, checkpoint = `epoch <k>`, `best` or `rev <r>` (as the names say:
    `sweep.config.checkpoints`); NaN where a combination was not swept."""
    from storage.query.results import holding_rates

    rates = holding_rates(tree, by=("model", "token_set"), tol=tol)
    where = {name: (model, -1 if seed is None else seed, label)
             for model, seeds in _trajectories(dict.fromkeys(rates["model"])).items()
             for seed, members in seeds.items() for label, name in members.items()}
    rows = rates[rates["model"].isin(list(where))]
    keys = pd.DataFrame([where[m] for m in rows["model"]],
                        columns=["model", "seed", "checkpoint"], index=rows.index)
    tidy = pd.concat([keys, rows[["token_set", "holding", "inputs", "cells", "rate"]]], axis=1)
    order = list(dict.fromkeys(label for _, _, label in where.values()))  # epochs, then best
    dataset = tidy.set_index(["model", "seed", "checkpoint", "token_set"]).to_xarray()
    return dataset.reindex(checkpoint=order)

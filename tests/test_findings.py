"""Findings computed, not written: the rules on hand-built tables (tighter / looser /
indistinguishable by where the interval lies; failures by layer in counts, concentrated only
beyond an even share; per-head beside head-mean), and the report's Findings section."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import xarray as xr
from scipy import stats

from storage.query import open_results
from storage.query.statistics import wilson_interval
from sweep.report import findings
from sweep.report.nulls import add_lifts, newcombe_interval
from sweep.report.tables import build_report, render_json, render_markdown
from tests.store_fixtures import write_store
from tests.test_controls import model_with


@pytest.mark.parametrize(
    ("low", "high", "verdict"),
    [(0.01, 0.2, "tighter than"), (-0.3, -0.001, "looser than"),
     (-0.05, 0.1, "indistinguishable from"), (0.0, 0.1, "indistinguishable from")],
)
def test_a_comparison_is_decided_by_where_its_interval_lies(low, high, verdict):
    record = findings.compare("m", "all", "vs_control", (low + high) / 2, low, high, "X")
    assert verdict in record["text"] and record["text"].startswith(f"m (all): {verdict} X")
    assert ("includes 0" in record["text"]) == (verdict == "indistinguishable from")


def test_undefined_intervals_make_no_finding():
    assert findings.compare("m", "all", "vs_control", float("nan"), 0.1, 0.2, "X") is None


def test_controls_nulls_and_seeds_become_records_of_one_shape():
    controls = pd.DataFrame([
        {"model": "a", "control": "a@random-init", "token_set": "all", "difference": 0.2,
         "ci_low": 0.05, "ci_high": 0.33},
        {"model": "b", "control": "b@random-init", "token_set": "all", "difference": 0.06,
         "ci_low": -0.02, "ci_high": 0.13}])
    nulls = pd.DataFrame([{"model": "a", "token_set": "all", "null": "softmax-b2", "lift": -0.1,
                           "lift_ci_low": -0.15, "lift_ci_high": -0.04, "comparisons": 1,
                           "lift_sim_low": -0.15, "lift_sim_high": -0.04}])
    seeds = pd.DataFrame([{"model": "s", "token_set": "content", "n_seeds": 3,
                           "differences": [0.1, None, 0.0], "difference_mean": 0.05,
                           "difference_ci_low": -0.2, "difference_ci_high": 0.3}])
    summary = pd.DataFrame({"model": ["a", "s@seed0", "s@seed0@random-init", "b"]})
    rates = pd.DataFrame(columns=["model", "layer", "token_set", "cells", "holding"])
    table = findings.build_findings(summary, rates, controls, nulls, seeds)
    assert list(table.columns) == ["model", "token_set", "kind", "estimate", "ci_low", "ci_high",
                                   "text", "ci_method"]
    assert table[["model", "kind"]].values.tolist() == [  # in model order; seeds after theirs
        ["a", "vs_control"], ["a", "vs_null:softmax-b2"], ["s", "seeds_vs_control"],
        ["b", "vs_control"]]
    texts = table["text"].tolist()
    assert texts[0] == "a (all): tighter than its control a@random-init: +20.0 pp [+5.0 pp, " \
        "+33.0 pp]"
    assert texts[1].startswith("a (all): looser than the size-matched softmax-b2 null: -10.0 pp")
    assert "(mean over 2 seeds" in texts[2]  # the seed without a difference is not counted
    assert "low power" in texts[2] and "indistinguishable" not in texts[2]
    assert texts[3].startswith("b (all): indistinguishable from its control")


def seed_rows(model: str, token_set: str, differences: list[float]) -> dict:
    mean = float(np.mean(differences))
    half = stats.t.ppf(0.975, len(differences) - 1) * np.std(differences, ddof=1) / np.sqrt(
        len(differences))
    return {"model": model, "token_set": token_set, "n_seeds": len(differences),
            "differences": differences, "difference_mean": mean,
            "difference_ci_low": mean - half, "difference_ci_high": mean + half}


def replicate_controls(model: str, token_set: str, ends: list[tuple[float, float]]):
    return [{"model": f"{model}@seed{k}", "control": f"{model}@seed{k}@random-init",
             "token_set": token_set, "difference": (low + high) / 2, "ci_low": low,
             "ci_high": high} for k, (low, high) in enumerate(ends)]


def test_seeds_whose_interval_includes_0_are_low_power_not_no_effect():
    """Three seeds, two of whose own intervals lie above 0 and none below: the t interval over
    the seeds includes 0, and the finding says the sweep cannot tell (low power), counts the
    single seeds' intervals as they are, and never says 'indistinguishable' or 'either way'."""
    seeds = pd.DataFrame([seed_rows("ft", "content", [0.062, 0.074, 0.0])])
    controls = pd.DataFrame(replicate_controls("ft", "content",
                                               [(0.03, 0.09), (0.04, 0.11), (-0.05, 0.05)]))
    (record,) = findings.seed_findings(seeds, controls)
    assert record["ci_low"] < 0 < record["ci_high"]
    assert record["text"].startswith("ft (content): not resolved against its controls across "
                                     "seeds: +4.5 pp")
    assert "t interval with 2 degrees of freedom" in record["text"]
    assert "low power, not evidence that training has no effect" in record["text"]
    assert "single seeds: 2 of 3 intervals above 0, 0 below" in record["text"]
    assert "indistinguishable" not in record["text"] and "either way" not in record["text"]


def test_seeds_whose_interval_excludes_0_are_tighter_without_low_power():
    seeds = pd.DataFrame([seed_rows("ft", "all", [0.06, 0.07, 0.065])])
    (record,) = findings.seed_findings(seeds)
    assert record["text"].startswith("ft (all): tighter than its controls across seeds")
    assert "low power" not in record["text"]


def test_the_pooled_over_seeds_figure_is_the_t_interval_over_every_run():
    """The audit's figure: content differences of three ft-cancer and three ft-wine runs;
    pooled, their mean with a t interval over the six runs (5 degrees of freedom)."""
    cancer, wine = [0.062, 0.074, 0.0], [0.125, -0.069, 0.112]
    seeds = pd.DataFrame([seed_rows("ft-cancer", "content", cancer),
                          seed_rows("ft-wine", "content", wine),
                          seed_rows("ft-cancer", "all", [0.1, 0.12, -0.03])])
    (record,) = findings.pooled_seed_findings(seeds)  # `all` has one replicated model only
    runs = cancer + wine
    half = stats.t.ppf(0.975, 5) * np.std(runs, ddof=1) / np.sqrt(6)
    assert (record["estimate"], record["ci_low"], record["ci_high"]) == pytest.approx(
        (np.mean(runs), np.mean(runs) - half, np.mean(runs) + half))
    assert (record["model"], record["token_set"], record["kind"], record["ci_method"]) == (
        "ft-cancer + ft-wine", "content", "seeds_pooled_vs_control", "t-over-runs")
    assert record["text"].startswith("ft-cancer + ft-wine (content): not resolved against their "
                                     "controls, pooled over seeds and tables: +5.1 pp [-2.6 pp")
    assert "6 training runs: ft-cancer 3, ft-wine 3" in record["text"]
    assert "low power" in record["text"]
    table = findings.build_findings(pd.DataFrame({"model": ["ft-cancer@seed0"]}),
                                    pd.DataFrame(columns=["model", "layer", "token_set",
                                                          "cells", "holding"]),
                                    pd.DataFrame(columns=["model", "control", "token_set",
                                                          "difference", "ci_low", "ci_high"]),
                                    seeds=seeds)
    assert table["kind"].tolist().count("seeds_pooled_vs_control") == 1


def test_null_findings_hold_together_over_a_models_comparisons():
    """A control 1.7 pp above one of five nulls on each of two token sets: its 95% interval
    excludes 0, but one comparison picked among ten is not evidence; the finding reads the
    interval at 1 - 0.05/10 (Bonferroni) and says so."""
    names = ["uniform", "softmax-b0.5", "softmax-b1", "softmax-b2", "softmax-b4"]
    nulls = pd.DataFrame([{"model": "c", "token_set": ts, "null": null, "trials": 10000,
                           "holding": 2580 if null == "softmax-b2" else 2700}
                          for ts in ("all", "content") for null in names])
    summary = pd.DataFrame([{"model": "c", "token_set": ts, "cells": 5760, "holding": 1584,
                             "rate": 1584 / 5760} for ts in ("all", "content")])
    table = add_lifts(nulls, summary)
    assert (table["comparisons"] == 10).all()
    b2 = table[(table["null"] == "softmax-b2") & (table["token_set"] == "all")].iloc[0]
    assert b2["lift_ci_low"] > 0  # alone, at 95%: "tighter than"
    z = findings.simultaneous_z(10)
    assert z == pytest.approx(2.807, abs=1e-3)
    assert (b2["lift_sim_low"], b2["lift_sim_high"]) == pytest.approx(
        newcombe_interval(1584, 5760, 2580, 10000, z)[1:])
    assert b2["lift_sim_low"] < 0 < b2["lift_sim_high"]
    records = [r for r in findings.null_findings(table)
               if r["kind"] == "vs_null:softmax-b2" and r["token_set"] == "all"]
    (record,) = records
    assert record["text"].startswith("c (all): indistinguishable from the size-matched "
                                     "softmax-b2 null")
    assert "Bonferroni over c's 10 null comparisons: each interval at 99.5%" in record["text"]
    assert record["ci_method"] == "wilson-bonferroni"
    assert (record["ci_low"], record["ci_high"]) == (b2["lift_sim_low"], b2["lift_sim_high"])


def per_layer(model: str, failures: list[int], cells: int = 40) -> pd.DataFrame:
    return pd.DataFrame({"model": model, "token_set": "all", "layer": range(len(failures)),
                         "cells": cells, "holding": [cells - f for f in failures]})


def test_failures_concentrate_only_when_the_share_interval_clears_an_even_share():
    rates = pd.concat([per_layer("deep", [30, 5, 5]), per_layer("spread", [9, 6, 5]),
                       per_layer("two", [14, 0, 0, 0, 0, 15]),
                       per_layer("one-layer", [7]), per_layer("none", [0, 0])])
    (deep, spread, two) = findings.depth_findings(rates)
    z = findings.simultaneous_z(3)  # three intervals that hold together at 95%
    assert z == pytest.approx(2.394, abs=1e-3)
    low, high = wilson_interval(30, 40, z)  # 75.0% [56.2%, 87.3%] > 33.3%
    assert (deep["estimate"], deep["ci_low"], deep["ci_high"]) == pytest.approx((0.75, low, high))
    assert deep["ci_method"] == "wilson-bonferroni"
    assert deep["text"] == (
        "deep (all): failures by layer (from 0) layer 0: 30, layer 1: 5, layer 2: 5; they "
        f"concentrate in layer 0: 30 of 40 (75.0% [{100 * low:.1f}%, {100 * high:.1f}%]), above "
        "its 33.3% share of the tested pairs")
    assert wilson_interval(9, 20, z)[0] < 1 / 3  # 45% of the failures, not beyond an even share
    assert spread["text"].startswith(
        "spread (all): failures by layer (from 0) layer 0: 9, layer 1: 6, layer 2: 5; no layer "
        "is singled out: the most, layer 0, holds 9 of 20")
    # two layers above their even share: both are named, not only the one with the most
    assert "they concentrate in layer 0: 14 of 29" in two["text"]
    assert "; and in layer 5: 15 of 29" in two["text"]


def test_failures_spread_evenly_are_rarely_said_to_concentrate():
    """The layer with the most failures is picked after looking: with the L intervals held
    together, evenly spread failures are said to concentrate in at most about 5% of draws
    (a single 95% interval on the top layer said so in 16% at L = 6)."""
    rng = np.random.default_rng(1)
    claims = 0
    for _ in range(1000):
        failures = rng.binomial(96, 0.05, size=6)
        found = findings.depth_findings(per_layer("m", list(failures), cells=96))
        claims += bool(found) and "concentrate in" in found[0]["text"]
    assert claims / 1000 <= 0.05


def test_per_head_beside_head_mean():
    summary = pd.DataFrame([
        {"model": "m", "token_set": "all", "holding": 150, "cells": 160, "rate": 150 / 160},
        {"model": "m-heads", "token_set": "all", "holding": 1507, "cells": 1920,
         "rate": 1507 / 1920}])
    intervals = [wilson_interval(150, 160), wilson_interval(1507, 1920)]
    summary["ci_low"], summary["ci_high"] = zip(*intervals, strict=True)
    (record,) = findings.head_findings(summary, [("m", "m-heads")])
    assert record["kind"] == "per_head_vs_head_mean"
    assert record["estimate"] == pytest.approx(1507 / 1920 - 150 / 160)
    assert record["text"].startswith("m-heads (all): looser than the head-mean rate of m: -15.3 pp")
    assert "per head 78.5%, 1507/1920 input-layer-head cells; head mean 93.8%, 150/160" in \
        record["text"]


def test_head_pairs_match_models_that_differ_only_in_heads():
    def node(heads: list[str], spec: dict) -> xr.DataTree:
        tree = xr.DataTree(xr.Dataset(coords={"head": heads}))
        tree.attrs["fingerprint_inputs"] = {"model": spec, "dataset": {"source": "d"}}
        return tree

    spec = {"name": "minilm-l6", "seed": 0}
    tree = xr.DataTree(children={
        "mean": node(["mean"], spec), "each": node(["0", "1"], {**spec, "heads": "each"}),
        "other": node(["0", "1"], {**spec, "seed": 1, "heads": "each"})})
    assert findings.head_pairs(tree) == [("mean", "each")]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """m holds on 56 of 70 pairs (30 + 26 of 35 per layer), its control on 48 of 80."""
    models = {"m": model_with([30, 26], 35), "m@random-init": model_with([20, 28], 40)}
    path = write_store(tmp_path_factory.mktemp("findings") / "sweep.zarr", models)
    return build_report(open_results(path), store=str(path))


def test_the_report_ends_with_the_findings_and_the_json_has_them(report):
    text = render_markdown(report)
    assert text.rstrip().split("## ")[-1].startswith("Findings")
    assert "- m (all): tighter than its control m@random-init: +20.0 pp [+5.2 pp, +33.4 pp]" \
        in text
    records = json.loads(render_json(report))["findings"]
    first = records[0]
    assert set(first) == {"model", "token_set", "kind", "estimate", "ci_low", "ci_high", "text",
                          "ci_method"}
    assert first["ci_method"] == "wilson"  # the controls' Newcombe interval from Wilson's
    assert (first["model"], first["kind"]) == ("m", "vs_control")
    kinds = {(r["model"], r["kind"]) for r in records}
    assert ("m", "failures_by_layer") in kinds and ("m@random-init", "failures_by_layer") in kinds

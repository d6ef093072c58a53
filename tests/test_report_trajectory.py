"""The report's tightness over training: per checkpoint the rate across seeds (or over inputs),
its control and the nulls' band, and findings read on those intervals."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from sweep.report.controls import controls_table
from sweep.report.nulls import add_lifts
from sweep.report.training import trajectory_findings, trajectory_table

CHECKPOINTS = ("@epoch0", "@epoch5", "")


def summary_of(rates: dict[str, float], cells: int = 100) -> pd.DataFrame:
    rows = []
    for name, rate in rates.items():
        holding = round(rate * cells)
        rows.append({"model": name, "token_set": "all", "holding": holding, "inputs": cells // 4,
                     "cells": cells, "rate": holding / cells, "ci_low": holding / cells - 0.05,
                     "ci_high": holding / cells + 0.05})
    return pd.DataFrame(rows)


def nulls_of(models, rate: float = 0.25, trials: int = 10_000) -> pd.DataFrame:
    return pd.DataFrame([{"model": m, "token_set": "all", "null": null, "trials": trials,
                          "holding": round((rate + shift) * trials), "rate": rate + shift}
                         for m in models for null, shift in (("uniform", 0.0),
                                                             ("softmax-b1", 0.02))])


@pytest.fixture
def three_seeds():
    # per seed: epoch 0 = control, epoch 5 above it, best below every null
    rates = {}
    for seed, jitter in ((0, 0.0), (1, 0.01), (2, -0.01)):
        base = f"vit@seed{seed}"
        rates.update({f"{base}@epoch0": 0.30 + jitter, f"{base}@epoch5": 0.60 + jitter,
                      base: 0.10 + jitter, f"{base}@random-init": 0.30 + jitter})
    summary = summary_of(rates)
    nulls = add_lifts(nulls_of(list(rates)), summary)
    records = {f"vit@seed{s}": {"best_epoch": 30} for s in range(3)}
    return trajectory_table(summary, controls_table(summary), nulls, records)


def test_each_checkpoint_gets_the_seed_mean_its_t_interval_and_the_paired_difference(
        three_seeds):
    table = three_seeds
    assert list(table["checkpoint"]) == ["epoch 0", "epoch 5", "best"]
    assert list(table["epoch"]) == [0.0, 5.0, 30.0]
    five = table.iloc[1]
    assert five["rates"] == [0.6, 0.61, 0.59] and five["rate_mean"] == pytest.approx(0.6)
    half = 4.302653 * 0.01 / math.sqrt(3)  # t(0.975, 2) * sd / sqrt(3)
    assert (five["ci_low"], five["ci_high"]) == pytest.approx((0.6 - half, 0.6 + half))
    assert five["difference"] == pytest.approx(0.3)
    assert five["difference_ci_low"] == pytest.approx(0.3)  # the same gap on every seed
    assert (five["null_low"], five["null_high"]) == (0.25, 0.27)
    assert five["lift_low"] == pytest.approx(0.6 - 0.27)
    assert table.iloc[0]["difference_ci_high"] == 0.0  # epoch 0 is the control


def test_the_findings_name_the_first_separating_checkpoint_in_either_direction(three_seeds):
    found = trajectory_findings(three_seeds, "wilson").set_index("kind")["text"]
    assert found["over_training_vs_control"] == (
        "vit (all): first separates from its random-init control at epoch 5 (tighter than), "
        "and does not stay so; tighter at: epoch 5; looser at: best")
    assert found["over_training_vs_nulls"].startswith(
        "vit (all): first separates from every size-matched null at epoch 0 (tighter than)")
    assert found["over_training_vs_nulls"].endswith("tighter at: epoch 0, epoch 5; looser at: best")


def test_one_seed_reads_the_intervals_over_inputs():
    rates = {"ft@epoch0": 0.3, "ft": 0.32, "ft@random-init": 0.3}
    summary = summary_of(rates)
    table = trajectory_table(summary, controls_table(summary),
                             add_lifts(nulls_of(list(rates)), summary), {})
    assert list(table["interval"]) == ["inputs", "inputs"]
    assert table.iloc[1]["ci_low"] == pytest.approx(0.27)  # the headline's own interval
    assert math.isnan(table.iloc[1]["epoch"])  # no record: the best epoch is unknown
    found = trajectory_findings(table, "wilson").set_index("kind")["text"]
    assert "at no checkpoint does the rate separate from its random-init control" in \
        found["over_training_vs_control"]


def test_the_checkpoints_of_a_store_as_one_xarray_dataset(tmp_path):
    from storage.query import open_results
    from sweep.report.tables import build_report, render_json
    from sweep.report.training import over_training
    from tests.store_fixtures import write_store
    from tests.test_seeds import model_holding

    models = {"m@seed0@epoch0": model_holding(5), "m@seed0": model_holding(10),
              "m@seed1@epoch0": model_holding(0), "m@seed1": model_holding(4)}
    path = write_store(tmp_path / "s.zarr", models)
    tree = open_results(path)
    ds = over_training(tree)
    assert list(ds["checkpoint"].values) == ["epoch 0", "best"]
    assert list(ds["seed"].values) == [0, 1]
    rate = ds["rate"].sel(model="m", token_set="all")
    assert rate.sel(checkpoint="best").values.tolist() == [1.0, 0.4]
    report = build_report(tree, store=str(path))
    assert list(report.trajectory["checkpoint"]) == ["epoch 0", "best"]
    assert '"trajectory": [' in render_json(report)

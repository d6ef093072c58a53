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
    assert "not resolved from its random-init control at any checkpoint" in \
        found["over_training_vs_control"]
    assert "no difference shown, which is not evidence of none" in \
        found["over_training_vs_control"]  # never "no change"


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


def test_per_layer_the_paired_difference_from_the_initialisation_has_a_t_interval_over_seeds():
    """The unit is the training run: a layer's rate in each seed minus its control's at the same
    layer, one value per seed, and Student's t across them (docs/training.md)."""
    from sweep.report.training import layer_markdown, layer_trajectory_table

    layer_rates = {  # seed -> (control's layer 0, 1), (best's layer 0, 1)
        0: ((0.9, 0.1), (0.5, 0.2)), 1: ((0.1, 0.8), (0.3, 0.9)), 2: ((0.5, 0.5), (0.1, 0.6))}
    rows = []
    for seed, (control, best) in layer_rates.items():
        for name, rates in ((f"vit@seed{seed}@random-init", control), (f"vit@seed{seed}", best),
                            (f"vit@seed{seed}@epoch0", control)):
            rows += [{"model": name, "layer": layer, "token_set": "all", "rate": rate}
                     for layer, rate in enumerate(rates)]
    table = layer_trajectory_table(pd.DataFrame(rows))
    best = table[(table["checkpoint"] == "best") & (table["layer"] == 0)].iloc[0]
    assert best["differences"] == pytest.approx([-0.4, 0.2, -0.4])
    sd = math.sqrt(sum((d + 0.2) ** 2 for d in (-0.4, 0.2, -0.4)) / 2)
    half = 4.302653 * sd / math.sqrt(3)
    assert best["difference"] == pytest.approx(-0.2)
    assert (best["difference_ci_low"], best["difference_ci_high"]) == pytest.approx(
        (-0.2 - half, -0.2 + half))
    assert best["interval"] == "seeds" and best["seeds"] == [0, 1, 2]
    zero = table[table["checkpoint"] == "epoch 0"]
    assert list(zero["difference"]) == [0.0, 0.0]  # epoch 0 is the control's weights
    lines = layer_markdown(table)
    assert "| best | -20.0 [" in "\n".join(lines).replace("−", "-").replace("+", "")


def test_two_objectives_are_compared_seed_by_seed_at_each_checkpoint():
    from sweep.report.training import pair_findings, trajectory_pairs

    rates = {}
    for seed, (a, b) in enumerate(((0.30, 0.20), (0.42, 0.30), (0.41, 0.30))):
        for name, rate in (("vit", b), ("dino", a)):
            rates.update({f"{name}@seed{seed}@epoch0": 0.3, f"{name}@seed{seed}": rate})
    table = trajectory_pairs(summary_of(rates), [("dino", "vit")])
    best = table[table["checkpoint"] == "best"].iloc[0]
    assert best["differences"] == pytest.approx([0.10, 0.12, 0.11]) and best["seeds"] == [0, 1, 2]
    half = 4.302653 * 0.01 / math.sqrt(3)  # sd 0.01
    assert (best["difference_ci_low"], best["difference_ci_high"]) == pytest.approx(
        (0.11 - half, 0.11 + half))
    (text,) = pair_findings(table)["text"]
    assert text.startswith("dino (all): tighter than vit at the kept weights, +11.0 pp [+8.5, "
                           "+13.5] (t across 3 seeds, paired by seed)")
    assert table[table["checkpoint"] == "epoch 0"].iloc[0]["difference"] == 0.0

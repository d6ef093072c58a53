"""`sweep report`: the six sections, their renderings and figures, on a hand-counted store."""

from __future__ import annotations

import csv
import io
import json

import matplotlib.image
import numpy as np
import pytest

from storage.query import open_results
from sweep.cli.entry import main
from sweep.report.tables import build_report, table_names
from tests.store_fixtures import PENDING, FixtureModel, hand_store, write_store


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return hand_store(tmp_path_factory.mktemp("report") / "sweep.zarr")


@pytest.fixture(scope="module")
def report(store):
    return build_report(open_results(store), store=str(store))


def only(frame, **keys):
    for key, value in keys.items():
        frame = frame[frame[key] == value]
    assert len(frame) == 1, f"expected one row for {keys}, got {len(frame)}"
    return frame.iloc[0]


def test_headline_counts_input_layer_pairs_per_model_and_token_set(report):
    assert only(report.summary, model="alpha", token_set="all")[
        ["holding", "cells", "inputs"]].tolist() == [7, 12, 4]  # 4 inputs x 3 layers tested
    assert only(report.summary, model="alpha", token_set="content")[["holding", "cells"]] \
        .tolist() == [9, 11]
    assert only(report.summary, model="beta", token_set="all")["rate"] == pytest.approx(0.5)


def test_share_of_failures_in_the_last_third(report):
    every = only(report.failures, model="alpha", token_set="all")
    assert (every["last_third"], every["failures"]) == (3, 5)
    assert every["rate"] == pytest.approx(0.6)
    assert only(report.failures, model="alpha", token_set="content")["rate"] == pytest.approx(0.5)
    assert len(report.depth[report.depth["model"] == "alpha"]) == 6  # 3 thirds x 2 token sets


def test_special_tokens_rescue_and_attaining_pairs(report):
    rescue = only(report.rescue, model="alpha")
    # failing on all tokens: (input, layer) (0,2) (1,1) (1,2) (2,2) (3,1); content skipped at (1,2)
    assert rescue[["failing_all", "content_tested", "holding_content"]].tolist() == [5, 4, 3]
    assert list(report.rescue["model"]) == ["alpha"]  # beta has no content token set
    pairs = only(report.special_pairs, model="alpha")
    assert pairs[["special", "cells", "failing_special", "failing"]].tolist() == [2, 12, 2, 5]
    assert pairs["failing_rate"] == pytest.approx(0.4)


def test_baseline_beside_the_models_token_counts(report):
    assert report.baseline[["n", "trials", "holding"]].values.tolist() == [[2, 20, 9], [3, 10, 2]]
    sizes = only(report.token_counts, model="alpha", token_set="all")
    assert sizes[["inputs", "n_min", "n_median", "n_max"]].tolist() == [4, 4, 5, 5]
    assert only(report.token_counts, model="alpha", token_set="content")["n_max"] == 4


def test_whole_rollout_against_the_product_of_bounds(report):
    rollout = only(report.rollout, model="alpha", token_set="content")
    assert (rollout["layer"], rollout["inputs"]) == (2, 3)
    assert rollout["ratio_median"] == pytest.approx(0.1 / 0.4)
    assert only(report.rollout, model="beta", token_set="all")["inputs"] == 0


def test_tolerance_reaches_every_section(store):
    loose = build_report(open_results(store), tol=1e-6)
    assert only(loose.summary, model="alpha", token_set="all")["holding"] == 8
    assert only(loose.rescue, model="alpha")["failing_all"] == 4
    pairs = only(loose.special_pairs, model="alpha")  # content gap 5e-7 at (input 2, layer 2)
    assert pairs[["special", "failing_special", "failing"]].tolist() == [1, 1, 4]


def test_json_has_rates_summary_and_baseline_records(store, capsys):
    assert main(["report", str(store), "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert {"rates", "summary", "baseline"} <= set(document)
    assert len(document["rates"]) == 7
    record = next(r for r in document["rates"]
                  if (r["model"], r["layer"], r["token_set"]) == ("alpha", 2, "content"))
    assert {"inputs": 3, "cells": 3, "holding": 2} == {
        k: record[k] for k in ("inputs", "cells", "holding")}
    assert {"rate", "ci_low", "ci_high"} <= set(record)
    assert [(b["n"], b["trials"], b["holding"]) for b in document["baseline"]] == \
        [(2, 20, 9), (3, 10, 2)]
    assert {"model", "token_set", "rate"} <= set(document["summary"][0])


def test_cli_tolerance_is_applied(store, capsys):
    assert main(["report", str(store), "--format", "json", "--tol", "1e-6"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["tol"] == 1e-6
    alpha = next(r for r in document["summary"]
                 if (r["model"], r["token_set"]) == ("alpha", "all"))
    assert (alpha["holding"], alpha["cells"], alpha["inputs"]) == (8, 12, 4)


def test_cli_tolerance_above_the_window_is_a_one_line_error(store, capsys):
    assert main(["report", str(store), "--tol", "0.5"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "window" in error


def test_csv_is_the_per_layer_rates_table(store, capsys):
    assert main(["report", str(store), "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == 7
    beta = next(r for r in rows if r["model"] == "beta")
    assert (beta["holding"], beta["cells"], beta["inputs"], float(beta["rate"])) == (
        "1", "2", "2", 0.5)


def test_csv_writes_every_table_and_names_an_absent_one(store, capsys):
    """`--table` offers every table, the optional ones too (nulls, heads); a table this store
    does not have is a one-line error, not an empty file."""
    assert {"nulls", "heads", "controls"} <= set(table_names())
    assert main(["report", str(store), "--format", "csv", "--table", "nulls"]) == 0
    assert capsys.readouterr().out.startswith("model,token_set,null")
    assert main(["report", str(store), "--format", "csv", "--table", "heads"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "no 'heads' table" in error and "heads: each" in error


def test_markdown_has_the_six_sections(store, capsys):
    assert main(["report", str(store), "--ci", "wilson"]) == 0
    text = capsys.readouterr().out
    for heading in ("## 1. Headline", "## 2. Per layer", "## 3. Depth", "## 4. Special tokens",
                    "## 5. Baseline", "## 6. Whole rollout"):
        assert heading in text
    assert "| alpha | 58.3% [32.0%, 80.7%] (7/12) | 81.8% [52.3%, 94.9%] (9/11) |" in text


def test_plots_are_written_and_readable_images(store, tmp_path, capsys):
    out = tmp_path / "figures"
    assert main(["report", str(store), "--plots", str(out)]) == 0
    for name in ("depth.png", "baseline.png", "margins.png"):
        image = matplotlib.image.imread(out / name)
        assert image.shape[0] > 200 and image.shape[1] > 300, name
        assert image.std() > 0.01, f"{name} is blank"
    assert "wrote" in capsys.readouterr().err


def test_bad_store_is_a_one_line_error(tmp_path, capsys):
    assert main(["report", str(tmp_path / "missing.zarr")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "no sweep store" in error


def test_bad_tolerance_is_a_one_line_error(store, capsys):
    assert main(["report", str(store), "--tol", "-1"]) == 2
    assert "tolerance" in capsys.readouterr().err


def test_a_store_with_no_verdicts_yet_reports_counts_and_no_rates(tmp_path, capsys):
    status = np.full((3, 2, 2), PENDING, dtype=np.int8)
    path = write_store(tmp_path / "fresh.zarr", {"m": FixtureModel(np.zeros(status.shape), status)})
    assert main(["report", str(path), "--format", "json"]) == 0
    summary = json.loads(capsys.readouterr().out)["summary"]
    assert [(s["inputs"], s["cells"], s["pending"], s["rate"]) for s in summary] == [
        (0, 0, 6, None)] * 2
    assert main(["report", str(path)]) == 0
    assert "| m | – (0/0) | – (0/0) | 12 |" in capsys.readouterr().out


def test_a_store_with_no_models_yet_says_so_in_every_format(tmp_path, capsys):
    path = write_store(tmp_path / "created.zarr", {})
    assert main(["report", str(path), "--plots", str(tmp_path / "plots")]) == 0
    out = capsys.readouterr().out
    assert "(no models in this store yet: `sweep run` adds the models its config lists)" in out
    assert main(["report", str(path), "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["summary"] == document["rates"] == document["nulls"] == []
    for table in ("rates", "failures", "token_counts", "controls"):
        assert main(["report", str(path), "--format", "csv", "--table", table]) == 0
        assert capsys.readouterr().out.count("\n") == 1  # the header row only


def test_a_model_with_no_inputs_has_no_tested_cells(tmp_path, capsys):
    none = np.zeros((0, 2, 2))
    path = write_store(tmp_path / "empty.zarr", {"m": FixtureModel(none, none.astype(np.int8))})
    assert main(["report", str(path), "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [(s["inputs"], s["cells"], s["rate"]) for s in document["summary"]] == [
        (0, 0, None)] * 2
    assert [(t["inputs"], t["n_median"]) for t in document["token_counts"]] == [(0, None)] * 2
    assert [(r["inputs"], r["ratio_max"]) for r in document["rollout"]] == [(0, None)] * 2

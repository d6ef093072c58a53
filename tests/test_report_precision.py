"""Verdicts at the data's precision (sweep/report/precision.py): the rounding bounds by hand and
the decided / undecided counts of a hand-built store."""

from __future__ import annotations

import json

import numpy as np
import pytest

from storage.query import open_results
from sweep.report.precision import complement_eta, rounding_bound
from sweep.report.tables import build_report, render_json, render_markdown
from tests.store_fixtures import OK, FixtureModel, write_store


def test_rounding_bounds_by_hand():
    u = 2.0**-24
    assert rounding_bound("float32", "all") == pytest.approx(2 * u / (1 - u), rel=1e-15)
    assert rounding_bound("bfloat16", "content") == pytest.approx(2 * 2**-8 / (1 - 2**-8))
    assert rounding_bound("float16", "content-pairs", 5) == rounding_bound("float16", "all")
    # one elimination: (1 + u)^2 / (1 - u) - 1, two: that again
    once = (1 + u) ** 2 / (1 - u) - 1
    assert complement_eta(u, np.array([0, 1, 2])) == pytest.approx(
        [u, once, (1 + once) ** 2 / (1 - once) - 1], rel=1e-12)
    assert rounding_bound("float32", "content-complement", 1) == pytest.approx(
        2 * once / (1 - once), rel=1e-12)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    # 4 inputs, 1 layer, token set all; margins 0 (tight) or 0.2 (fails); radii chosen to sit
    # above every dtype's bound (0.1), between float16's and bfloat16's (1e-3: bounds 9.77e-4
    # and 7.8e-3), and below float32's (1e-7: bound 1.19e-7)
    margin = np.array([0.0, 0.0, 0.2, 0.0]).reshape(4, 1, 1)
    radius = np.array([0.1, 1e-3, 1e-3, 1e-7]).reshape(4, 1, 1)
    model = FixtureModel(margin=margin, status=np.full((4, 1, 1), OK, np.int8),
                         token_sets=("all",), radius=radius, t_max=3)
    return write_store(tmp_path_factory.mktemp("precision") / "s.zarr", {"alpha": model})


def test_decided_and_undecided_counts_per_dtype(store):
    table = build_report(open_results(store), str(store)).precision
    rows = {r["dtype"]: r for r in table.to_dict("records")}
    assert (rows["float32"]["decided_tight"], rows["float32"]["decided_not_tight"],
            rows["float32"]["undecided"]) == (2, 1, 1)
    assert (rows["float16"]["decided_tight"], rows["float16"]["decided_not_tight"],
            rows["float16"]["undecided"]) == (2, 1, 1)
    assert (rows["bfloat16"]["decided_tight"], rows["bfloat16"]["decided_not_tight"],
            rows["bfloat16"]["undecided"]) == (1, 0, 3)
    assert rows["bfloat16"]["rate_low"] == 0.25 and rows["bfloat16"]["rate_high"] == 1.0
    assert rows["float32"]["extraction_dtype"] and not rows["bfloat16"]["extraction_dtype"]


def test_precision_is_in_the_json_and_the_markdown(store):
    report = build_report(open_results(store), str(store))
    assert '"precision": [' in render_json(report)
    assert "| alpha | all | float32 * | 2/4 (50.0%) | 1/4 (25.0%) | 1/4 (25.0%) | " \
           "[50.0%, 75.0%] |" in render_markdown(report)


def test_undecided_is_called_an_upper_bound_on_what_rounding_flips(store):
    """The radius is a lower bound of the distance to a flip, so every verdict the rounding can
    flip is undecided: the count bounds the flips from above, and the report says so (and
    points to the command that measures a model run in the dtype)."""
    import sweep.report.precision as precision

    text = render_markdown(build_report(open_results(store), str(store)))
    intro = precision.PRECISION_INTRO[0]
    assert intro in text
    assert "upper bound on the verdicts that rounding flips" in intro
    assert "sweep precision" in intro
    for words in (text, precision.__doc__):
        assert "lower bound on the fragile share" not in words
        assert "undecided counts are a lower bound" not in words


def test_bootstrap_report_names_its_method_everywhere(store, capsys):
    from sweep.cli.entry import main

    assert main(["report", str(store), "--format", "json", "--ci", "bootstrap",
                 "--resamples", "200", "--seed", "3"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["ci_method"] == "bootstrap"
    for key, records in document.items():
        if isinstance(records, list):
            method = "bootstrap" if key in ("summary", "controls", "nulls", "intervals") else (
                "wilson")
            assert all(r["ci_method"] == method for r in records), key
    (row,) = document["intervals"]
    # 4 inputs of one cell each: the cluster bootstrap is the plain bootstrap of 3/4
    assert (row["inputs"], row["cells"], row["rate"]) == (4, 4, 0.75)
    assert row["bootstrap_low"] in (0.25, 0.5) and row["bootstrap_high"] == 1.0
    assert document["summary"][0]["ci_low"] == row["bootstrap_low"]


def test_a_store_written_before_radii_reads_and_resumes_without_them(tmp_path):
    import shutil

    import zarr

    from storage.store import write_results
    from tests.store_fixtures import hand_store

    path = hand_store(tmp_path / "old.zarr")
    shutil.rmtree(path / "alpha" / "results" / "radius")
    tree = open_results(path)
    assert "radius" not in tree["alpha"].to_dataset()
    report = build_report(tree, str(path))
    assert report.precision is not None  # beta still has radii: only alpha is left out
    assert set(report.precision["model"]) == {"beta"}
    group = zarr.open_group(path / "alpha", mode="r+")
    fresh = {name: np.asarray(group["results"][name][0:2]) for name in group["results"]}
    fresh["radius"] = np.zeros_like(fresh["margin"])  # what a resumed test task now returns
    arrays = write_results(group, 0, fresh)
    assert "radius" not in arrays

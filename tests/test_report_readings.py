"""The report names each token set's reading, counts < 2-token cells as skipped, and decomposes
the all-token failures by the token kinds of their attaining pairs, on a hand-built store."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import replace

import numpy as np
import pytest

from storage.layout import AttainingKind, ResultStatus
from storage.query import holding_rates, open_results
from sweep.cli.entry import main
from sweep.report.tables import build_report
from tests.store_fixtures import FixtureModel, X, write_store

SETS = ("all", "content", "content-pairs", "content-complement")
OK, ONE = ResultStatus.OK, ResultStatus.ONE_TOKEN
ONLY, CLS, MIXED = AttainingKind.CONTENT_ONLY, AttainingKind.CLS, AttainingKind.MIXED


def gamma() -> FixtureModel:
    """4 inputs x 2 layers. Margins (input, layer), X fails:

        all                 [0 X] [X X] [X 0] [0 0]   failures (0,1) (1,0) (1,1) (2,0)
        kind on all         the failures are CLS, CLS, content-only, mixed
        content             [0 0] [X 0] [0 0] [0 0]
        content-pairs       [0 X] [X 0] [X 0] [0 0]
        content-complement  [0 0] [- 0] [X 0] [0 0]   (1,0) keeps one token: skipped
    """
    margins = {
        "all": [[0, X], [X, X], [X, 0], [0, 0]],
        "content": [[0, 0], [X, 0], [0, 0], [0, 0]],
        "content-pairs": [[0, X], [X, 0], [X, 0], [0, 0]],
        "content-complement": [[0, 0], [np.nan, 0], [X, 0], [0, 0]],
    }
    margin = np.stack([np.array(margins[s], dtype=np.float64) for s in SETS], axis=-1)
    status = np.full(margin.shape, OK, dtype=np.int8)
    status[1, 0, 3] = ONE
    kind = np.full(margin.shape, ONLY, dtype=np.int8)
    kind[0, 1, 0], kind[1, 0, 0], kind[2, 0, 0] = CLS, CLS, MIXED
    return FixtureModel(margin=margin, status=status, token_sets=SETS, attaining_kind=kind)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    plain = FixtureModel(margin=np.array([[[X]]]), status=np.full((1, 1, 1), OK, np.int8),
                         token_sets=("all",), attaining_kind=np.full((1, 1, 1), ONLY, np.int8))
    return write_store(tmp_path_factory.mktemp("readings") / "sweep.zarr",
                       {"gamma": gamma(), "plain": plain})


def test_one_token_cells_are_skipped_not_scored(store):
    rates = holding_rates(open_results(store))
    cell = rates[(rates["model"] == "gamma") & (rates["layer"] == 0)
                 & (rates["token_set"] == "content-complement")].iloc[0]
    assert (cell["cells"], cell["holding"], cell["skipped"], cell["pending"]) == (3, 2, 1, 0)


def test_attribution_decomposes_the_all_token_failures(store):
    table = build_report(open_results(store)).attribution
    gamma_rows = table[table["model"] == "gamma"].set_index("kind")
    assert list(gamma_rows.index) == ["content-only", "CLS", "mixed"]
    assert gamma_rows["failures"].sum() == 4 and set(gamma_rows["failing_all"]) == {4}
    columns = ["failures", "content_holding", "content_tested", "content_pairs_holding",
               "content_pairs_tested", "content_complement_holding", "content_complement_tested"]
    assert gamma_rows.loc["CLS", columns].tolist() == [2, 1, 2, 0, 2, 1, 1]
    assert gamma_rows.loc["content-only", columns].tolist() == [1, 1, 1, 1, 1, 1, 1]
    assert gamma_rows.loc["mixed", columns].tolist() == [1, 1, 1, 0, 1, 0, 1]
    assert gamma_rows.loc["CLS", "rate"] == pytest.approx(0.5)
    plain = table[table["model"] == "plain"].iloc[0]  # a model with no content reading
    assert (plain["kind"], plain["failures"], plain["content_tested"]) == ("content-only", 1, None)


def test_a_loose_tolerance_leaves_nothing_to_attribute(tmp_path):
    small = replace(gamma(), margin=np.where(gamma().margin == X, 5e-7, gamma().margin))
    store = write_store(tmp_path / "sweep.zarr", {"gamma": small})
    assert not build_report(open_results(store)).attribution.empty
    assert build_report(open_results(store), tol=1e-6).attribution.empty


def test_json_csv_and_markdown_name_the_reading(store, capsys):
    assert main(["report", str(store), "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert sum(r["failures"] for r in document["attribution"] if r["model"] == "gamma") == 4
    readings = {r["token_set"]: r["reading"] for r in document["summary"]}
    assert readings["content"] == "content (A[C,C], renormalised)"
    assert readings["content-pairs"].startswith("content-pairs (")
    assert all("reading" in r for key in ("rates", "depth", "failures", "token_counts", "rollout")
               for r in document[key])
    assert main(["report", str(store), "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert {r["reading"] for r in rows if r["token_set"] == "content-complement"} == {
        "content-complement (A[C,C] + A[C,S] (I - A[S,S])^-1 A[S,C])"}
    assert main(["report", str(store)]) == 0
    text = capsys.readouterr().out
    headline = text.split("## 1.")[1].split("## 2.")[0]
    assert "| content (A[C,C], renormalised) |" in headline
    assert "| content-complement (A[C,C] + A[C,S] (I - A[S,S])^-1 A[S,C]) |" in headline
    assert "| gamma | CLS | 2 | 50.0% [15.0%, 85.0%] (2/4) | 1/2 | 0/2 | 1/1 |" in text

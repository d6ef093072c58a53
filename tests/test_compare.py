"""`sweep compare A B`: both rates per model and token set (and layer), their difference with a
paired interval where the inputs match (else unpaired), the cells whose verdict differs; one line
and exit 2 when the stores share nothing. Local folders and an S3 store alike."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import zarr

from storage.errors import InputError
from storage.query.compare import compare_stores
from sweep.cli.entry import main
from tests.s3_fixtures import OPTIONS, filesystem
from tests.store_fixtures import OK, FixtureModel, hand_store, write_store


def only(table, **keys):
    for key, value in keys.items():
        table = table[table[key] == value]
    assert len(table) == 1, keys
    return table.iloc[0]


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """a: the hand store; b: the same inputs with one verdict flipped (alpha, input 0, layer 2,
    all: fails in a, holds in b); c: alpha's inputs with other digests (other content)."""
    folder = tmp_path_factory.mktemp("compare")
    a = hand_store(folder / "a.zarr")
    b = folder / "b.zarr"
    shutil.copytree(a, b)
    holds = zarr.open_array(str(b / "alpha" / "results" / "holds"), mode="r+")
    assert not holds[0, 2, 0, 0]
    holds[0, 2, 0, 0] = True
    c = folder / "c.zarr"
    shutil.copytree(a, c)
    digests = zarr.open_array(str(c / "alpha" / "input_digest"), mode="r+")
    digests[...] = np.array([f"{i + 100:064x}" for i in range(digests.shape[0])])
    return a, b, c


def test_a_store_against_itself_differs_nowhere(stores):
    a, _, _ = stores
    table = compare_stores(a, a)
    assert (table["difference"] == 0).all() and (table["differ"] == 0).all()
    assert (table["interval"] == "paired").all()
    alpha = only(table, model="alpha", token_set="all")
    assert (alpha["cells_a"], alpha["holding_a"], alpha["compared"]) == (12, 7, 12)
    assert (alpha["ci_low"], alpha["ci_high"]) == (0, 0)  # paired: the same inputs each draw


def test_one_flipped_verdict_is_one_differing_cell_with_a_paired_interval(stores):
    a, b, _ = stores
    table = compare_stores(a, b)
    alpha = only(table, model="alpha", token_set="all")
    assert (alpha["holding_a"], alpha["holding_b"], alpha["cells_a"], alpha["cells_b"]) == (
        7, 8, 12, 12)
    assert alpha["difference"] == pytest.approx(-1 / 12)
    assert (alpha["compared"], alpha["differ"]) == (12, 1)
    assert alpha["interval"] == "paired"
    assert alpha["ci_low"] <= -1 / 12 <= alpha["ci_high"] <= 0
    assert only(table, model="alpha", token_set="content")["differ"] == 0
    assert only(table, model="beta", token_set="all")["difference"] == 0
    by_layer = compare_stores(a, b, by=("layer",))
    assert only(by_layer, model="alpha", token_set="all", layer=2)[
        ["holding_a", "holding_b", "differ"]].tolist() == [1, 2, 1]
    assert only(by_layer, model="alpha", token_set="all", layer=0)["differ"] == 0


def test_other_input_digests_give_an_unpaired_interval_and_no_cells_compared(stores):
    a, _, c = stores
    alpha = only(compare_stores(a, c), model="alpha", token_set="all")
    assert alpha["interval"] == "unpaired" and alpha["compared"] == 0
    assert alpha["ci_low"] < 0 < alpha["ci_high"]  # the same rates, resampled apart
    assert only(compare_stores(a, c), model="beta", token_set="all")["interval"] == "paired"


def test_cli_prints_both_rates_and_exit_0(stores, capsys):
    a, b, _ = stores
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "alpha | all | 7/12 | 58.3% | 8/12 | 66.7% | -8.3 pp [" in out
    assert "paired | 1/12" in out
    assert main(["compare", str(a), str(b), "--by", "layer", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert {(r["model"], r["layer"]) for r in rows} == {("alpha", 0), ("alpha", 1), ("alpha", 2),
                                                        ("beta", 0)}


def test_stores_sharing_nothing_are_one_line_and_exit_2(stores, tmp_path, capsys):
    a, _, _ = stores
    other = write_store(tmp_path / "other.zarr", {"gamma": FixtureModel(
        np.zeros((1, 1, 1)), np.full((1, 1, 1), OK, np.int8), ("all",))})
    assert main(["compare", str(a), str(other)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "share no model" in error and "gamma" in error
    with pytest.raises(InputError, match="cannot compare by"):
        compare_stores(a, a, by=("head",))


@pytest.mark.s3
def test_cli_compares_s3_stores_as_it_does_local_ones(stores, s3_bucket, capsys):
    a, b, _ = stores
    fs = filesystem()
    for name, path in (("a", a), ("b", b)):
        fs.put(str(path), f"{s3_bucket}/{name}.zarr", recursive=True)
    option = f"endpoint_url={OPTIONS['endpoint_url']}"
    assert main(["compare", f"s3://{s3_bucket}/a.zarr", f"s3://{s3_bucket}/b.zarr",
                 "--storage-option", option, "--format", "json"]) == 0
    remote = json.loads(capsys.readouterr().out)["rows"]
    assert main(["compare", str(a), str(b), "--format", "json"]) == 0
    assert remote == json.loads(capsys.readouterr().out)["rows"]

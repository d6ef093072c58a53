"""Measured flips (`sweep precision`, sweep/report/precision_flips.py) on a small in-process sweep
of tiny randomly initialised models (a text encoder with its control, an FT-Transformer trained
into the store's own checkpoint cache): re-extraction at the stored dtype reproduces the stored
attention bit for bit and flips nothing; at bfloat16 the flips are the verdicts that changed,
counted against an independent float64 check, split by the stored radius into undecided and
decided; the sample and the batches are the sweep's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import zarr

from storage.layout import ResultStatus
from storage.location import StoreRef
from storage.query import open_results
from sweep.cli.entry import main
from sweep.config.load import load_config
from sweep.driver.runner import InProcessExecutor, run_sweep
from sweep.report.precision import precision_table
from sweep.report.precision_flips import (
    FLIP_COLUMNS,
    measure,
    reextraction,
    sample_indices,
    sweep_batches,
)
from workers.exact.equality import check

TOL = 1e-12


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("flips")
    (folder / "sweep.yaml").write_text("\n".join([
        "store: sweep.zarr", "shard_size: 3", f"tol: {TOL}", "token_sets: [all, content]",
        "matched_nulls: null",
        "datasets:",
        "  topics: {source: 'pydoc:topics', limit: 7}",
        "  wine: {source: 'sklearn:wine'}",
        "models:",
        "  rob: {source: tiny-roberta, dataset: topics, batch_size: 2, control: random-init}",
        "  ft: {source: ft-transformer, dataset: wine, options: {max_epochs: 3, n_blocks: 2}}",
    ]) + "\n")
    config = load_config(folder / "sweep.yaml")
    summary = run_sweep(config, InProcessExecutor(), progress=False)
    assert summary.exit_code == 0, summary.lines()
    return Path(config.store)


def test_the_sample_takes_the_same_ids_whatever_their_order():
    ids = [f"line-{k}" for k in range(40)]
    first = sample_indices(ids, 7, seed=0)
    assert len(first) == 7 and list(first) == sorted(first)
    shuffled = ids[::-1]
    assert {ids[i] for i in first} == {shuffled[i] for i in sample_indices(shuffled, 7, 0)}
    assert {ids[i] for i in first} != {ids[i] for i in sample_indices(ids, 7, seed=1)}
    assert list(sample_indices(ids, 40, 0)) == list(range(40)) == list(
        sample_indices(ids, None))


def test_each_input_is_extracted_in_its_sweep_batch():
    # shards of 4 inputs [0, 4), [4, 8), [8, 9), batches of 3 from each shard's start
    assert sweep_batches([0, 2, 5, 7, 8], shard_size=4, batch_size=3, n_inputs=9) == {
        (0, 3): [0, 2], (4, 7): [5], (7, 8): [7], (8, 9): [8]}


@pytest.mark.parametrize("name", ["rob", "rob@random-init", "ft"])
def test_reextraction_at_the_stored_dtype_is_the_stored_attention(store, name):
    again = reextraction(StoreRef.of(str(store)), name, "float32", device="cpu")
    attention = again.group["attention"]
    for i, out in again.extract(range(len(again.ids))):
        t = out.by_head.shape[-1]
        np.testing.assert_array_equal(out.by_head, attention[i, :, :, :t, :t], err_msg=str(i))


def test_the_stored_dtype_flips_nothing_and_counts_every_stored_verdict(store):
    table = measure(StoreRef.of(str(store)), "float32", device="cpu")
    assert list(table.columns) == FLIP_COLUMNS
    assert set(table["model"]) == {"rob", "rob@random-init", "ft"}
    assert (table["flipped"] == 0).all() and (table["lost"] == 0).all()
    root = zarr.open_group(str(store), mode="r")
    for r in table.to_dict("records"):
        status = root[r["model"]]["results"]["status"][...]
        s = ["all", "content"].index(r["token_set"])
        assert r["cells"] == int((status[..., s] == ResultStatus.OK).sum())
        assert r["inputs"] == status.shape[0]


def float64_verdicts(by_head: np.ndarray) -> np.ndarray:
    """(layer,) verdicts of the head-averaged all-token attention: rows renormalised in
    float64, margin <= TOL (the definition, `workers.exact.equality.check`)."""
    a = by_head[:, 0].astype(np.float64)
    a /= a.sum(axis=-1, keepdims=True)
    return np.array([bool(check(layer, tol=TOL).holds) for layer in a])


def test_bfloat16_flips_are_the_verdicts_that_changed(store):
    ref = StoreRef.of(str(store))
    table = measure(ref, "bfloat16", device="cpu").set_index(["model", "token_set"])
    root = zarr.open_group(str(store), mode="r")
    tree = open_results(str(store))
    bounds = precision_table(tree).set_index(["model", "token_set", "dtype"])
    changed_somewhere = False
    for name in ("rob", "rob@random-init", "ft"):
        stored = root[name]["results"]
        again = reextraction(ref, name, "bfloat16", device="cpu")
        attention = again.group["attention"]
        flips = 0
        for i, out in again.extract(range(len(again.ids))):
            t = out.by_head.shape[-1]
            changed_somewhere |= not np.array_equal(out.by_head, attention[i, :, :, :t, :t])
            ok = stored["status"][i, :, 0, 0] == ResultStatus.OK
            flips += int((float64_verdicts(out.by_head)[ok]
                          != stored["holds"][i, :, 0, 0][ok]).sum())
        row = table.loc[(name, "all")]
        assert row["flipped"] == flips  # an independent float64 check of the same matrices
        assert row["flipped"] == row["flipped_undecided"] + row["flipped_decided"]
        for token_set in ("all", "content"):  # every input sampled: the precision table's count
            assert table.loc[(name, token_set), "undecided"] == \
                bounds.loc[(name, token_set, "bfloat16"), "undecided"]
            assert table.loc[(name, token_set), "stored_dtype"] == "float32"
    assert changed_somewhere  # the models really ran in bfloat16


def test_the_command_prints_a_sample_and_refuses_an_unknown_model(store, capsys):
    assert main(["precision", str(store), "--dtype", "bfloat16", "--sample", "2", "--model",
                 "rob", "--model", "rob@random-init", "--device", "cpu",
                 "--format", "json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert [(r["model"], r["token_set"]) for r in records] == [
        ("rob", "all"), ("rob", "content"), ("rob@random-init", "all"),
        ("rob@random-init", "content")]
    assert all(r["inputs"] == 2 and r["dtype"] == "bfloat16" for r in records)
    assert main(["precision", str(store), "--dtype", "bfloat16", "--model", "nope"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no model 'nope'" in err[0]


def test_a_missing_checkpoint_is_refused_not_retrained(store, tmp_path, capsys):
    import shutil

    copy = tmp_path / "copy.zarr"
    shutil.copytree(store, copy)
    cache = copy / ".sweep" / "cache"
    checkpoints = sorted(cache.glob("ft-transformer-*.safetensors"))
    assert checkpoints  # the sweep trained ft into the store's own cache
    for path in checkpoints:
        path.unlink()
    assert main(["precision", str(copy), "--dtype", "bfloat16", "--model", "ft"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sweep precision never trains" in err[0]
    assert not sorted(cache.glob("ft-transformer-*.safetensors"))  # nothing written

"""The `content-pairs` null is drawn as the reading is: T x T matrices, kappa over the pairs of
|C| rows only (full rows), at each cell's (T, |C|)."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from storage.fingerprint import fingerprint
from storage.layout import ResultStatus
from storage.query import open_results
from storage.store import StoreMismatchError, create_root, ensure_matched_nulls
from sweep.driver.plan import NullTask
from tests.store_fixtures import FixtureModel, write_store
from workers.nulls.baseline import chunk_span
from workers.nulls.matched import (
    SizeHistogram,
    count_full_row_holding,
    matched_holding,
    size_histograms,
)
from workers.nulls.registry import count_holding, get_null
from workers.tasks.nulls import run_null

OK, EMPTY = ResultStatus.OK, ResultStatus.EMPTY_ROW
SETS = ("all", "content-pairs")


def test_full_row_sizes_pair_each_cells_tokens_with_its_rows():
    # (input, layer, token_set): inputs of 5, 3 and 6 tokens, 2 layers, (all, content-pairs)
    n_tokens = np.array([5, 3, 6])
    n_kept = np.array([[[5, 3], [5, 3]], [[3, 1], [3, 1]], [[6, 4], [6, 4]]])
    status = np.full(n_kept.shape, OK, dtype=np.int8)
    status[2, 1, :] = EMPTY
    every, pairs = size_histograms(n_kept, status, n_tokens, SETS)
    assert (every.sizes, every.counts) == ((3, 5, 6), (2, 2, 1))
    assert (pairs.sizes, pairs.counts) == (((5, 3), (6, 4)), (2, 1))  # |C| = 1: no pair
    assert pairs.trial_sizes(6, 0, 6).tolist() == [[5, 3]] * 4 + [[6, 4]] * 2


def test_one_compared_pair_holds_iff_it_is_mutually_self_dominant():
    # T = 4, rows 2 and 3 compared: kappa_C(M) = (1 + kappa_23(A))/2 - [(A_32 - A_22)+ +
    # (A_23 - A_33)+]/2, so tight iff A_22 >= A_32 and A_33 >= A_23 (docs/readings.md)
    null = get_null("uniform")
    holding, disagreements = count_full_row_holding(null, np.random.default_rng(5), 4, 2, 3000)
    a = null.draw(np.random.default_rng(5), 3000, 4)
    by_hand = (a[:, 2, 2] >= a[:, 3, 2]) & (a[:, 3, 3] >= a[:, 2, 3])
    assert disagreements == 0 and holding == int(np.count_nonzero(by_hand))
    assert 0.2 < holding / 3000 < 0.5  # not the n = 2 null's one half: the rows are longer


@pytest.mark.parametrize("null", ["uniform", "softmax-b2", "qk-d4"])
def test_with_no_special_token_it_is_the_all_token_null(null):
    # |C| = T: every pair is compared, so content-pairs is `check` of the whole matrix
    full = count_full_row_holding(get_null(null), np.random.default_rng(9), 6, 6, 1500)
    assert full == count_holding(get_null(null), np.random.default_rng(9), 6, 1500)


@pytest.fixture
def store(tmp_path):
    path = write_store(tmp_path / "s.zarr", {
        "m": FixtureModel(margin=np.zeros((3, 2, 2)), status=np.full((3, 2, 2), OK, np.int8),
                          token_sets=SETS, n_tokens=np.array([4, 6, 6]), t_max=6),
    })
    n_kept = zarr.open_group(str(path / "m" / "results"), mode="r+")["n_kept"]
    values = n_kept[...]
    values[..., 1] -= 1  # content-pairs compares the rows of every token but the CLS
    n_kept[...] = values
    return path


def test_the_task_draws_content_pairs_at_each_cells_tokens_and_rows(store):
    ensure_matched_nulls(create_root(store), "m", nulls=("uniform",), token_sets=SETS,
                         trials=1000, seed=0, chunk_trials=1000, n_chunks=1, tol=1e-12)
    run_null(NullTask("nulls-m-uniform-c00000", str(store), "m", "uniform", 0, 0,
                      chunk_span(1000, 1000, 0), SETS, 0, 1e-12))
    nulls = open_results(store)["m"]["nulls"].to_dataset().sel(null="uniform")
    for token_set, sizes, counts in [("all", (4, 6), (2, 4)),
                                     ("content-pairs", ((4, 3), (6, 5)), (2, 4))]:
        expected = matched_holding(SizeHistogram(sizes, counts), 1000, [(0, 1000)], model="m",
                                   token_set=token_set, null="uniform", seed=0, tol=1e-12)
        got = nulls.sel(token_set=token_set)
        assert (int(got["trials"]), int(got["holding"]), int(got["disagreements"])) == expected


def test_content_pairs_nulls_counted_the_old_way_are_refused_by_fingerprint(store):
    root = create_root(store)
    ensure_matched_nulls(root, "m", nulls=("uniform",), token_sets=SETS, trials=1000, seed=0,
                         chunk_trials=1000, n_chunks=1, tol=1e-12)
    group = root["m"]["nulls"]
    old = {k: v for k, v in group.attrs["fingerprint_inputs"].items()
           if k != "content_pairs_null"}
    group.attrs.update({"fingerprint_inputs": old, "fingerprint": fingerprint(old)})
    with pytest.raises(StoreMismatchError, match=r"matched_nulls\.content_pairs_null"):
        ensure_matched_nulls(create_root(store), "m", nulls=("uniform",), token_sets=SETS,
                             trials=1000, seed=0, chunk_trials=1000, n_chunks=1, tol=1e-12)

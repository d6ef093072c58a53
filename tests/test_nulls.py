"""Named nulls: each draw function against hand computations, seeds, names and size refusals."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from storage.errors import InputError
from sweep.config.load import parse_config
from workers.exact.equality import check
from workers.nulls.baseline import BLOCK, baseline_blocks, holding_in_blocks, run_baseline
from workers.nulls.registry import (
    NULLS,
    check_sizes_fit,
    draw_softmax,
    draw_uniform_stochastic,
    get_null,
    matrix_bytes,
    parse_nulls,
    stable_int,
)


def test_registry_names_the_uniform_and_four_softmax_nulls():
    assert list(NULLS) == ["uniform", "softmax-b0.5", "softmax-b1", "softmax-b2", "softmax-b4"]
    for name, null in NULLS.items():
        assert null.name == name and null.doc


@pytest.mark.parametrize("name", list(NULLS))
def test_every_null_draws_row_stochastic_float64_batches(name):
    a = NULLS[name].draw(np.random.default_rng(1), 7, 5)
    assert a.shape == (7, 5, 5) and a.dtype == np.float64
    assert (a > 0).all()
    np.testing.assert_allclose(a.sum(axis=2), 1.0, rtol=0, atol=1e-15)


@pytest.mark.parametrize("beta", [0.5, 1.0, 2.0, 4.0])
def test_softmax_rows_are_the_softmax_of_beta_times_the_generators_normals(beta):
    z = np.random.default_rng(5).standard_normal((3, 4, 4))  # the same stream, drawn by hand
    by_hand = np.exp(beta * z) / np.exp(beta * z).sum(axis=2, keepdims=True)
    drawn = NULLS[f"softmax-b{beta:g}"].draw(np.random.default_rng(5), 3, 4)
    np.testing.assert_allclose(drawn, by_hand, rtol=1e-13, atol=0)
    np.testing.assert_allclose(draw_softmax(np.random.default_rng(5), 3, 4, beta), by_hand,
                               rtol=1e-13, atol=0)


def test_softmax_at_a_huge_beta_subtracts_the_row_maximum_and_stays_finite():
    z = 300.0 * np.random.default_rng(2).standard_normal((2, 3, 3))  # exp(z) would overflow
    shifted = np.exp(z - z.max(axis=2, keepdims=True))
    by_hand = shifted / shifted.sum(axis=2, keepdims=True)
    drawn = draw_softmax(np.random.default_rng(2), 2, 3, beta=300.0)
    assert np.isfinite(drawn).all()
    np.testing.assert_allclose(drawn, by_hand, rtol=1e-12, atol=1e-300)


def test_softmax_of_a_two_logit_row_by_hand():
    class FixedNormals:  # a generator stand-in whose normals are chosen by hand
        def standard_normal(self, size):
            return np.array([0.0, np.log(3.0), 1.0, 1.0]).reshape(size)

    a = draw_softmax(FixedNormals(), 1, 2, beta=1.0)  # rows softmax(0, ln 3) and softmax(1, 1)
    np.testing.assert_allclose(a[0], [[0.25, 0.75], [0.5, 0.5]], rtol=0, atol=1e-15)
    # n = 2: tight iff A_11 >= A_21 (0.25 < 0.5: not tight)
    assert not check(a).holds[0]


def test_larger_beta_gives_peakier_rows():
    peaks = [NULLS[f"softmax-b{b}"].draw(np.random.default_rng(0), 200, 16).max(axis=2).mean()
             for b in ("0.5", "1", "2", "4")]
    assert peaks == sorted(peaks) and peaks[0] < 0.2 < 0.5 < peaks[-1]


def test_uniform_rows_are_dirichlet_one():
    a = draw_uniform_stochastic(np.random.default_rng(0), 4000, 3)
    # Dirichlet(1, 1, 1): each coordinate has mean 1/3 and variance 1/18.
    np.testing.assert_allclose(a.mean(axis=(0, 1)), 1 / 3, atol=0.01)
    np.testing.assert_allclose(a.var(axis=(0, 1)), 1 / 18, atol=0.005)


@pytest.mark.parametrize("name", list(NULLS))
def test_at_n_two_every_null_is_tight_half_the_time(name):
    # iid rows with exchangeable entries: P(A_11 >= A_21) = 1/2 exactly.
    (record,) = run_baseline([2], 4000, 11, nulls=[name])
    assert record["null"] == name
    assert record["ci_low"] < 0.5 < record["ci_high"]
    assert record["disagreements"] == 0


def test_uniform_keeps_the_original_stream_bit_for_bit():
    # The definition from before named nulls: block k of size n draws from
    # SeedSequence(seed, spawn_key=(n, k)) normalised exponentials, 32 MiB at a time.
    n, seed, holding = 6, 9, 0
    for k, count in baseline_blocks(2300):
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(n, k)))
        e = rng.standard_exponential(size=(count, n, n))
        holding += int(check(e / e.sum(axis=2, keepdims=True), validate=False).holds.sum())
    assert holding_in_blocks(n, seed, baseline_blocks(2300)) == (holding, 0)


def test_each_null_has_its_own_stream_and_a_stable_code():
    counts = {name: holding_in_blocks(4, 0, [(0, BLOCK)], null=name)[0] for name in NULLS}
    assert len(set(counts.values())) > 1  # not one stream under five names
    assert NULLS["uniform"].config_key(4, 7) == (4, 7)
    assert NULLS["softmax-b1"].config_key(4, 7) == (4, 7, stable_int("null:softmax-b1"))
    codes = [null.code for null in NULLS.values()]
    assert len(set(codes)) == len(codes)
    # sha256-based: the same in every process (Python's hash() of a str is not)
    digest = hashlib.sha256(b"null:uniform").digest()
    assert stable_int("null:uniform") == int.from_bytes(digest[:8], "big")


def test_names_parse_from_lists_comma_lists_and_all():
    assert parse_nulls(["uniform"]) == ("uniform",)
    assert parse_nulls(["softmax-b1,uniform", "softmax-b1"]) == ("softmax-b1", "uniform")
    assert parse_nulls("all") == tuple(NULLS)


@pytest.mark.parametrize("bad", [["softmax"], ["uniform,"], ["Uniform"], []])
def test_unknown_names_are_one_line_errors_naming_the_valid_ones(bad):
    with pytest.raises(InputError) as error:
        parse_nulls(bad)
    message = str(error.value)
    assert "\n" not in message and ("softmax-b0.5" in message or "at least one" in message)
    with pytest.raises(InputError, match="unknown null 'x'; choose from uniform, softmax-b0.5"):
        get_null("x")


def test_config_lists_nulls_defaulting_to_all():
    config = parse_config({"store": "/tmp/s.zarr", "baseline": {"sizes": [2], "trials": 10}})
    assert config.baseline.nulls == tuple(NULLS)
    assert config.matched_nulls.nulls == tuple(NULLS)
    chosen = parse_config({"store": "/tmp/s.zarr", "matched_nulls": {"nulls": "uniform"},
                           "baseline": {"sizes": [2], "trials": 10, "nulls": ["softmax-b4"]}})
    assert chosen.baseline.nulls == ("softmax-b4",)
    assert chosen.matched_nulls.nulls == ("uniform",)
    assert parse_config({"store": "/tmp/s.zarr", "matched_nulls": None}).matched_nulls is None


@pytest.mark.parametrize(("section", "value", "message"), [
    ("baseline", {"sizes": [2], "trials": 10, "nulls": ["softmax-b3"]},
     "baseline.nulls: .*unknown null 'softmax-b3'; choose from all, uniform"),
    ("matched_nulls", {"nulls": ["gauss"]}, "matched_nulls.nulls: .*unknown null 'gauss'"),
    ("matched_nulls", {"chunk_trials": 1500}, "matched_nulls.chunk_trials: .*multiple of 1000"),
    ("baseline", {"sizes": [2, 3], "trials": 10**8},
     "baseline: .*trial-chunk tasks .*raise chunk_trials to at least"),
    ("baseline", {"sizes": [2, 3], "trials": 10**12},
     "baseline.trials: .*trials; at most 100000000 "),
])
def test_bad_null_config_is_one_line_naming_the_key(section, value, message):
    with pytest.raises(InputError, match=message) as error:
        parse_config({"store": "/tmp/s.zarr", section: value})
    assert "\n" not in str(error.value)


def test_sizes_whose_matrices_cannot_fit_are_refused_in_one_line():
    check_sizes_fit([2, 256], memory=2**30)  # fits: no error
    with pytest.raises(InputError, match=r"size 20000: .*needs 11.9 GiB.*1.0 GiB") as error:
        check_sizes_fit([2, 20000], memory=2**30)
    assert "\n" not in str(error.value)
    assert matrix_bytes(20000) == 4 * 8 * 20000**2
    with pytest.raises(InputError, match="size 10000000"):
        run_baseline([2, 10**7], 10, 0)  # refused before any trial, whatever the machine
    with pytest.raises(InputError, match="baseline.sizes: .*size 10000000"):
        parse_config({"store": "/tmp/s.zarr", "baseline": {"sizes": [10**7], "trials": 10}})


def test_qk_null_of_a_one_dimensional_head_by_hand():
    # n = 2, d = 1, beta = 1: Q = (q0, q1), K = (k0, k1) are the generator's first four normals
    # (Q then K); row i = softmax(q_i k_0, q_i k_1), so A_i0 = 1 / (1 + exp(q_i (k1 - k0)))
    q0, q1, k0, k1 = np.random.default_rng(11).standard_normal(4)
    by_hand = np.array([[1 / (1 + np.exp(q0 * (k1 - k0))), 0.0],
                        [1 / (1 + np.exp(q1 * (k1 - k0))), 0.0]])
    by_hand[:, 1] = 1 - by_hand[:, 0]
    drawn = get_null("qk-d1").draw(np.random.default_rng(11), 1, 2)
    np.testing.assert_allclose(drawn[0], by_hand, rtol=1e-14, atol=0)


@pytest.mark.parametrize(("name", "d", "beta"), [("qk-d4", 4, 1.0), ("qk-d3-b2.5", 3, 2.5)])
def test_qk_rows_are_softmax_of_scaled_query_key_products(name, d, beta):
    x = np.random.default_rng(7).standard_normal((5, 2, 6, d))  # (matrix, Q|K, token, dim)
    logits = beta * np.einsum("mid,mjd->mij", x[:, 0], x[:, 1]) / np.sqrt(d)
    by_hand = np.exp(logits) / np.exp(logits).sum(axis=2, keepdims=True)
    drawn = get_null(name).draw(np.random.default_rng(7), 5, 6)
    np.testing.assert_allclose(drawn, by_hand, rtol=1e-12, atol=0)
    assert name in parse_nulls(["uniform", name]) and get_null(name).code == stable_int(
        f"null:{name}")


def test_qk_null_at_n_2_is_tight_half_the_time():
    # tight iff A_00 >= A_10 iff (q0 - q1).(k0 - k1) >= 0 for d = 1: probability exactly 1/2
    a = get_null("qk-d1").draw(np.random.default_rng(3), 20000, 2)
    rate = check(a, validate=False).holds.mean()
    assert abs(rate - 0.5) < 0.015  # 4.2 standard errors


@pytest.mark.parametrize("name", ["qk-d0", "qk-d8-b0", "qk-d8-bx", "qk-8"])
def test_malformed_qk_names_are_refused_in_one_line(name):
    with pytest.raises(InputError, match=f"unknown null '{name}'; choose from all, uniform"):
        parse_nulls([name])


def test_qk_nulls_are_named_in_the_baseline_and_the_matched_nulls_and_counted():
    chosen = parse_config({"store": "/tmp/s.zarr", "matched_nulls": {"nulls": "qk-d8,qk-d8-b4"},
                           "baseline": {"sizes": [2], "trials": 10, "nulls": ["qk-d1"]}})
    assert chosen.baseline.nulls == ("qk-d1",)
    assert chosen.matched_nulls.nulls == ("qk-d8", "qk-d8-b4")
    holding, disagreements = holding_in_blocks(2, 0, baseline_blocks(2 * BLOCK), null="qk-d1")
    assert disagreements == 0 and 0.45 * 2 * BLOCK < holding < 0.55 * 2 * BLOCK

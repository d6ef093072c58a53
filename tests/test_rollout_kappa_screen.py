"""kappa of rollout products (`kappa_only`: `pruned.kappa_over_matrices`, handing ties to the
float32 screen `kernel.kappa_one32`) equals the float64 brute-force oracle bit for bit, the
float64 screen and `check`'s kappa, including ties; the products reuse per-thread buffers."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import threadpoolctl
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.exact import equality, kernel, pruned, scratch
from workers.exact.equality import check, kappa_only, rollout, rollout_products


def oracle_kappa(x: np.ndarray) -> float:
    """max over i < j of 0.5 * (sequential left-to-right float64 sum of |x_ik - x_jk|)."""
    n = x.shape[0]
    if n < 2:
        return 0.0
    sums = np.cumsum(np.abs(x[:, None, :] - x[None, :, :]), axis=2)[:, :, -1]  # sequential
    return float(max(0.5 * sums[i, j] for i in range(n) for j in range(i + 1, n)))


def stochastic(rng: np.random.Generator, layers: int, n: int) -> np.ndarray:
    a = rng.exponential(size=(layers, n, n)) ** 3
    return a / a.sum(axis=-1, keepdims=True)


def adversarial(kind: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """(n, n) matrices whose pairs tie: within the float32 screen's error, or exactly."""
    if kind == "identity":
        return np.eye(n)
    if kind == "identical rows":
        return np.tile(stochastic(rng, 1, n)[0, :1], (n, 1))
    if kind == "near-uniform":
        a = 1.0 + 1e-9 * rng.normal(size=(n, n))
        return a / a.sum(axis=1, keepdims=True)
    if kind == "one-hot":
        return np.eye(n)[rng.integers(0, n, size=n)]
    if kind == "two rows":  # every row one of two distributions: many exact ties at the max
        rows = stochastic(rng, 1, n)[0, :2]
        return rows[rng.integers(0, 2, size=n)]
    raise ValueError(kind)


KINDS = ("identity", "identical rows", "near-uniform", "one-hot", "two rows")


def assert_screens_agree(stack: np.ndarray) -> None:
    """kappa_only == the oracle == the float64 screen == check's kappa, bit for bit."""
    x = np.ascontiguousarray(stack, dtype=np.float64)
    got = kappa_only(x)
    assert got.tolist() == [oracle_kappa(m) for m in x]
    assert np.array_equal(got, kernel.kappa_over_matrices(x, kernel.tile_order(x.shape[1]), 2))
    if x.shape[1] >= 1 and np.allclose(x.sum(axis=-1), 1.0, rtol=0, atol=1e-12):
        assert np.array_equal(got, check(x, validate=False).kappa)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 14), layers=st.integers(1, 4), seed=st.integers(0, 2**32 - 1))
def test_screened_kappa_of_rollout_products_is_the_oracles(n, layers, seed):
    stack = stochastic(np.random.default_rng(seed), layers, n)
    products = rollout_products(stack)
    assert_screens_agree(products)
    assert np.array_equal(kappa_only(stack), check(stack, validate=False).kappa)


@settings(max_examples=25, deadline=None)
@given(kind=st.sampled_from(KINDS), n=st.integers(2, 40), seed=st.integers(0, 2**32 - 1))
def test_adversarial_ties_are_the_oracles(kind, n, seed):
    a = adversarial(kind, n, np.random.default_rng(seed))
    assert_screens_agree(a[None])
    assert_screens_agree(rollout_products(np.stack([a, a])))


@pytest.mark.parametrize("kind", KINDS)
def test_ties_beyond_the_candidate_limit_take_the_float64_screen(kind):
    """n = 67: more than CANDIDATES_PER_ROW * n pairs tie within the float32 error (except
    one-hot rows with few distinct tokens), so the float64 screen narrows them; same result."""
    a = adversarial(kind, 67, np.random.default_rng(1))
    assert_screens_agree(np.stack([a, 0.5 * (np.eye(67) + a)]))


def shifted_kappa(x: np.ndarray) -> tuple[float, int]:
    """(kappa from `pruned.shifted_candidates`' pairs, how many pairs it left) of one matrix."""
    n = x.shape[0]
    _, qs, screens = pruned.buffers(n, False)
    a_i, a_j = pruned.shifted_candidates(x, qs[0], screens[0], np.empty(n))
    return float(kernel.tv_many(x, a_i, a_j, False).max()), a_i.shape[0]


@settings(max_examples=40, deadline=None)
@given(kind=st.sampled_from(KINDS + ("products",)), n=st.integers(2, 40),
       seed=st.integers(0, 2**32 - 1))
def test_the_shifted_screen_keeps_the_pair_attaining_the_oracles_kappa(kind, n, seed):
    """Less its column minima, a matrix screens to candidates among which the oracle's kappa is
    found exactly: rollout products, ties, identical rows (every z = 0), near-uniform rows."""
    rng = np.random.default_rng(seed)
    if kind == "products":
        matrices = rollout_products(stochastic(rng, 6, n))
    else:
        matrices = rollout_products(np.stack([adversarial(kind, n, rng)] * 3))
    for x in np.ascontiguousarray(matrices):
        assert shifted_kappa(x)[0] == oracle_kappa(x)


@pytest.mark.parametrize("scale", [1e-300, 1e-150, 1.0])
def test_the_shifted_screen_handles_rows_of_any_magnitude_and_identical_rows(scale):
    """Rows far below 1 give the screen a huge scale (65280 / their spread): its pair limits
    saturate at 65535 instead of overflowing int64 (which kept no pair at all); identical rows
    leave z = 0 (SHIFT_FLOOR) and every pair, kappa 0."""
    rng = np.random.default_rng(2)
    spread = scale * rng.random((30, 30))
    same = np.tile(scale * rng.random(30), (30, 1))
    for x in (spread, same):
        assert shifted_kappa(x)[0] == oracle_kappa(x)
        assert kappa_only(x[None]).tolist() == [oracle_kappa(x)]


def test_the_shifted_screen_prunes_deep_rollout_products_the_plain_screen_cannot():
    """Deep products of attention-like layers are nearly rank one: the 16-bit screen of the
    matrix itself leaves every pair (its resolution is ~ n / 65280 of a row's mass, here far
    above kappa), the screen less the column minima a few, among them the oracle's pair."""
    rng = np.random.default_rng(7)
    n = 160
    logits = 2.0 * rng.normal(size=(24, n, n))
    logits[:, :, 0] += 4.0
    logits[:, np.arange(n), np.arange(n)] += 2.0
    layers = np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)
    products = rollout_products(layers)
    deep = np.ascontiguousarray(products[-1])
    value, shifted_pairs = shifted_kappa(deep)
    assert value == oracle_kappa(deep) < 1e-3
    assert kappa_only(products[-4:]).tolist() == [oracle_kappa(x) for x in products[-4:]]
    assert shifted_pairs <= kernel.CANDIDATES_PER_ROW * n
    _, qs, screens = pruned.buffers(n, False)
    rmax = pruned.trusted_rmax(deep)
    scale = pruned.scale_for(rmax)
    pruned.quantise_matrix(deep, qs[0], scale)
    pruned.screen_serial(qs[0], n, screens[0])
    plain, _, _ = pruned.kappa_candidates(deep, screens[0], scale,
                                          pruned.bound_constants(n, rmax)[1], 0.0)
    assert plain.shape[0] > kernel.CANDIDATES_PER_ROW * n


def test_the_whole_rollout_matches_the_oracle_on_attention_like_layers():
    rng = np.random.default_rng(5)
    logits = 2.0 * rng.normal(size=(6, 33, 33))
    logits[:, :, 0] += 4.0
    layers = np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)
    kappa_r, _ = rollout(layers)
    x = rollout_products(np.stack([m / m.sum(axis=1, keepdims=True) for m in layers]))
    np.testing.assert_allclose(kappa_r, [oracle_kappa(m) for m in x], rtol=0, atol=1e-12)


def test_reused_products_equal_fresh_ones_and_stay_per_thread():
    """`rollout_products(reuse=True)` returns this thread's buffer, equal to a fresh product;
    another thread's call does not touch it."""
    rng = np.random.default_rng(3)
    first, second = stochastic(rng, 5, 31), stochastic(rng, 5, 31)
    mine = rollout_products(first, reuse=True)
    other = {}
    worker = threading.Thread(target=lambda: other.update(p=rollout_products(second, reuse=True)))
    worker.start()
    worker.join()
    assert np.array_equal(mine, rollout_products(first))
    assert np.array_equal(other["p"], rollout_products(second))
    assert not np.shares_memory(mine, other["p"])


def test_scratch_reuses_memory_until_it_is_too_large():
    small = scratch.scratch("test-buffer", (4, 5))
    again = scratch.scratch("test-buffer", (2, 3))
    assert np.shares_memory(small, again) and again.shape == (2, 3)
    big = (scratch.REUSE_MAX_BYTES // 8 + 1,)
    assert not np.shares_memory(scratch.scratch("test-big", big), scratch.scratch("test-big", big))


def test_rollout_products_run_on_one_blas_thread_and_leave_the_setting_as_it_was(monkeypatch):
    """The products run with every BLAS library on one thread (OpenBLAS's results depend on its
    thread count), libraries loaded after the first rollout included (scipy's, here: this
    module's earlier tests ran rollouts before scipy was imported when it runs alone); where
    BLAS already runs on one thread nothing is changed or restored."""
    seen = []
    real = np.matmul

    def matmul(*args, **kwargs):
        seen.append(blas_threads())
        return real(*args, **kwargs)

    def blas_threads() -> set[int]:
        return {lib["num_threads"] for lib in threadpoolctl.threadpool_info()
                if lib["user_api"] == "blas"}

    monkeypatch.setattr(equality.np, "matmul", matmul)
    layers = stochastic(np.random.default_rng(4), 3, 9)
    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
        if blas_threads() != {2}:
            pytest.skip("this BLAS does not take a thread count of 2")
        rollout_products(layers)
        assert blas_threads() == {2}
    assert seen == [{1}, {1}]
    with threadpoolctl.threadpool_limits(limits=1, user_api="blas"):
        limits = []
        monkeypatch.setattr(equality._blas(), "limit", lambda **kw: limits.append(kw))
        rollout_products(layers)
        assert limits == []  # one thread already: no limit applied, none to restore
    assert seen[2:] == [{1}, {1}]


def test_rollouts_in_worker_threads_one_after_another_each_run_on_one_blas_thread(monkeypatch):
    """threadpoolctl lets only the thread that last set OpenBLAS's count change it until its
    context exits: a second worker thread's rollout must still multiply on one BLAS thread (a
    limit applied and restored outside a context left the first thread in control, and the
    second's products ran on two threads: other bits)."""
    def blas_threads() -> set[int]:
        return {lib["num_threads"] for lib in threadpoolctl.threadpool_info()
                if lib["user_api"] == "blas"}

    before = blas_threads()
    if before == {1}:
        pytest.skip("BLAS runs on one thread here already")
    seen = []
    real = np.matmul

    def matmul(*args, **kwargs):
        seen.append(blas_threads())
        return real(*args, **kwargs)

    monkeypatch.setattr(equality.np, "matmul", matmul)
    layers = stochastic(np.random.default_rng(5), 2, 9)
    first, second = ThreadPoolExecutor(1), ThreadPoolExecutor(1)  # long-lived, as Dask's
    try:
        first.submit(rollout_products, layers).result(30)
        second.submit(rollout_products, layers).result(30)  # while the first thread lives
        first.submit(rollout_products, layers).result(30)
    finally:
        first.shutdown()
        second.shutdown()
    assert seen == [{1}, {1}, {1}]
    assert blas_threads() == before

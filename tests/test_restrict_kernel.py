"""The one-pass restriction (`workers.exact.restrict_kernel`) equals `restrict_layers`' defining
numpy steps bit for bit, at every size the pairwise sum splits at, and raises their errors."""

from __future__ import annotations

import numpy as np
import pytest

from storage.errors import NotStochasticError
from workers.exact.equality import _restrict_layers_numpy, restrict_layers
from workers.exact.kernel import row_sum
from workers.exact.restrict_kernel import STACK_DEPTH, checked_row, pairwise_sum, row_sum_at


@pytest.mark.parametrize("n", [1, 7, 8, 9, 127, 128, 129, 136, 255, 257, 1000, 1370, 4097])
def test_pairwise_sum_is_numpys_sum(n):
    rng = np.random.default_rng(n)
    frames, partial = np.empty((STACK_DEPTH, 3), dtype=np.int64), np.empty(STACK_DEPTH)
    for row in rng.random((20, n)) ** 4:  # skewed rows: the order of additions shows
        assert pairwise_sum(row, n, frames, partial) == row.sum()


@pytest.mark.parametrize("n", [0, 1, 3, 4, 5, 8, 127, 1370])
def test_the_vector_row_sums_are_kernel_row_sum(n):
    """`row_sum_at` (4-lane vectors) and `checked_row` (widening float32 as it sums) add in
    `kernel.row_sum`'s order, at any offset into a flat array."""
    rng = np.random.default_rng(n)
    flat = rng.random(3 + n) ** 4
    assert row_sum_at(flat, 3, n) == row_sum(flat[3:].copy())
    flat32 = flat.astype(np.float32)
    row = np.empty(n)
    assert checked_row(flat32, 3, n, row) == row_sum(flat32[3:].astype(np.float64))
    assert np.array_equal(row, flat32[3:])


@pytest.mark.parametrize("bad", [-1e-30, np.nan, -np.inf])
def test_checked_row_flags_a_bad_entry_in_any_lane_or_the_tail(bad):
    """A negative or NaN entry anywhere (a vector lane or the tail past the last group of 4)
    makes the row's sum NaN; -0.0 is a valid zero, as in `kernel.normalise_rows`."""
    row = np.empty(11)
    for position in range(11):
        flat = np.full(11, 1 / 11, dtype=np.float32)
        flat[position] = bad
        assert np.isnan(checked_row(flat, 0, 11, row))
        flat[position] = -0.0
        assert not np.isnan(checked_row(flat, 0, 11, row))


def attention_like(rng: np.random.Generator, layers: int, t: int) -> np.ndarray:
    logits = 2.0 * rng.normal(size=(layers, t, t))
    logits[:, :, 0] += 4.0  # a sink column
    a = np.exp(logits)
    return a / a.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("t", [2, 24, 130, 197, 261])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_restrict_layers_equals_its_numpy_definition(t, dtype):
    rng = np.random.default_rng(t)
    layers = attention_like(rng, 3, t).astype(dtype)
    layers[1, :, 1:] = 0.0  # layer 1: every row on token 0 alone
    layers[1, :, 0] = 1.0
    for keep in (np.ones(t, dtype=bool), np.arange(t) >= 1, rng.random(t) < 0.6,
                 np.arange(t) == t - 1):
        if not keep.any():
            continue
        buffer = np.full(3 * t * t, np.nan)
        for out in (None, buffer):
            stack, kept, ok = restrict_layers(layers, keep, out=out)
            expected = _restrict_layers_numpy(layers, keep)
            assert np.array_equal(stack, expected[0]) and stack.flags.c_contiguous
            assert np.array_equal(kept, expected[1]) and np.array_equal(ok, expected[2])
        assert ok.tolist() == [True, bool(keep[0]), True]  # no mass left off token 0


@pytest.mark.parametrize(("where", "value", "message"), [
    ((1, 2, 3), np.nan, "matrix row 2 column 3 is nan"),
    ((0, 4, 0), -0.5, "matrix row 4 column 0 is negative"),
    ((2, 1, 1), 3.0, "matrix row 1 sums to"),
])
def test_bad_attention_gets_the_numpy_paths_error(where, value, message):
    layers = attention_like(np.random.default_rng(0), 3, 6)
    layers[where] = value
    with pytest.raises(NotStochasticError, match=message):
        restrict_layers(layers, np.arange(6) >= 1)

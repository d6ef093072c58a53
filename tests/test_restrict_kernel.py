"""The one-pass restriction (`workers.exact.restrict_kernel`) equals `restrict_layers`' defining
numpy steps bit for bit, at every size the pairwise sum splits at, and raises their errors."""

from __future__ import annotations

import numpy as np
import pytest

from storage.errors import NotStochasticError
from workers.exact.equality import _restrict_layers_numpy, restrict_layers
from workers.exact.kernel import row_sum
from workers.exact.restrict_kernel import (
    STACK_DEPTH,
    checked_row,
    fast_divisor,
    pairwise_plan,
    pairwise_quotient_sum,
    quotient_row_sum,
    quotients_into,
    row_sum_at,
)


def same_bits(x: np.ndarray, y: np.ndarray) -> bool:
    return x.dtype == y.dtype and np.array_equal(x.view(np.int64), y.view(np.int64))


def floats(rng: np.random.Generator, size: int, low: int, high: int) -> np.ndarray:
    """float64 with uniformly random 52-bit significands and exponents in [low, high]."""
    significand = 1.0 + rng.integers(0, 1 << 52, size=size, dtype=np.int64) / 2.0**52
    return np.ldexp(significand, rng.integers(low, high + 1, size=size))


def divisors(rng: np.random.Generator) -> list[float]:
    """Random divisors across the fast range, and the hard ones: all-ones significands, powers
    of two, sums within a few ulps of 1 (the renormalised rows' sums)."""
    return [*floats(rng, 6, -200, 3), *(np.ldexp(2.0 - k * 2.0**-52, e)
                                        for k, e in ((1, 0), (2, -7), (3, 3), (1, -200))),
            1.0, 0.5, 16.0, 2.0**-200, *(1.0 + k * 2.0**-53 for k in (-5, -2, -1, 1, 2, 7))]


def test_the_fast_quotients_are_numpys_division_bit_for_bit():
    """Markstein's refinement (`_quotients`) gives the correctly rounded a / b on 8-lane vectors
    and plain division on the tail, for dividends across [2^-600, 2^10], quotients near exact
    and near halfway between two floats, zeros of both signs."""
    rng = np.random.default_rng(0)
    for b in divisors(rng):
        assert fast_divisor(b)
        near = floats(rng, 4000, -60, 0) * b  # a / b within an ulp of a float or a midpoint
        a = np.concatenate([[0.0, -0.0, 2.0**-600, 1024.0, b], floats(rng, 20000, -600, 10),
                            near, np.nextafter(near, 0), np.nextafter(near, 1e300)])
        out = np.empty_like(a)
        quotients_into(a, 0, out, 0, a.size, b, True)
        assert same_bits(out, a / b), b


def test_the_slow_path_and_the_divisor_range():
    """Outside [2^-200, 2^4] the division stays plain (`fast_divisor` is False), and equal."""
    assert not fast_divisor(2.0**-201) and not fast_divisor(16.5) and not fast_divisor(np.nan)
    rng = np.random.default_rng(1)
    a = floats(rng, 1001, -1074 + 52, 10)
    for b in (2.0**-201, 17.0, 1e300):
        out = np.empty_like(a)
        quotients_into(a, 0, out, 0, a.size, b, fast_divisor(b))
        assert same_bits(out, a / b)


@pytest.mark.parametrize("n", [1, 7, 8, 9, 127, 128, 129, 136, 255, 257, 577, 1000, 1370, 4097])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_pairwise_quotient_sum_is_numpys_division_then_sum(n, dtype):
    """Each block divided and summed in one pass equals numpy dividing, then summing: the
    quotients bit for bit, the sum as numpy's pairwise sum adds them."""
    rng = np.random.default_rng(n)
    blocks, program = pairwise_plan(n)
    assert blocks[:, 1].sum() == n and (blocks[:, 1] <= 128).all()
    sums = np.empty(len(blocks) + STACK_DEPTH)
    for row in (rng.random((6, n + 3)) ** 4).astype(dtype):  # skewed: the order shows
        for b, fast in ((float(row[3:].astype(np.float64).sum()), True), (0.75, False)):
            out = np.empty(n)
            total = pairwise_quotient_sum(row, 3, out, b, fast, blocks, program, sums)
            expected = row[3:].astype(np.float64) / b
            assert same_bits(out, expected) and total == expected.sum()


@pytest.mark.parametrize("n", [1, 3, 4, 8, 11, 12, 13, 577, 1370])
def test_quotient_row_sum_is_division_then_kernel_row_sum(n):
    rng = np.random.default_rng(n)
    for fast in (True, False):
        sub = rng.random(n) ** 4
        expected = sub / 0.625
        total = quotient_row_sum(sub, n, 0.625, fast)
        assert same_bits(sub, expected) and total == row_sum(expected.copy())


@pytest.mark.parametrize("n", [0, 1, 3, 4, 5, 8, 127, 1370])
def test_the_vector_row_sums_are_kernel_row_sum(n):
    """`row_sum_at` (4-lane vectors) and `checked_row` (widening float32 as it sums) add in
    `kernel.row_sum`'s order, at any offset into a flat array."""
    rng = np.random.default_rng(n)
    flat = rng.random(3 + n) ** 4
    assert row_sum_at(flat, 3, n) == row_sum(flat[3:].copy())
    flat32 = flat.astype(np.float32)
    assert checked_row(flat32, 3, n) == (row_sum(flat32[3:].astype(np.float64)), False)


@pytest.mark.parametrize("bad", [-1e-30, np.nan, -np.inf])
def test_checked_row_flags_a_bad_entry_in_any_lane_or_the_tail(bad):
    """A negative or NaN entry anywhere (a vector lane or the tail past the last group of 4)
    makes the row's sum NaN; -0.0 is a valid zero, as in `kernel.normalise_rows`."""
    for position in range(11):
        flat = np.full(11, 1 / 11, dtype=np.float32)
        flat[position] = bad
        assert np.isnan(checked_row(flat, 0, 11)[0])
        flat[position] = -0.0
        assert not np.isnan(checked_row(flat, 0, 11)[0])


def test_checked_row_flags_a_tiny_float64_entry_in_any_lane_or_the_tail():
    """An entry in (0, 2^-500) of a float64 row sends the row to plain division (the
    refinement's remainders could leave the normal range); zeros and float32 never do."""
    for position in range(11):
        flat = np.full(11, 1 / 11)
        flat[position] = 1e-160
        assert checked_row(flat, 0, 11)[1]
        flat[position] = 0.0
        assert not checked_row(flat, 0, 11)[1]
        assert not checked_row(np.full(11, 1e-45, dtype=np.float32), 0, 11)[1]


def attention_like(rng: np.random.Generator, layers: int, t: int) -> np.ndarray:
    logits = 2.0 * rng.normal(size=(layers, t, t))
    logits[:, :, 0] += 4.0  # a sink column
    a = np.exp(logits)
    return a / a.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("t", [2, 24, 130, 197, 261])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_restrict_layers_equals_its_numpy_definition(t, dtype):
    """Bit for bit (zeros' signs included) on every token set, with layers that lose all
    their mass, signed zeros and, in float64, entries so small that their rows divide plainly."""
    rng = np.random.default_rng(t)
    layers = attention_like(rng, 3, t).astype(dtype)
    last = layers[2].astype(np.float64)
    last[:, 1] = np.where(rng.random(t) < 0.5, -0.0, last[:, 1])
    if dtype == np.float64:
        last[::2, -1] *= 1e-300
    layers[2] = last / last.sum(axis=1, keepdims=True)
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
            assert same_bits(stack, expected[0]) and stack.flags.c_contiguous
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

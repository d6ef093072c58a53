"""One pass from stored attention to the restricted, renormalised float64 stack. Pure numba.

`equality.restrict_layers` is defined by numpy steps: validate the whole (L, T, T) stack
(`kernel.normalise_rows`: finite, >= 0, rows within the tolerance of 1, divided by `row_sum`),
gather the kept rows and columns, divide each kept row by its numpy sum over the kept columns
(`ndarray.sum`: pairwise, `pairwise_sum` below), renormalise again (`normalise_rows`).
`restrict_into` does the same arithmetic in the same order, row by row into a caller's buffer,
so its output equals those steps bit for bit without their five full-size temporaries.

Its sums run on SIMD vectors written out in LLVM IR (numba's `intrinsic`), since LLVM does not
vectorise an ordered float sum: `_lane_sums` adds lane j of each group of 4 (or 8) consecutive
terms into accumulator j, exactly the scalar interleaved accumulators of `kernel.row_sum` (and
numpy's 8 in a pairwise block), as one vector add per group, without reassociation; `_widen`
does the same while it converts a row to float64 and flags negative or NaN entries. The
divisions stay plain loops (LLVM vectorises them); a division by a sum of exactly 1 (x / 1 == x
for every float) is skipped.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from workers.exact import kernel  # noqa: F401  (first: it points numba's cache, numba_cache)

_I32, _I64 = ir.IntType(32), ir.IntType(64)


def _flat(arr: types.Type, dtypes: tuple[types.Type, ...]) -> bool:
    """Whether `arr` is a 1-D C-contiguous array of one of `dtypes` (what the intrinsics read
    through its data pointer)."""
    return (isinstance(arr, types.Array) and arr.ndim == 1 and arr.layout == "C"
            and arr.dtype in dtypes)


def _vector(builder: ir.IRBuilder, context, arrty: types.Array, array, index, lanes: int):
    """(pointer to <lanes x element>) at element `index` of a 1-D C array, its element type."""
    data = context.make_array(arrty)(context, builder, array).data
    element = data.type.pointee
    address = builder.gep(data, [index])
    return builder.bitcast(address, ir.VectorType(element, lanes).as_pointer()), element


def _load_double(builder: ir.IRBuilder, context, arrty, array, index, lanes: int):
    """<lanes x double> of the array's elements from `index` (float32 widened exactly)."""
    pointer, element = _vector(builder, context, arrty, array, index, lanes)
    value = builder.load(pointer, align=arrty.dtype.bitwidth // 8)
    if isinstance(element, ir.FloatType):
        value = builder.fpext(value, ir.VectorType(ir.DoubleType(), lanes))
    return value


def _splat(builder: ir.IRBuilder, value, lanes: int):
    """<lanes x double> with every lane `value` (a double)."""
    vector = ir.Constant(ir.VectorType(ir.DoubleType(), lanes), ir.Undefined)
    for j in range(lanes):
        vector = builder.insert_element(vector, value, ir.Constant(_I32, j))
    return vector


@intrinsic
def _lane_sums(typingctx, init, arr, start, groups):
    """init[j] + arr[start + j] + arr[start + L + j] + ... over `groups` groups of L =
    len(init) terms, left to right in each lane (float32 terms widened): a tuple of L floats."""
    if not (isinstance(init, types.UniTuple) and init.dtype == types.float64
            and _flat(arr, (types.float32, types.float64))):
        return None
    lanes = init.count

    def codegen(context, builder, sig, args):
        init_v, arr_v, start_v, groups_v = args
        acc = ir.Constant(ir.VectorType(ir.DoubleType(), lanes), ir.Undefined)
        for j in range(lanes):
            acc = builder.insert_element(acc, builder.extract_value(init_v, j),
                                         ir.Constant(_I32, j))
        slot = cgutils.alloca_once_value(builder, acc)
        with cgutils.for_range(builder, groups_v) as loop:
            index = builder.add(start_v, builder.mul(loop.index, ir.Constant(_I64, lanes)))
            value = _load_double(builder, context, sig.args[1], arr_v, index, lanes)
            builder.store(builder.fadd(builder.load(slot), value), slot)
        acc = builder.load(slot)
        return context.make_tuple(builder, sig.return_type, [
            builder.extract_element(acc, ir.Constant(_I32, j)) for j in range(lanes)])

    return init(init, arr, types.intp, types.intp), codegen


@intrinsic
def _widen(typingctx, src, start, dst, groups):
    """dst[k] = float64(src[start + k]) for k < 4 * groups; returns the four lane sums of those
    (as `kernel.row_sum`'s accumulators, from 0) and 1.0 if any term is negative or NaN (else
    0.0): a 5-tuple."""
    if not (_flat(src, (types.float32, types.float64)) and _flat(dst, (types.float64,))):
        return None
    result = types.UniTuple(types.float64, 5)

    def codegen(context, builder, sig, args):
        src_v, start_v, dst_v, groups_v = args
        vty = ir.VectorType(ir.DoubleType(), 4)
        acc = cgutils.alloca_once_value(builder, ir.Constant(vty, [0.0] * 4))
        bad = cgutils.alloca_once_value(builder, ir.Constant(ir.VectorType(ir.IntType(1), 4),
                                                             [0] * 4))
        with cgutils.for_range(builder, groups_v) as loop:
            offset = builder.mul(loop.index, ir.Constant(_I64, 4))
            value = _load_double(builder, context, sig.args[0], src_v,
                                 builder.add(start_v, offset), 4)
            out, _ = _vector(builder, context, sig.args[2], dst_v, offset, 4)
            builder.store(value, out, align=8)
            builder.store(builder.fadd(builder.load(acc), value), acc)
            negative = builder.fcmp_unordered("<", value, ir.Constant(vty, [0.0] * 4))
            builder.store(builder.or_(builder.load(bad), negative), bad)
        sums, flags = builder.load(acc), builder.load(bad)
        any_bad = builder.extract_element(flags, ir.Constant(_I32, 0))
        for j in range(1, 4):
            any_bad = builder.or_(any_bad, builder.extract_element(flags, ir.Constant(_I32, j)))
        items = [builder.extract_element(sums, ir.Constant(_I32, j)) for j in range(4)]
        items.append(builder.select(any_bad, ir.Constant(ir.DoubleType(), 1.0),
                                    ir.Constant(ir.DoubleType(), 0.0)))
        return context.make_tuple(builder, result, items)

    return result(src, types.intp, dst, types.intp), codegen


@njit(cache=True)
def row_sum_at(a: np.ndarray, start: int, n: int) -> float:
    """`kernel.row_sum`(a[start:start + n]) of a 1-D C float64 array, on 4-lane vectors."""
    quad = n - n % 4
    s0, s1, s2, s3 = _lane_sums((0.0, 0.0, 0.0, 0.0), a, start, quad // 4)
    for k in range(quad, n):
        s0 += a[start + k]
    return (s0 + s1) + (s2 + s3)


PAIRWISE_BLOCK = 128  # numpy's PW_BLOCKSIZE: blocks up to this size are summed with 8 accumulators


STACK_DEPTH = 64  # pairwise_sum's explicit stack: halving from 2^63 terms to a block


@njit(cache=True)
def block_sum(a: np.ndarray, start: int, n: int) -> float:
    """numpy's sum of a run of at most PAIRWISE_BLOCK terms: a plain loop below 8 terms, else
    8 interleaved accumulators (one 8-lane vector), combined as a tree, then the remainder
    added in order."""
    if n < 8:
        res = 0.0
        for i in range(start, start + n):
            res += a[i]
        return res
    top = n - n % 8
    r0, r1, r2, r3, r4, r5, r6, r7 = _lane_sums(
        (a[start], a[start + 1], a[start + 2], a[start + 3], a[start + 4], a[start + 5],
         a[start + 6], a[start + 7]), a, start + 8, (top - 8) // 8)
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    for i in range(top, n):
        res += a[start + i]
    return res


@njit(cache=True)
def pairwise_sum(a: np.ndarray, n: int, frames: np.ndarray, partial: np.ndarray) -> float:
    """a[:n].sum() of a float64 vector exactly as numpy adds a contiguous run: blocks of at
    most PAIRWISE_BLOCK terms (`block_sum`), larger runs split in halves rounded down to a
    multiple of 8, summed left + right. numpy recurses; this walks the same tree with an
    explicit stack (`frames` (STACK_DEPTH, 3) int64: start, length, stage; `partial`
    (STACK_DEPTH,) float64: left sums), since numba cannot cache recursive functions."""
    if n <= PAIRWISE_BLOCK:
        return block_sum(a, 0, n)
    top = 0
    frames[0, 0], frames[0, 1], frames[0, 2] = 0, n, 0
    value = 0.0
    while top >= 0:
        start, length, stage = frames[top, 0], frames[top, 1], frames[top, 2]
        if length <= PAIRWISE_BLOCK:
            value = block_sum(a, start, length)
            top -= 1
            continue
        half = length // 2
        half -= half % 8
        if stage == 0:  # descend left
            frames[top, 2] = 1
            top += 1
            frames[top, 0], frames[top, 1], frames[top, 2] = start, half, 0
        elif stage == 1:  # left done: keep it, descend right
            partial[top] = value
            frames[top, 2] = 2
            top += 1
            frames[top, 0], frames[top, 1], frames[top, 2] = start + half, length - half, 0
        else:  # right done
            value = partial[top] + value
            top -= 1
    return value


@njit(cache=True)
def checked_row(flat: np.ndarray, start: int, t: int, row: np.ndarray) -> float:
    """row = float64(flat[start:start + t]) (one row of the stack, flattened); returns its
    `kernel.row_sum` (same four accumulators, same order), or NaN when an entry is negative or
    NaN (an infinite entry makes the sum infinite)."""
    quad = t - t % 4
    s0, s1, s2, s3, flagged = _widen(flat, start, row, quad // 4)
    bad = flagged != 0.0
    for k in range(quad, t):
        v = np.float64(flat[start + k])
        bad |= not (v >= 0.0)
        row[k] = v
        s0 += v
    return np.nan if bad else (s0 + s1) + (s2 + s3)


@njit(cache=True)
def restrict_into(a: np.ndarray, kept: np.ndarray, row_sum_tol: float, out: np.ndarray,
                  ok: np.ndarray) -> bool:
    """Restrict every layer of a C-contiguous (L, T, T) float32/float64 stack to the sorted
    token indices `kept` (m,) into out[:L, :m, :m] (float64), as `equality.restrict_layers`
    defines it; ok[l] is False when a kept row of layer l has no mass on the kept tokens (its
    rows of `out` are then undefined). Returns False, with `out` undefined, when any entry of
    `a` is not finite and >= 0 or any row (kept or not) or renormalised kept row misses 1 by
    more than row_sum_tol: the caller then raises the numpy path's precise error."""
    n_layers, t = a.shape[0], a.shape[1]
    m = kept.shape[0]
    first = kept[0]
    run = kept[m - 1] - first == m - 1  # one run of tokens (all, all but CLS, ...): a slice
    flat = a.reshape(-1)
    row = np.empty(t, dtype=np.float64)
    sub = np.empty(m, dtype=np.float64)
    frames = np.empty((STACK_DEPTH, 3), dtype=np.int64)
    partial = np.empty(STACK_DEPTH, dtype=np.float64)
    for layer in range(n_layers):
        ok[layer] = True
        r = 0
        for i in range(t):
            total = checked_row(flat, (layer * t + i) * t, t, row)
            if not abs(total - 1.0) <= row_sum_tol:  # also NaN: a bad entry
                return False
            if r == m or kept[r] != i:
                continue
            r += 1
            if not ok[layer]:
                continue
            if run:
                for c in range(m):
                    sub[c] = row[first + c] / total
            else:
                for c in range(m):
                    sub[c] = row[kept[c]] / total
            mass = pairwise_sum(sub, m, frames, partial)
            if mass == 0.0:
                ok[layer] = False
                continue
            if mass != 1.0:  # a division by 1 changes no bit: skipped
                for c in range(m):
                    sub[c] = sub[c] / mass
            again = row_sum_at(sub, 0, m)
            if not abs(again - 1.0) <= row_sum_tol:
                return False
            if again == 1.0:
                out[layer, r - 1] = sub
            else:
                for c in range(m):
                    out[layer, r - 1, c] = sub[c] / again
    return True

"""One pass from stored attention to the restricted, renormalised float64 stack. Pure numba.

`equality.restrict_layers` is defined by numpy steps: validate the whole (L, T, T) stack
(`kernel.normalise_rows`: finite, >= 0, rows within the tolerance of 1, divided by `row_sum`),
gather the kept rows and columns, divide each kept row by its numpy sum over the kept columns
(`ndarray.sum`: pairwise, `pairwise_plan` below), renormalise again (`normalise_rows`).
`restrict_into` does the same arithmetic in the same order, row by row into a caller's buffer,
so its output equals those steps bit for bit without their five full-size temporaries.

Its sums run on SIMD vectors written out in LLVM IR (numba's `intrinsic`), since LLVM does not
vectorise an ordered float sum: `_lane_sums` adds lane j of each group of 4 (or 8) consecutive
terms into accumulator j, exactly the scalar interleaved accumulators of `kernel.row_sum` (and
numpy's 8 in a pairwise block), as one vector add per group, without reassociation;
`_checked_sums` does the same over a row of the stack (float32 widened exactly) and flags
negative, NaN and tiny entries. A division pass also makes the sum that follows it
(`pairwise_quotient_sum`, `quotient_row_sum`), in the same order, while the quotients are in
registers.

Its divisions are correctly rounded without a divide instruction per entry (`_quotients`):
with y = RN(1 / b) and y_lo = RN(e y), e = 1 - b y from a fused multiply-add (one division and
two operations per row), y + y_lo is within about 2^-104 of 1 / b (relative), so
q0 = RN(a y + RN(a y_lo)) is within (1/2 + 2^-51) ulp of a / b; then q = RN(q0 + (a - b q0) y),
both by fused multiply-adds, is a / b rounded to nearest by Markstein's theorem (proved in ACL2
in Russinoff's RTL library, `markstein-lemma`: |1 - b y| < 2^-53 and q0 within 1 ulp of a / b
give RN(q0 + r y) = RN(a / b), with r = a - b q0 exact). A vector pass of these four operations
took 0.53-0.58x the time of a pass of divisions on the 2-core machine
(`benchmarks/division_bench.py`). The theorem needs every value in the normal range:
`fast_divisor` and the rows' tiny flag keep the rows that might leave it (an entry in
(0, TINY), a sum outside [2^-200, 2^4]) on plain division.
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


def _from_tuple(builder: ir.IRBuilder, items, lanes: int):
    """<lanes x double> of a tuple of `lanes` doubles, item j in lane j."""
    vector = ir.Constant(ir.VectorType(ir.DoubleType(), lanes), ir.Undefined)
    for j in range(lanes):
        vector = builder.insert_element(vector, builder.extract_value(items, j),
                                        ir.Constant(_I32, j))
    return vector


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
        slot = cgutils.alloca_once_value(builder, _from_tuple(builder, init_v, lanes))
        with cgutils.for_range(builder, groups_v) as loop:
            index = builder.add(start_v, builder.mul(loop.index, ir.Constant(_I64, lanes)))
            value = _load_double(builder, context, sig.args[1], arr_v, index, lanes)
            builder.store(builder.fadd(builder.load(slot), value), slot)
        acc = builder.load(slot)
        return context.make_tuple(builder, sig.return_type, [
            builder.extract_element(acc, ir.Constant(_I32, j)) for j in range(lanes)])

    return init(init, arr, types.intp, types.intp), codegen


TINY = 2.0 ** -500
"""Entries below this (other than 0) keep their row on plain division: the quotient refinement's
remainders would leave the normal range (never for float32 attention, whose least positive
value is 2^-149)."""


@intrinsic
def _checked_sums(typingctx, src, start, groups):
    """The four lane sums of float64(src[start + k]), k < 4 * groups (as `kernel.row_sum`'s
    accumulators, from 0), 1.0 if any term is negative or NaN (else 0.0) and 1.0 if any term is
    in (0, TINY) (else 0.0; never for float32): a 6-tuple."""
    if not _flat(src, (types.float32, types.float64)):
        return None
    result = types.UniTuple(types.float64, 6)
    narrow = src.dtype == types.float32

    def codegen(context, builder, sig, args):
        src_v, start_v, groups_v = args
        vty = ir.VectorType(ir.DoubleType(), 4)
        flag_ty = ir.VectorType(ir.IntType(1), 4)
        zeros = ir.Constant(vty, [0.0] * 4)
        acc = cgutils.alloca_once_value(builder, zeros)
        bad = cgutils.alloca_once_value(builder, ir.Constant(flag_ty, [0] * 4))
        tiny = cgutils.alloca_once_value(builder, ir.Constant(flag_ty, [0] * 4))
        with cgutils.for_range(builder, groups_v) as loop:
            offset = builder.mul(loop.index, ir.Constant(_I64, 4))
            value = _load_double(builder, context, sig.args[0], src_v,
                                 builder.add(start_v, offset), 4)
            builder.store(builder.fadd(builder.load(acc), value), acc)
            negative = builder.fcmp_unordered("<", value, zeros)
            builder.store(builder.or_(builder.load(bad), negative), bad)
            if not narrow:
                small = builder.and_(
                    builder.fcmp_ordered(">", value, zeros),
                    builder.fcmp_ordered("<", value, ir.Constant(vty, [TINY] * 4)))
                builder.store(builder.or_(builder.load(tiny), small), tiny)
        items = [builder.extract_element(builder.load(acc), ir.Constant(_I32, j))
                 for j in range(4)]
        for flags in (builder.load(bad), builder.load(tiny)):
            any_set = builder.extract_element(flags, ir.Constant(_I32, 0))
            for j in range(1, 4):
                any_set = builder.or_(any_set,
                                      builder.extract_element(flags, ir.Constant(_I32, j)))
            items.append(builder.select(any_set, ir.Constant(ir.DoubleType(), 1.0),
                                        ir.Constant(ir.DoubleType(), 0.0)))
        return context.make_tuple(builder, result, items)

    return result(src, types.intp, types.intp), codegen


LANES = 8  # quotients per vector in `_quotients`


@intrinsic
def _quotients(typingctx, init, src, src_start, dst, dst_start, groups, b, y, y_lo):
    """dst[dst_start + k] = float64(src[src_start + k]) / b correctly rounded, for
    k < LANES * groups, given (y, y_lo) = `_reciprocal(b)` (1-D C arrays, src float32 or
    float64, dst float64; the same array and start is allowed); returns
    init[j] + the quotients with k % L == j added in increasing k, L = len(init) (0, 4 or 8).
    Markstein's refinement (module docstring); the caller keeps it to `fast_divisor` values."""
    if not (isinstance(init, types.BaseTuple) and len(init) in (0, 4, 8)
            and all(t == types.float64 for t in init.types)
            and _flat(src, (types.float32, types.float64)) and _flat(dst, (types.float64,))):
        return None
    lanes, sums = LANES, len(init)

    def codegen(context, builder, sig, args):
        init_v, src_v, src_start_v, dst_v, dst_start_v, groups_v, b_v, y_v, y_lo_v = args
        vty = ir.VectorType(ir.DoubleType(), lanes)
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vty, [vty] * 3),
                                             f"llvm.fma.v{lanes}f64")
        vy_lo = _splat(builder, y_lo_v, lanes)
        copysign = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vty, [vty] * 2), f"llvm.copysign.v{lanes}f64")
        vy, minus_b = _splat(builder, y_v, lanes), builder.fneg(_splat(builder, b_v, lanes))
        slot = (cgutils.alloca_once_value(builder, _from_tuple(builder, init_v, sums))
                if sums else None)
        with cgutils.for_range(builder, groups_v) as loop:
            offset = builder.mul(loop.index, ir.Constant(_I64, lanes))
            a = _load_double(builder, context, sig.args[1], src_v,
                             builder.add(src_start_v, offset), lanes)
            q = builder.call(fma, [a, vy, builder.fmul(a, vy_lo)])  # within 1 ulp of a / b
            q = builder.call(fma, [builder.call(fma, [minus_b, q, a]), vy, q])  # a / b rounded
            q = builder.call(copysign, [q, a])  # -0.0 / b is -0.0 (the refinement gives +0.0)
            out, _ = _vector(builder, context, sig.args[3], dst_v,
                             builder.add(dst_start_v, offset), lanes)
            builder.store(q, out, align=8)
            for part in range(lanes // sums if sums else 0):  # lane j of each run of `sums`
                piece = builder.shuffle_vector(q, q, ir.Constant(
                    ir.VectorType(_I32, sums), list(range(part * sums, (part + 1) * sums))))
                builder.store(builder.fadd(builder.load(slot), piece), slot)
        if not sums:
            return context.make_tuple(builder, sig.return_type, [])
        acc = builder.load(slot)
        return context.make_tuple(builder, sig.return_type, [
            builder.extract_element(acc, ir.Constant(_I32, j)) for j in range(sums)])

    return init(init, src, types.intp, dst, types.intp, types.intp, types.float64,
                types.float64, types.float64), codegen


@intrinsic
def _reciprocal(typingctx, b):
    """(y, y_lo): y = RN(1 / b), y_lo = RN(e y) with e = 1 - b y from one fused multiply-add."""
    if b != types.float64:
        return None
    result = types.UniTuple(types.float64, 2)

    def codegen(context, builder, sig, args):
        (b_v,) = args
        double = ir.DoubleType()
        fma = cgutils.get_or_insert_function(builder.module,
                                             ir.FunctionType(double, [double] * 3),
                                             "llvm.fma.f64")
        y = builder.fdiv(ir.Constant(double, 1.0), b_v)
        error = builder.call(fma, [builder.fneg(b_v), y, ir.Constant(double, 1.0)])
        return context.make_tuple(builder, result, [y, builder.fmul(error, y)])

    return result(b), codegen


@njit(cache=True)
def fast_divisor(b: float) -> bool:
    """Whether `_quotients` may divide by b: 2^-200 <= b <= 2^4. With dividends 0 or in
    [2^-600, 2^10] (a row's entries are >= TINY and at most its sum, and each division keeps
    them there), every value of the refinement is then normal."""
    return 2.0 ** -200 <= b <= 16.0


@njit(cache=True)
def quotients_into(src: np.ndarray, s: int, dst: np.ndarray, d: int, n: int, b: float,
                   fast: bool) -> None:
    """dst[d:d + n] = src[s:s + n] / b, each correctly rounded (`_quotients` when `fast`)."""
    done = 0
    if fast:
        groups = n // LANES
        y, y_lo = _reciprocal(b)
        _quotients((), src, s, dst, d, groups, b, y, y_lo)
        done = groups * LANES
    for k in range(done, n):
        dst[d + k] = np.float64(src[s + k]) / b


@njit(cache=True)
def row_sum_at(a: np.ndarray, start: int, n: int) -> float:
    """`kernel.row_sum`(a[start:start + n]) of a 1-D C float64 array, on 4-lane vectors."""
    quad = n - n % 4
    s0, s1, s2, s3 = _lane_sums((0.0, 0.0, 0.0, 0.0), a, start, quad // 4)
    for k in range(quad, n):
        s0 += a[start + k]
    return (s0 + s1) + (s2 + s3)


@njit(cache=True)
def quotient_row_sum(sub: np.ndarray, n: int, b: float, fast: bool) -> float:
    """sub[:n] /= b in place (`quotients_into`), then `row_sum_at`(sub, 0, n), made in the same
    pass when `fast` (the same additions in the same order)."""
    if not fast:
        quotients_into(sub, 0, sub, 0, n, b, False)
        return row_sum_at(sub, 0, n)
    groups = n // LANES
    y, y_lo = _reciprocal(b)
    s0, s1, s2, s3 = _quotients((0.0, 0.0, 0.0, 0.0), sub, 0, sub, 0, groups, b, y, y_lo)
    k = groups * LANES
    if n - k >= 4:  # one more group of four for the four accumulators
        quotients_into(sub, k, sub, k, 4, b, False)
        s0, s1, s2, s3 = s0 + sub[k], s1 + sub[k + 1], s2 + sub[k + 2], s3 + sub[k + 3]
        k += 4
    for i in range(k, n):
        sub[i] = sub[i] / b
        s0 += sub[i]
    return (s0 + s1) + (s2 + s3)


PAIRWISE_BLOCK = 128  # numpy's PW_BLOCKSIZE: blocks up to this size are summed with 8 accumulators


STACK_DEPTH = 64  # pairwise_plan's explicit stack: halving from 2^63 terms to a block


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
def pairwise_plan(n: int) -> tuple[np.ndarray, np.ndarray]:
    """How numpy sums a contiguous run of n float64 (n >= 1): blocks of at most PAIRWISE_BLOCK
    terms (`block_sum`), larger runs split in halves rounded down to a multiple of 8, summed
    left + right. Returns (blocks (k, 2) int64: start and length, left to right; program
    int64: the sums in postfix, i >= 0 the sum of block i, -1 the two before it added). numpy
    recurses; this walks the same tree with an explicit stack, since numba cannot cache
    recursive functions."""
    blocks = np.empty((n // (PAIRWISE_BLOCK // 2) + 1, 2), dtype=np.int64)
    program = np.empty(2 * blocks.shape[0], dtype=np.int64)
    frames = np.empty((STACK_DEPTH, 3), dtype=np.int64)  # start, length, stage
    count = steps = top = 0
    frames[0, 0], frames[0, 1], frames[0, 2] = 0, n, 0
    while top >= 0:
        start, length, stage = frames[top, 0], frames[top, 1], frames[top, 2]
        if length <= PAIRWISE_BLOCK:
            blocks[count, 0], blocks[count, 1] = start, length
            program[steps] = count
            count, steps, top = count + 1, steps + 1, top - 1
            continue
        half = length // 2
        half -= half % 8
        if stage == 0:  # descend left
            frames[top, 2] = 1
            top += 1
            frames[top, 0], frames[top, 1], frames[top, 2] = start, half, 0
        elif stage == 1:  # left done: descend right
            frames[top, 2] = 2
            top += 1
            frames[top, 0], frames[top, 1], frames[top, 2] = start + half, length - half, 0
        else:  # right done: add the two
            program[steps] = -1
            steps, top = steps + 1, top - 1
    return blocks[:count], program[:steps]


@njit(cache=True)
def pairwise_quotient_sum(src: np.ndarray, s: int, dst: np.ndarray, b: float, fast: bool,
                          blocks: np.ndarray, program: np.ndarray, sums: np.ndarray) -> float:
    """dst[:n] = src[s:s + n] / b (`quotients_into`), returning dst[:n].sum() exactly as numpy
    adds it, for the plan (blocks, program) = `pairwise_plan(n)`. When `fast`, each block is
    divided and summed in one pass: its 8 accumulators start at -0.0, which adds to any x as x,
    so they equal `block_sum`'s, started at the block's first 8 terms. `sums`: scratch of at
    least len(blocks) + STACK_DEPTH."""
    y, y_lo = _reciprocal(b)
    z = -0.0
    for k in range(blocks.shape[0]):
        start, n = blocks[k, 0], blocks[k, 1]
        if not fast or n < 8:
            quotients_into(src, s + start, dst, start, n, b, fast)
            sums[k] = block_sum(dst, start, n)
            continue
        r0, r1, r2, r3, r4, r5, r6, r7 = _quotients(
            (z, z, z, z, z, z, z, z), src, s + start, dst, start, n // 8, b, y, y_lo)
        total = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        for i in range(start + n - n % 8, start + n):  # the rest, in order (numpy's too)
            dst[i] = np.float64(src[s + i]) / b
            total += dst[i]
        sums[k] = total
    top = blocks.shape[0]  # the operands in flight sit after the block sums (no view made)
    for i in range(program.shape[0]):
        step = program[i]
        if step >= 0:
            sums[top] = sums[step]
            top += 1
        else:
            sums[top - 2] = sums[top - 2] + sums[top - 1]
            top -= 1
    return sums[blocks.shape[0]]


@njit(cache=True)
def checked_row(flat: np.ndarray, start: int, t: int) -> tuple[float, bool]:
    """`kernel.row_sum` of float64(flat[start:start + t]) (one row of the stack, flattened; same
    four accumulators, same order), or NaN when an entry is negative or NaN (an infinite entry
    makes the sum infinite); and whether an entry is in (0, TINY)."""
    quad = t - t % 4
    s0, s1, s2, s3, flagged, small = _checked_sums(flat, start, quad // 4)
    bad = flagged != 0.0
    tiny = small != 0.0
    for k in range(quad, t):
        v = np.float64(flat[start + k])
        bad |= not (v >= 0.0)
        tiny |= 0.0 < v < TINY
        s0 += v
    return (np.nan if bad else (s0 + s1) + (s2 + s3)), tiny


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
    out_flat = out.reshape(-1)
    gathered = np.empty(m, dtype=np.float64)
    sub = np.empty(m, dtype=np.float64)
    blocks, program = pairwise_plan(m)
    sums = np.empty(blocks.shape[0] + STACK_DEPTH, dtype=np.float64)
    for layer in range(n_layers):
        ok[layer] = True
        r = 0
        for i in range(t):
            start = (layer * t + i) * t
            total, tiny = checked_row(flat, start, t)
            if not abs(total - 1.0) <= row_sum_tol:  # also NaN: a bad entry
                return False
            if r == m or kept[r] != i:
                continue
            r += 1
            if not ok[layer]:
                continue
            if run:
                mass = pairwise_quotient_sum(flat, start + first, sub, total,
                                             not tiny and fast_divisor(total), blocks, program,
                                             sums)
            else:
                for c in range(m):
                    gathered[c] = flat[start + kept[c]]
                mass = pairwise_quotient_sum(gathered, 0, sub, total,
                                             not tiny and fast_divisor(total), blocks, program,
                                             sums)
            if mass == 0.0:
                ok[layer] = False
                continue
            if mass == 1.0:  # a division by 1 changes no bit: skipped
                again = row_sum_at(sub, 0, m)
            else:
                again = quotient_row_sum(sub, m, mass, not tiny and fast_divisor(mass))
            if not abs(again - 1.0) <= row_sum_tol:
                return False
            target = (layer * m + r - 1) * m
            if again == 1.0:
                out_flat[target:target + m] = sub
            else:
                quotients_into(sub, 0, out_flat, target, m, again,
                               not tiny and fast_divisor(again))
    return True

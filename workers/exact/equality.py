"""The equality test: is the layerwise Dobrushin bound kappa(M) <= (1 + kappa(A))/2 tight?

For a row-stochastic A and M = (I + A)/2, with kappa(X) = max_{i<j} 1/2 sum_k |X_ik - X_jk|:
bound = (1 + kappa(A))/2, margin = bound - kappa(M) >= 0, and the bound is tight (margin = 0) iff
some pair attaining kappa(A) is mutually self-dominant (A_ii >= A_ji and A_jj >= A_ij).

Every returned float equals the float64 brute force bit for bit: M = 0.5 * (eye + A), kappa_ij as
0.5 * (sequential left-to-right float64 sum), kappa = max over i < j (0 when n = 1),
bound = 0.5 * (1 + kappa(A)), margin = bound - kappa(M) (see `workers.exact.kernel`).
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
from dataclasses import dataclass

import numba
import numpy as np
import threadpoolctl
from tqdm import tqdm

from storage.errors import InputError, NotStochasticError
from storage.layout import SLACK_WINDOW
from workers.exact import kernel, pruned, restrict_kernel
from workers.exact.scratch import scratch

DEFAULT_TOL = 1e-12
"""Default tolerance on the margin. Float64 rounding of an n <= 4096 sum of a stochastic row is
at most ~4096 * 2^-53 < 5e-13, below it; real ties in attention are far above it."""

ROW_SUM_TOL = 1e-3
"""Rows must sum to 1 within this (float32 and float16 attention); they are renormalised."""

ROW_SUM_TOLS = {"float32": ROW_SUM_TOL, "float16": ROW_SUM_TOL, "bfloat16": 2.0**-7}
"""The row-sum tolerance for attention computed in each dtype: a softmax row rounded entry by entry
to a dtype of unit roundoff u sums to 1 within u (the head mean keeps it): float16's 2^-11 and
float32's are inside ROW_SUM_TOL, bfloat16's 2^-8 is not (MiniLM's rows miss 1 by up to 1.1e-3 in
bfloat16), so it gets twice that. Logits or unnormalised rows miss 1 by far more either way."""


def row_sum_tolerance(dtype: str) -> float:
    """The row-sum tolerance for attention extracted in `dtype` (ROW_SUM_TOLS)."""
    return ROW_SUM_TOLS.get(dtype, ROW_SUM_TOL)

ROLLOUT_MODES = ("every", "last", "off")
"""Where the test stage computes the whole rollout's kappa: at every layer, at the last layer only
(the products still run through every layer), or nowhere; results are NaN where not computed."""

PROGRESS_DELAY_S = 2.0  # a long check shows its bar after this many seconds
MATRICES_PER_THREAD = 4  # from this many matrices per thread on, threads take whole matrices
PARALLEL_MIN_N = 400  # below it, threads take whole matrices (b >= threads) or one thread runs
# (b = 1): a parallel launch costs as much as the kernel there, far more on a loaded machine
_KERNEL_LOCK = threading.Lock()  # one parallel kernel at a time per process: numba's workqueue
# threading layer aborts on concurrent launches, and concurrent teams would oversubscribe cores


def _where(index: tuple[int, int], batched: bool, name: str) -> str:
    """'matrix 3 row 17' (batched) or 'matrix row 17' for a (matrix, row) index."""
    head = f"{name} {index[0]}" if batched else name
    return f"{head} row {index[1]}"


def _as_batch(a: np.ndarray, name: str) -> tuple[np.ndarray, bool]:
    """(n, n) or (b, n, n) real input as an (b, n, n) array (no copy when it already is one)
    and whether it was batched; NotStochasticError on a wrong dtype or shape."""
    arr = np.asarray(a)
    if arr.dtype.kind not in "biuf":
        raise NotStochasticError(f"{name} has dtype {arr.dtype}: need real numbers (float32/64)")
    batched = arr.ndim == 3
    if arr.ndim not in (2, 3) or arr.shape[-1] != arr.shape[-2] or 0 in arr.shape:
        raise NotStochasticError(
            f"{name} has shape {arr.shape}: need a square (n, n) or batch (b, n, n), b, n >= 1"
        )
    return arr.reshape((-1,) + arr.shape[-2:]), batched


def validate_stochastic(a: np.ndarray, name: str = "matrix",
                        row_sum_tol: float = ROW_SUM_TOL) -> np.ndarray:
    """(n, n) or (b, n, n) row-stochastic input -> float64 (b, n, n) with rows renormalised.

    Raises NotStochasticError naming the matrix and row: wrong shape, NaN/inf, negative entries,
    or a row not summing to 1 within `row_sum_tol`.
    """
    arr, batched = _as_batch(a, name)
    x = np.array(arr, dtype=np.float64, ndmin=3, order="C")  # (batch, row, column)
    code, m, i, k = kernel.normalise_rows(x, row_sum_tol)
    where = _where((m, i), batched, name)
    if code == 1:
        raise NotStochasticError(
            f"{where} column {k} is {x[m, i, k]}: attention probabilities must be finite"
        )
    if code == 2:
        raise NotStochasticError(
            f"{where} column {k} is negative ({x[m, i, k]:.6g}): pass probabilities (after "
            "softmax), not logits"
        )
    if code == 3:
        raise NotStochasticError(
            f"{where} sums to {x[m, i].sum():.6g} (must be 1 within {row_sum_tol:g}): pass "
            "row-stochastic attention (softmax over keys)"
        )
    return x




@dataclass(frozen=True)
class EqualityResult:
    """Per-matrix verdicts of a batch of b matrices; every array has leading dimension b.

    At the call's tol: holds == (margin <= tol), holds_by_characterisation == (slack <= tol),
    attaining_special == (content_gap > tol); and the same three equalities decide the verdicts
    at any other tolerance t <= SLACK_WINDOW (the characterisation's pair aside).
    """

    kappa: np.ndarray  # (b,) float64: kappa(A)
    kappa_factor: np.ndarray  # (b,) float64: kappa(M), M = (I + A)/2
    bound: np.ndarray  # (b,) float64: (1 + kappa(A))/2
    margin: np.ndarray  # (b,) float64: bound - kappa(M)
    holds: np.ndarray  # (b,) bool: margin <= tol (the definition)
    holds_by_characterisation: np.ndarray  # (b,) bool: a near-attaining pair is self-dominant
    attaining_special: np.ndarray  # (b,) bool: every attaining pair involves a special token
    pair: np.ndarray  # (b, 2) int64: the self-dominant attaining pair i < j, -1 when none
    attaining_pairs: np.ndarray  # (b,) int64: pairs i < j with kappa - kappa_ij <= tol
    slack: np.ndarray  # (b,) float64: min over i < j of (kappa - kappa_ij)/2 + s_ij/2 (the
    # characterisation's combined slack, s_ij = (A_ji - A_ii)+ + (A_ij - A_jj)+); exact up to
    # max(tol, SLACK_WINDOW), +inf above it and when n = 1
    content_gap: np.ndarray  # (b,) float64: min over pairs with no special token of
    # kappa - kappa_ij; exact up to max(tol, SLACK_WINDOW), +inf above it or when every pair
    # has a special token, -inf when n = 1 (no pair attains); 0 when no mask is given
    radius: np.ndarray | None = None  # (b,) float64: the decision radius (`workers.exact.radius`)
    # when `check` was asked for it, NaN where n = 1; None otherwise

    @property
    def disagreements(self) -> int:
        """Matrices where the definition and the characterisation disagree (should be 0)."""
        return int(np.count_nonzero(self.holds != self.holds_by_characterisation))

    def records(self) -> list[dict]:
        """One JSON-ready dict per matrix (python floats, bools, ints; pair [i, j] or None)."""
        return [
            {
                "kappa": float(self.kappa[m]),
                "kappa_factor": float(self.kappa_factor[m]),
                "bound": float(self.bound[m]),
                "margin": float(self.margin[m]),
                "holds": bool(self.holds[m]),
                "holds_by_characterisation": bool(self.holds_by_characterisation[m]),
                "pair": [int(v) for v in self.pair[m]] if self.pair[m, 0] >= 0 else None,
                "attaining_pairs": int(self.attaining_pairs[m]),
            }
            for m in range(self.kappa.shape[0])
        ]


def _special_mask(special: np.ndarray | None, b: int, n: int) -> tuple[np.ndarray, bool]:
    """(b, n) bool special-token mask from None, (n,) or (b, n); and whether one was given."""
    if special is None:
        return np.zeros((b, n), dtype=np.bool_), False
    mask = np.asarray(special)
    if mask.dtype != np.bool_ or mask.shape not in ((n,), (b, n)):
        raise InputError(
            f"special mask has shape {mask.shape} and dtype {mask.dtype}: need bool ({n},) or "
            f"({b}, {n})"
        )
    return np.ascontiguousarray(np.broadcast_to(mask, (b, n))), True


def _check_torch(
    a: np.ndarray, tol: float, mask: np.ndarray, has_special: bool, device: str
) -> tuple[np.ndarray, np.ndarray]:
    """`kernel.check_screened` on kappa_ij screened as torch.cdist(float32 rows, p=1)/2 on
    `device`, in groups of about 256 MiB of float32 each."""
    import torch

    n = a.shape[1]
    group = max(1, (1 << 28) // (4 * n * n))
    parts = []
    for start in range(0, a.shape[0], group):
        x = torch.from_numpy(a[start : start + group]).to(device=device, dtype=torch.float32)
        screened = (0.5 * torch.cdist(x, x, p=1)).cpu().numpy()  # (batch, row i, row j)
        parts.append(
            kernel.check_screened(
                a[start : start + group], screened, tol, SLACK_WINDOW,
                mask[start : start + group], has_special,
            )
        )
    return np.concatenate([f for f, _ in parts]), np.concatenate([i for _, i in parts])


CACHED_BUFFERS_MAX_N = 1100  # kernel buffers for n up to this are kept for the next call


@functools.lru_cache(maxsize=2)
def _cached_buffers(n: int, validate: bool, threads: int) -> tuple[np.ndarray, ...]:
    return pruned.buffers(n, validate, threads)


def _buffers(n: int, validate: bool, threads: int) -> tuple[np.ndarray, ...]:
    """`pruned.buffers`, kept for the next call up to n = CACHED_BUFFERS_MAX_N (fresh pages
    cost as much as the kernel at n = 257); call with _KERNEL_LOCK held."""
    if n <= CACHED_BUFFERS_MAX_N:
        return _cached_buffers(n, validate, threads)
    return pruned.buffers(n, validate, threads)


def _check_cpu(
    a: np.ndarray, validate: bool, tol: float, mask: np.ndarray, has_special: bool,
    source: np.ndarray, progress: bool = False, radius: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pruned exact kernel (`workers.exact.pruned`) on a (b, n, n) batch: float32/float64 rows
    validated and renormalised per matrix when `validate`, else trusted float64; out_f, out_i
    and the radii (NaN unless `radius`). Raises `validate_stochastic(source)`'s error on invalid
    input (`source`: the caller's array)."""
    threads = numba.get_num_threads()
    b, n = a.shape[0], a.shape[1]
    if b >= MATRICES_PER_THREAD * threads or (b >= threads > 1 and n < PARALLEL_MIN_N):
        run, buffer_threads = pruned.check_over_matrices, threads
    elif n >= PARALLEL_MIN_N:
        run, buffer_threads = pruned.check_within_matrices, 1
    else:
        run, buffer_threads = pruned.check_serial, 1
    bar = None
    if progress and run is pruned.check_within_matrices:  # the only path with long calls
        bar = tqdm(desc="check", unit="chunk", file=sys.stderr, leave=False,
                   delay=PROGRESS_DELAY_S, disable=None)
    try:
        with _KERNEL_LOCK:
            buffers = _buffers(n, validate, buffer_threads)
            extra = (bar.update,) if bar is not None else ()
            out_f, out_i, out_r, bad = run(a, validate, ROW_SUM_TOL, tol, SLACK_WINDOW, mask,
                                           has_special, radius, *buffers, *extra)
    finally:
        if bar is not None:
            bar.close()
    if bad:
        validate_stochastic(source)  # names the first offender
        raise RuntimeError("the kernel rejected a batch validate_stochastic accepts")
    return out_f, out_i, out_r


def check(
    a: np.ndarray,
    tol: float = DEFAULT_TOL,
    special: np.ndarray | None = None,
    validate: bool = True,
    device: str | None = None,
    progress: bool = False,
    radius: bool = False,
) -> EqualityResult:
    """The equality test on an (n, n) or (b, n, n) row-stochastic batch, exact in float64.

    `special`: optional bool (n,) or (b, n) mask of special tokens (for `attaining_special`).
    `validate=False` trusts `a` to be float64 C-contiguous (b, n, n) already renormalised.
    `device`: None runs the pruned numba CPU kernel (rows validated per matrix, no float64 copy
    of the batch); a torch device ("cuda", "cpu") screens with torch.cdist(p=1) there. Both
    verify in the oracle's float64 order and return the same numbers.
    `progress`: a bar on stderr (a terminal only) for a single large matrix whose check takes
    longer than PROGRESS_DELAY_S (ties everywhere); Ctrl-C acts between its chunks either way.
    `radius`: also each matrix's decision radius (`workers.exact.radius`), found on the CPU kernel's
    own screen (InputError with a `device`).
    """
    if radius and device is not None:
        raise InputError(f"the decision radius is computed by the CPU kernel: call check with "
                         f"device=None, not {device!r}, to get it")
    if not (np.isfinite(tol) and 0 <= tol < 1):
        raise InputError(f"tolerance {tol!r} must be a finite number in [0, 1) (default "
                         f"{DEFAULT_TOL}): kappa lies in [0, 1]")
    if device is not None or not validate:
        if validate:
            x = validate_stochastic(a)
        else:
            x = np.ascontiguousarray(np.reshape(a, (-1,) + np.shape(a)[-2:]), dtype=np.float64)
    else:
        x, _ = _as_batch(a, "matrix")
        if x.dtype not in (np.float32, np.float64):
            x = x.astype(np.float64)
        x = np.ascontiguousarray(x)
    b, n = x.shape[0], x.shape[1]
    mask, has_special = _special_mask(special, b, n)
    radii = None
    if device is not None:
        out_f, out_i = _check_torch(x, float(tol), mask, has_special, device)
    else:
        out_f, out_i, radii = _check_cpu(x, validate, float(tol), mask, has_special, a,
                                         progress, radius)
    kappa, kappa_factor = out_f[:, 0].copy(), out_f[:, 1].copy()
    bound = 0.5 * (1.0 + kappa)
    margin = bound - kappa_factor
    return EqualityResult(
        kappa=kappa,
        kappa_factor=kappa_factor,
        bound=bound,
        margin=margin,
        holds=margin <= tol,
        holds_by_characterisation=out_i[:, 0].astype(bool),
        attaining_special=out_i[:, 4].astype(bool),
        pair=out_i[:, 1:3].copy(),
        attaining_pairs=out_i[:, 3].copy(),
        slack=out_f[:, 2].copy(),
        content_gap=out_f[:, 3].copy(),
        radius=radii if radius else None,
    )


def kappa_only(x: np.ndarray) -> np.ndarray:
    """kappa of each matrix of a float64 C-contiguous (b, n, n) batch, as `check(x,
    validate=False).kappa` returns it (the oracle's value bit for bit), without kappa(M), the pair
    or the characterisation (`pruned.kappa_over_matrices`: the pruned kernel's screen, or a
    float32 screen where a nearly rank-one rollout product leaves it too many pairs)."""
    x = np.ascontiguousarray(x, dtype=np.float64)
    threads = numba.get_num_threads()
    with _KERNEL_LOCK:
        _, qs, screens = _buffers(x.shape[1], False, threads)
        return pruned.kappa_over_matrices(x, qs, screens, kernel.tile_order(x.shape[1]))


_BLAS_LOCK = threading.Lock()  # held while the rollout's products run on one BLAS thread
_controller: tuple[int, threadpoolctl.ThreadpoolController | None] = (-1, None)


def _blas() -> threadpoolctl.ThreadpoolController:
    """threadpoolctl's controller of the BLAS libraries loaded (thread counts are read live),
    found again when modules were imported since the last call (an extension module may have
    loaded another BLAS: scipy brings its own); finding them costs about 1 ms, a count 1 µs."""
    global _controller
    if _controller[0] != len(sys.modules):
        _controller = (len(sys.modules),
                       threadpoolctl.ThreadpoolController().select(user_api="blas"))
    return _controller[1]


def _one_blas_thread() -> contextlib.AbstractContextManager:
    """A context in which BLAS runs on one thread: nothing to change where every BLAS library
    already does (a Dask worker's, whose nanny sets OPENBLAS_NUM_THREADS=1), which saves
    threadpoolctl's limit and restore (a call on 12 layers of 8 x 8: 54-63 µs, against
    78-142 µs with the limit; five interleaved timings); hold _BLAS_LOCK. Always entered as a
    context: threadpoolctl lets only one thread at a time set OpenBLAS's (process-wide) count,
    the thread that set it last until its context exits; a limit set and restored outside a
    context keeps that thread in control, and every other thread's limit is then silently
    ignored (their products would run on OpenBLAS's default threads)."""
    if all(lib.num_threads == 1 for lib in _blas().lib_controllers):
        return contextlib.nullcontext()
    return _blas().limit(limits=1)


@dataclass(frozen=True)
class Restriction:
    """A matrix restricted to a token set: kept rows/columns, rows renormalised.

    `matrix` is None when some kept row has no mass on the kept tokens (`empty_rows`, original
    numbering): it cannot be renormalised and is reported, not divided by zero.
    """

    matrix: np.ndarray | None  # (m, m) float64
    kept: np.ndarray  # (m,) int64: original indices of the kept tokens
    empty_rows: np.ndarray  # (k,) int64: original indices of kept rows with zero kept mass


def restrict(a: np.ndarray, keep: np.ndarray, row_sum_tol: float = ROW_SUM_TOL) -> Restriction:
    """Restrict a row-stochastic (n, n) matrix to the tokens where `keep` (bool (n,)) is True."""
    x = validate_stochastic(a, row_sum_tol=row_sum_tol)
    if x.shape[0] != 1:
        raise InputError(f"restrict takes one (n, n) matrix, got shape {np.shape(a)}")
    n = x.shape[1]
    mask = np.asarray(keep)
    if mask.dtype != np.bool_ or mask.shape != (n,):
        raise InputError(f"keep mask has shape {mask.shape}, dtype {mask.dtype}: need bool ({n},)")
    kept = np.flatnonzero(mask).astype(np.int64)
    if kept.size == 0:
        raise InputError("keep mask keeps no token: a token set must keep at least one token")
    sub = x[0][np.ix_(kept, kept)]  # (kept row, kept column)
    mass = sub.sum(axis=1)
    empty = kept[mass == 0.0]
    matrix = None if empty.size else sub / mass[:, None]
    return Restriction(matrix=matrix, kept=kept, empty_rows=empty)


def restrict_layers(
    layers: np.ndarray, keep: np.ndarray, out: np.ndarray | None = None,
    row_sum_tol: float = ROW_SUM_TOL,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`restrict` of each layer of an (L, n, n) stack at once, then validated as `check` wants.

    Returns (stack, kept, ok): `stack` (ok layers, m, m) float64 C-contiguous, each matrix equal
    bit for bit to `validate_stochastic(restrict(layer, keep).matrix)[0]`; `kept` (m,) int64 the
    original indices; `ok` (L,) bool the layers whose kept rows all have mass (the others are
    `restrict`'s empty-row case). One pass over the stack (`workers.exact.restrict_kernel`), no
    temporaries; errors are `restrict`'s. `out`: a float64 buffer of at least L * m * m elements
    to write into (the returned stack is then a view of it when every layer is ok).
    `row_sum_tol`: how far a row may miss 1 (`row_sum_tolerance` of the extraction dtype).
    """
    arr = np.asarray(layers)
    mask = np.asarray(keep)
    if arr.ndim != 3 or mask.dtype != np.bool_ or mask.shape != arr.shape[-1:] or not mask.any():
        for layer in arr:  # the per-layer path raises the precise error
            restrict(layer, mask, row_sum_tol)
        raise InputError(f"restrict_layers takes an (L, n, n) stack, got shape {arr.shape}")
    if arr.dtype not in (np.float32, np.float64):
        _as_batch(arr, "attention")  # a dtype `validate_stochastic` refuses is refused here
        arr = arr.astype(np.float64)
    arr = np.ascontiguousarray(arr)
    kept = np.flatnonzero(mask).astype(np.int64)
    shape = (arr.shape[0], kept.size, kept.size)
    stack = np.empty(shape) if out is None else out.reshape(-1)[: np.prod(shape)].reshape(shape)
    ok = np.empty(arr.shape[0], dtype=np.bool_)
    if not restrict_kernel.restrict_into(arr, kept, row_sum_tol, stack, ok):
        _restrict_layers_numpy(arr, mask, row_sum_tol)  # raises the precise error
        raise RuntimeError("restrict_into rejected a stack that the numpy path accepts")
    if not ok.all():
        stack = stack[ok]
    return stack, kept, ok


def _restrict_layers_numpy(
    arr: np.ndarray, mask: np.ndarray, row_sum_tol: float = ROW_SUM_TOL,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`restrict_layers` by its defining numpy steps: the reference `restrict_kernel` equals bit
    for bit (tests), and the path that names the offending layer and row on bad input."""
    try:
        x = validate_stochastic(arr, row_sum_tol=row_sum_tol)
    except NotStochasticError:
        for layer in arr:  # name the offending layer's row exactly as `restrict` does
            restrict(layer, mask, row_sum_tol)
        raise
    kept = np.flatnonzero(mask).astype(np.int64)
    sub = x[np.ix_(np.arange(x.shape[0]), kept, kept)]  # C order, as restrict's copy
    mass = sub.sum(axis=2)  # (layer, kept row): per row as restrict's sub.sum(axis=1)
    ok = ~(mass == 0.0).any(axis=1)
    if not ok.all():
        sub, mass = sub[ok], mass[ok]
    stack = np.ascontiguousarray(sub / mass[:, :, None])
    code, _, _, _ = kernel.normalise_rows(stack, row_sum_tol)
    if code:
        validate_stochastic(stack, name="attention", row_sum_tol=row_sum_tol)  # names the row
    return stack, kept, ok


def rollout_products(x: np.ndarray, reuse: bool = False) -> np.ndarray:
    """R_l = M_l @ R_{l-1}, R_1 = M_1, M_l = 0.5 * (eye + A_l) of a validated float64 (L, n, n)
    stack; (L, n, n) float64. The products run on one BLAS thread (`_one_blas_thread`, under a
    lock: the limit is process-wide), so R_l does not depend on how many threads BLAS has where
    the rollout runs (OpenBLAS's results do), and no BLAS threads are left spinning to slow the
    numba kernels that follow. `reuse`:
    factors and products live in this thread's scratch buffers (`workers.exact.scratch`), valid
    until its next `reuse` call."""
    n_layers, n = x.shape[0], x.shape[1]
    if reuse:
        factors = scratch("rollout-factors", x.shape)
        products = scratch("rollout-products", x.shape)
    else:
        factors, products = np.empty_like(x), np.empty_like(x)
    np.copyto(factors, x)
    diagonal = np.arange(n)
    factors[:, diagonal, diagonal] += 1.0  # eye + A: off the diagonal A_ik + 0.0 == A_ik
    factors *= 0.5  # (layer, row, column)
    products[0] = factors[0]
    with _BLAS_LOCK, _one_blas_thread():
        for layer in range(1, n_layers):
            np.matmul(factors[layer], products[layer - 1], out=products[layer])
    return products


def rollout(
    layers: np.ndarray, bounds: np.ndarray | None = None, validate: bool = True,
    layers_out: str = "every",
) -> tuple[np.ndarray, np.ndarray]:
    """kappa(R_l) and prod_{m <= l} (1 + kappa(A_m))/2 for l = 1..L; (L,) float64 each, or
    (1,) for l = L alone when `layers_out` is "last" (the products still run through every layer).

    R_1 = M_1, R_l = M_l @ R_{l-1} (Abnar & Zuidema order), M_l = 0.5 * (eye + A_l), float64
    (`rollout_products`); kappa(R_l) is exact with respect to the oracle applied to the float64
    matrix R_l.
    `bounds`: the layers' (1 + kappa(A_l))/2 when the caller already has them (from `check`);
    `validate=False` trusts `layers` to be validated float64 (b, n, n), as `check` does.
    """
    if layers_out not in ("every", "last"):
        raise InputError(f"layers_out {layers_out!r}: choose 'every' or 'last'")
    x = validate_stochastic(layers, name="layer") if validate else layers  # (layer, row, column)
    products = rollout_products(x, reuse=True)
    if bounds is None:
        bounds = check(x, validate=False).bound
    if layers_out == "last":
        return kappa_only(products[-1:]), np.cumprod(bounds)[-1:]
    return kappa_only(products), np.cumprod(bounds)

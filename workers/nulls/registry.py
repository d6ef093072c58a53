"""Named null models: random row-stochastic matrices that observed holding rates are set against.

A null is one function `draw(rng, b, n) -> (b, n, n)` float64 array of row-stochastic matrices,
registered by name in `NULLS`:

- `uniform`: rows i.i.d. uniform on the simplex (Dirichlet(1): normalised exponentials).
- `softmax-b<beta>` for beta in `SOFTMAX_BETAS` (`softmax-b0.5`, `softmax-b1`, `softmax-b2`,
  `softmax-b4`): rows softmax(beta * Z) with Z i.i.d. standard normal, the shape of attention
  rows built from random logits; small beta is near-uniform rows, large beta near one-hot rows.
- `qk-d<d>` and `qk-d<d>-b<beta>` (any d >= 1, beta > 0, default 1; built on demand, not part
  of `all`): rows softmax(beta * Q K^T / sqrt(d)) with Q, K (n, d) i.i.d. standard normal, the
  low-rank logits of one attention head with random queries and keys (rows are not independent).
- `qk-head` and `qk-head-b<beta>` (size-matched nulls only): `qk-d<d>[-b<beta>]` with d the
  model's own head dimension, resolved per model by `resolve_nulls` before anything is drawn.

Seeds: a draw of matrices of size n in block k of a run comes from its own generator,
`SeedSequence(seed, spawn_key=key)`, so counts never depend on how blocks are grouped into tasks.
`uniform` at the config's sizes keeps the project's original key `(n, k)` (stores and numbers
from before named nulls stay valid); every other null appends its stable code: `(n, k, code)`.
Codes and all other name-derived keys come from sha256 (`stable_int`), never Python's `hash()`.
"""

from __future__ import annotations

import functools
import math
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from storage.errors import InputError
from storage.fingerprint import stable_int
from workers.exact.equality import DEFAULT_TOL, check

NullDraw = Callable[[np.random.Generator, int, int], np.ndarray]

DRAW_BYTES = 1 << 25  # float64 bytes drawn at once (32 MiB): memory per draw, not per run
SOFTMAX_BETAS = (0.5, 1.0, 2.0, 4.0)
MAX_PLAIN_BETA = 16.0  # above it, softmax subtracts each row's maximum before exponentiating
WORKING_COPIES = 4  # float64 (n, n) copies alive while one matrix is drawn and checked


def draw_uniform_stochastic(rng: np.random.Generator, b: int, n: int) -> np.ndarray:
    """b random (n, n) matrices whose rows are i.i.d. uniform on the simplex; (b, n, n) float64."""
    e = rng.standard_exponential(size=(b, n, n))  # (matrix, row, column)
    return e / e.sum(axis=2, keepdims=True)


def draw_softmax(rng: np.random.Generator, b: int, n: int, beta: float) -> np.ndarray:
    """b random (n, n) matrices with rows softmax(beta * Z), Z i.i.d. N(0, 1); (b, n, n) float64.

    exp(beta * Z) / row sum, in place. For beta <= MAX_PLAIN_BETA no row maximum is subtracted:
    |Z| < 40 for any normal numpy draws, so exp stays far from float64 overflow (exp(709)).
    """
    z = rng.standard_normal(size=(b, n, n))  # (matrix, row, column)
    z *= beta
    if beta > MAX_PLAIN_BETA:
        z -= z.max(axis=2, keepdims=True)
    np.exp(z, out=z)
    z /= z.sum(axis=2, keepdims=True)
    return z


def draw_qk(rng: np.random.Generator, b: int, n: int, d: int, beta: float) -> np.ndarray:
    """b random (n, n) matrices softmax(beta * Q K^T / sqrt(d)) by rows, Q and K (n, d) i.i.d.
    N(0, 1); (b, n, n) float64. Each matrix draws Q then K, (2, n, d) normals, in matrix order;
    at most DRAW_BYTES of them at once. Each row's maximum is subtracted before exponentiating."""
    out = np.empty((b, n, n), dtype=np.float64)  # (matrix, row, column)
    step = max(1, DRAW_BYTES // (8 * 2 * n * d))
    for start in range(0, b, step):
        stop = min(b, start + step)
        qk = rng.standard_normal(size=(stop - start, 2, n, d))  # (matrix, Q|K, token, dim)
        z = out[start:stop]
        np.matmul(qk[:, 0], qk[:, 1].transpose(0, 2, 1), out=z)
        z *= beta / math.sqrt(d)
        z -= z.max(axis=2, keepdims=True)
        np.exp(z, out=z)
        z /= z.sum(axis=2, keepdims=True)
    return out


QK_NAME = re.compile(r"qk-d([1-9][0-9]*)(?:-b([0-9]+(?:\.[0-9]+)?))?")
QK_HEAD_NAME = re.compile(r"qk-head(-b[0-9]+(?:\.[0-9]+)?)?")


@dataclass(frozen=True)
class NullModel:
    """One registered null: its name, draw function and a one-line description."""

    name: str
    draw: NullDraw
    doc: str
    original_stream: bool = False  # uniform: config-size keys without the code (today's stream)

    @property
    def code(self) -> int:
        """The null's identity in spawn keys."""
        return stable_int(f"null:{self.name}")

    def config_key(self, n: int, block: int) -> tuple[int, ...]:
        """Spawn key of block `block` of the size-`n` trials of the config-size baseline."""
        return (n, block) if self.original_stream else (n, block, self.code)


def _softmax_name(beta: float) -> str:
    return f"softmax-b{beta:g}"


NULLS: dict[str, NullModel] = {
    "uniform": NullModel("uniform", draw_uniform_stochastic,
                         "rows i.i.d. uniform on the simplex (Dirichlet(1))", original_stream=True),
    **{
        _softmax_name(beta): NullModel(
            _softmax_name(beta), functools.partial(draw_softmax, beta=beta),
            f"rows softmax({beta:g} * Z), Z i.i.d. standard normal",
        )
        for beta in SOFTMAX_BETAS
    },
}


def _qk_null(name: str) -> NullModel | None:
    """The `qk-d<d>[-b<beta>]` null `name` stands for (name as given: `qk-d8-b1` and `qk-d8` are
    separate streams), or None when `name` is not of that form."""
    match = QK_NAME.fullmatch(name)
    if match is None:
        return None
    d, beta = int(match.group(1)), float(match.group(2) or 1.0)
    if not beta > 0:
        return None
    return NullModel(name, functools.partial(draw_qk, d=d, beta=beta),
                     f"rows softmax({beta:g} * Q K^T / sqrt({d})), Q, K (n, {d}) i.i.d. N(0, 1)")


def _unknown(name: str, choices: str) -> InputError:
    return InputError(f"unknown null {name!r}; choose from {choices}{', '.join(NULLS)}, "
                      "qk-d<d>, qk-d<d>-b<beta>, qk-head, qk-head-b<beta>")


def is_per_model(name: str) -> bool:
    """Whether null `name` stands for a different null per model (`qk-head[-b<beta>]`)."""
    return QK_HEAD_NAME.fullmatch(name) is not None


def resolve_nulls(names: Iterable[str], head_dim: int | None, model: str) -> tuple[str, ...]:
    """`names` with `qk-head[-b<beta>]` replaced by `qk-d<head_dim>[-b<beta>]` (the model's
    own head dimension), repeats dropped, order kept; InputError (one line, naming `model`)
    when one is asked for and `head_dim` is unknown."""
    resolved: list[str] = []
    for name in names:
        match = QK_HEAD_NAME.fullmatch(name)
        if match is not None:
            if head_dim is None:
                raise InputError(f"model {model!r}: null {name!r} needs the model's head "
                                 "dimension, which its family does not give; use qk-d<d>")
            name = f"qk-d{head_dim}{match.group(1) or ''}"
        resolved.append(name)
    return tuple(dict.fromkeys(resolved))


def get_null(name: str) -> NullModel:
    """The registered null `name`, or the `qk-d<d>[-b<beta>]` null it names; InputError naming
    the valid names otherwise, and for an unresolved `qk-head` (`resolve_nulls`)."""
    if name in NULLS:
        return NULLS[name]
    if is_per_model(name):
        raise InputError(f"null {name!r} is per model (d = its head dimension): use it in "
                         "matched_nulls, or give qk-d<d>")
    qk = _qk_null(name)
    if qk is None:
        raise _unknown(name, "")
    return qk


def parse_nulls(items: str | Iterable[str]) -> tuple[str, ...]:
    """Null names from a list and/or comma lists; `all` means every registered null.

    Order is kept, repeats are dropped; InputError (one line) for an unknown or empty name.
    """
    words = [items] if isinstance(items, str) else list(items)
    names: list[str] = []
    for word in words:
        for name in str(word).split(","):
            name = name.strip()
            if name == "all":
                names.extend(NULLS)
            elif name not in NULLS and _qk_null(name) is None and not is_per_model(name):
                raise _unknown(name, "all, ")
            else:
                names.append(name)
    if not names:
        raise InputError(f"give at least one null of {', '.join(NULLS)}")
    return tuple(dict.fromkeys(names))


def matrix_bytes(n: int) -> int:
    """Bytes held while one size-n matrix is drawn and tested (WORKING_COPIES float64 copies)."""
    return WORKING_COPIES * 8 * n * n


def physical_memory() -> int | None:
    """This machine's physical memory in bytes, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def check_sizes_fit(sizes: Iterable[int], memory: int | None = None) -> None:
    """InputError (one line, naming the size) if one size-n matrix cannot fit in `memory`
    (default: this machine's physical memory)."""
    memory = physical_memory() if memory is None else memory
    if memory is None:
        return
    for n in sizes:
        if matrix_bytes(n) > memory:
            raise InputError(
                f"size {n}: testing one {n}x{n} matrix needs {matrix_bytes(n) / 2**30:.1f} GiB, "
                f"more than this machine's {memory / 2**30:.1f} GiB of memory; choose smaller sizes"
            )


def count_holding(null: NullModel, rng: np.random.Generator, n: int, count: int,
                  tol: float = DEFAULT_TOL,
                  progress: Callable[[int], None] | None = None) -> tuple[int, int]:
    """(holding, disagreements) among `count` size-n draws of `null` from `rng`.

    Draws at most DRAW_BYTES at once, so memory does not grow with `count`; `progress(b)` after
    each draw of b matrices. holding counts matrices with margin <= tol; disagreements those
    where the definition and the characterisation differ (expected 0, reported, never hidden).
    """
    holding = disagreements = 0
    per_draw = max(1, DRAW_BYTES // (8 * n * n))
    for start in range(0, count, per_draw):
        b = min(per_draw, count - start)
        result = check(null.draw(rng, b, n), tol=tol, validate=False)
        holding += int(np.count_nonzero(result.holds))
        disagreements += result.disagreements
        if progress is not None:
            progress(b)
    return holding, disagreements

"""The decision radius (workers/exact/radius.py, docs/readings.md): equal to a float64 brute force
bit for bit on every path that computes it (`check(..., radius=True)` on each kernel driver, the
`content-pairs` reading), no stochastic perturbation inside it flips a verdict, and where one
pair decides a perturbation just beyond it does."""

from __future__ import annotations

import numpy as np
import pytest

from workers.exact.equality import check, restrict_layers, validate_stochastic
from workers.exact.token_kinds import TokenKind
from workers.tasks.verdicts import evaluate_input

TOL = 1e-12


def brute_radius(x: np.ndarray, rows: np.ndarray, kappa: float, margin: float, holds: bool,
                 tol: float) -> float:
    """The radius by its definition: a plain double loop over every pair, no skipping."""
    values = []
    for p, i in enumerate(rows):
        for j in rows[p + 1:]:
            s = 0.0
            for c in range(x.shape[1]):
                s += abs(x[i, c] - x[j, c])
            d = kappa - 0.5 * s
            g = min(x[i, i] - x[j, i], x[j, j] - x[i, j])
            if holds:
                values.append(max(0.5 * d, g))
            else:
                values.append(max(0.5 * d - tol, max(-g, 0.0) - 2.0 * tol))
    if holds:
        return max(min(values), 0.0)
    return max(margin - tol, min(values))


def matrices(seed: int) -> list[np.ndarray]:
    """Tight and failing rows alike: Dirichlet rows, softmax rows, diagonally heavy rows, ties."""
    rng = np.random.default_rng(seed)
    out = []
    for n in (2, 3, 4, 5, 8, 13):
        for _ in range(6):
            out.append(rng.dirichlet(np.ones(n), size=n))
            z = rng.standard_normal((n, n)) * 2.0 + np.eye(n) * rng.uniform(0, 3)
            e = np.exp(z - z.max(axis=1, keepdims=True))
            out.append(e / e.sum(axis=1, keepdims=True))
    out.append(np.full((4, 4), 0.25))  # every pair ties at kappa = 0: tight, radius 0
    out.append(np.eye(3))  # one-hot rows: tight with every gap 1
    return out


def verdicts(x: np.ndarray):
    r = check(x, tol=TOL)
    return r.kappa[0], r.margin[0], bool(r.holds[0])


def radius_of(x: np.ndarray) -> float:
    """The radius `check` stores for one (n, n) matrix."""
    return float(check(x, tol=TOL, radius=True).radius[0])


def test_radius_equals_the_float64_brute_force_bit_for_bit():
    cases = matrices(0)
    tight = 0
    for a in cases:
        x = validate_stochastic(a)  # float64, rows renormalised
        r = check(x, tol=TOL, validate=False, radius=True)
        rows = np.arange(x.shape[1])
        want = brute_radius(x[0], rows, r.kappa[0], r.margin[0], bool(r.holds[0]), TOL)
        assert r.radius[0] == want, (a, r.radius, want)
        tight += int(r.holds[0])
    assert 0 < tight < len(cases)  # both verdicts are exercised


def test_uniform_rows_have_radius_zero_and_one_hot_rows_radius_one():
    for a, want in ((np.full((4, 4), 0.25), 0.0), (np.eye(3), 1.0)):
        assert verdicts(a)[2]
        assert radius_of(a) == want


def perturb(x: np.ndarray, rho: float, rng: np.random.Generator) -> np.ndarray:
    """A random stochastic perturbation of row l1 norm rho in every row: each row moves toward
    a random target distribution (a vertex or a Dirichlet draw), so entries stay >= 0."""
    n = x.shape[0]
    out = x.copy()
    for i in range(n):
        target = np.eye(n)[rng.integers(n)] if rng.random() < 0.5 else rng.dirichlet(
            np.full(n, 0.3))
        step = target - x[i]
        norm = np.abs(step).sum()
        if norm > 0:
            out[i] = x[i] + min(1.0, rho / norm) * step
    return out


def test_no_perturbation_within_the_radius_changes_the_verdict():
    rng = np.random.default_rng(1)
    tried = 0
    for a in matrices(2):
        x = a / a.sum(axis=1, keepdims=True)
        holds = verdicts(x)[2]
        radius = radius_of(x)
        if radius < 1e-9:
            continue
        for _ in range(200):
            moved = perturb(x, 0.999 * radius, rng)
            assert np.abs(moved - x).sum(axis=1).max() <= radius
            assert verdicts(moved)[2] == holds
            tried += 1
    assert tried > 5000


def two_rows(a00: float, a10: float) -> np.ndarray:
    return np.array([[a00, 1 - a00], [a10, 1 - a10]])


@pytest.mark.parametrize(("a00", "a10"), [(0.7, 0.4), (0.4, 0.7), (0.5, 0.45), (0.45, 0.5)])
def test_at_n_2_a_perturbation_just_beyond_the_radius_flips(a00, a10):
    x = two_rows(a00, a10)
    holds = verdicts(x)[2]
    radius = radius_of(x)
    assert radius == pytest.approx(abs(a00 - a10), abs=1e-12)  # tight iff A_00 >= A_10
    sign = 1.0 if holds else -1.0  # move the rows' first entries toward each other
    for rho, flips in ((0.999 * radius, False), (1.001 * radius, True)):
        moved = two_rows(a00 - sign * rho / 2, a10 + sign * rho / 2)
        assert verdicts(moved)[2] == (holds != flips)


# Three rows, one pair decides: (0, 1) attains kappa = 3/4 and is self-dominant with gap
# g = A_00 - A_10 = 1/20; the other pairs are 0.4 or more below kappa or far from it. Moving
# row 0's mass rho/2 from column 0 to 2 and row 1's rho/2 from column 1 to 0 closes g by rho
# while (0, 1) still attains: the cell fails once rho > 1/20 (and back again).
THREE = np.array([[0.30, 0.00, 0.70], [0.25, 0.75, 0.00], [0.30, 0.35, 0.35]])


def moved_three(rho: float) -> np.ndarray:
    x = THREE.copy()
    x[0, 0] -= rho / 2
    x[0, 2] += rho / 2
    x[1, 1] -= rho / 2
    x[1, 0] += rho / 2
    return x


def test_at_n_3_the_radius_is_attained_where_one_pair_decides():
    holds = verdicts(THREE)[2]
    radius = radius_of(THREE)
    assert holds and radius == pytest.approx(0.05, abs=1e-15)
    assert verdicts(moved_three(0.999 * radius))[2]
    assert not verdicts(moved_three(1.001 * radius))[2]
    # the failing matrix at rho = 0.06 (g = -0.01) flips back beyond 0.01, not within it;
    # its margin is 0.005: the pair bound, not the margin, gives the radius here
    failing = moved_three(0.06)
    _, margin, holds = verdicts(failing)
    radius = radius_of(failing)
    assert not holds and margin == pytest.approx(0.005) and radius == pytest.approx(0.01)
    back = np.array(failing)
    for rho, tight in ((0.999 * radius, False), (1.001 * radius, True)):
        back[:] = failing
        back[0, 0] += rho / 2
        back[0, 2] -= rho / 2
        back[1, 1] += rho / 2
        back[1, 0] -= rho / 2
        assert verdicts(back)[2] == tight


def test_evaluate_input_stores_the_radius_of_each_reading():
    rng = np.random.default_rng(3)
    kinds = np.array([TokenKind.CLS] + [TokenKind.CONTENT] * 5 + [TokenKind.SEP], np.int8)
    stack = rng.dirichlet(np.ones(7) * 0.5, size=(3, 7)).astype(np.float32)  # (layer, q, k)
    content = np.flatnonzero(kinds == TokenKind.CONTENT)
    for token_set in ("all", "content", "content-pairs", "content-complement"):
        out = evaluate_input(stack, kinds, token_set, TOL)
        assert np.isfinite(out["radius"]).all() and (out["radius"] >= 0).all()
        if token_set == "all":
            x, _, _ = restrict_layers(stack, np.ones(7, bool))
            rows = np.arange(7)
        elif token_set == "content":
            x, _, _ = restrict_layers(stack, kinds == TokenKind.CONTENT)
            rows = np.arange(5)
        elif token_set == "content-pairs":
            x, _, _ = restrict_layers(stack, np.ones(7, bool))
            rows = content
        else:
            continue  # the complement's stack is pinned in test_readings; finite is enough
        for layer in range(3):
            want = brute_radius(x[layer], rows, out["kappa"][layer], out["margin"][layer],
                                bool(out["holds"][layer]), TOL)
            assert out["radius"][layer] == want, token_set

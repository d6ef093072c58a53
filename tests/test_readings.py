"""The readings of "content tokens" (docs/readings.md), the < 2-token status and attaining_kind:
hand-computed cases, exact rational oracles and float64 brute force."""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest

from storage.layout import AttainingKind, ResultStatus
from workers.exact.equality import restrict_layers
from workers.exact.readings import attaining_kinds, content_pairs, stochastic_complement
from workers.exact.token_kinds import TOKEN_SETS, TokenKind, reading_label
from workers.tasks.verdicts import evaluate_input

CLS, CONTENT, SEP = TokenKind.CLS, TokenKind.CONTENT, TokenKind.SEP
READINGS = ("all", "content", "content-pairs", "content-complement")

# CLS at 0. Hand computation (C = {1, 2, 3}):
#   all:                kappa = 3/4, attained by (0,1) (0,2) (1,3) (2,3); none mutually
#                       self-dominant (A_00 = 0 < A_10; A_33 = 0 < A_23)      -> fails
#   content:            A[C,C] renormalised = [[1,0,0],[1/2,0,1/2],[1,0,0]]: kappa = 1/2 by
#                       (1,2) (2,3); (1,2) is self-dominant (1 >= 1/2, 0 >= 0) -> holds
#   content-pairs:      full rows: kappa_12 = 1/4, kappa_13 = kappa_23 = 3/4 (kappa_C = 3/4);
#                       (1,3): A_11 = 1/4 < A_31 = 1; (2,3): A_33 = 0 < A_23  -> fails;
#                       kappa_C(M) = kappa_23(M) = 3/4, bound 7/8, margin 1/8
#   content-complement: CLS sends all its mass to token 1 (pivot 1): S = [[1,0,0],[3/4,0,1/4],
#                       [1,0,0]]: kappa = 1/4 by (1,2) (2,3); (1,2) self-dominant -> holds;
#                       kappa((I + S)/2) = 5/8 = (1 + 1/4)/2
HAND = np.array([[0, 1, 0, 0], [3 / 4, 1 / 4, 0, 0], [1 / 2, 1 / 4, 0, 1 / 4], [0, 1, 0, 0]])
HAND_KINDS = np.array([CLS, CONTENT, CONTENT, CONTENT], np.int8)


def evaluate(a: np.ndarray, kinds: np.ndarray, token_set: str) -> dict[str, np.ndarray]:
    return evaluate_input(np.asarray(a, np.float32)[None], kinds, token_set, 1e-12)


def test_every_reading_is_a_token_set_with_a_label():
    assert set(READINGS) == set(TOKEN_SETS)
    assert reading_label("content") == "content (A[C,C], renormalised)"
    assert all(reading_label(name).startswith(name + " (") for name in READINGS)


def test_hand_case_the_readings_disagree_as_computed_by_hand():
    got = {name: evaluate(HAND, HAND_KINDS, name) for name in READINGS}
    assert [bool(got[name]["holds"][0]) for name in READINGS] == [False, True, False, True]
    assert [float(got[name]["kappa"][0]) for name in READINGS] == [0.75, 0.5, 0.75, 0.25]
    pairs = got["content-pairs"]
    assert (pairs["kappa_factor"][0], pairs["bound"][0], pairs["margin"][0]) == (0.75, 0.875,
                                                                                  0.125)
    assert (pairs["pair_i"][0], pairs["pair_j"][0], pairs["attaining_pairs"][0]) == (-1, -1, 2)
    for name in ("content", "content-complement"):  # pair (1, 2) on the input's token axis
        assert (got[name]["pair_i"][0], got[name]["pair_j"][0]) == (1, 2), name
    for name, cells in got.items():
        assert cells["status"][0] == ResultStatus.OK, name
        assert cells["holds_by_characterisation"][0] == cells["holds"][0], name
        assert cells["n_kept"][0] == (4 if name == "all" else 3), name
    assert got["all"]["attaining_kind"][0] == AttainingKind.MIXED  # CLS-content and content-only
    assert got["all"]["attaining_pairs"][0] == 4
    assert np.isnan(pairs["rollout_kappa"]).all()  # content-pairs has no rollout
    complement = got["content-complement"]  # one layer: the rollout is M = (I + S)/2, tight
    assert complement["rollout_kappa"][0] == complement["rollout_bound"][0] == 0.625


def exact_kappa(x: list[list[Fraction]], rows) -> Fraction:
    return max(sum(abs(x[i][k] - x[j][k]) for k in range(len(x[i]))) / 2
               for i, j in itertools.combinations(rows, 2))


def exact_tight(x: list[list[Fraction]], rows) -> bool:
    n = len(x)
    m = [[(Fraction(int(i == k)) + x[i][k]) / 2 for k in range(n)] for i in range(n)]
    return exact_kappa(m, rows) == (1 + exact_kappa(x, rows)) / 2


def exact_complement_one_special(a: list[list[Fraction]], s: int) -> list[list[Fraction]]:
    """A_CC + A_Cs (1 - A_ss)^-1 A_sC for one special token s, in rationals."""
    c = [k for k in range(len(a)) if k != s]
    return [[a[i][j] + a[i][s] * a[s][j] / (1 - a[s][s]) for j in c] for i in c]


def test_content_and_complement_differ_where_exact_rationals_say_so():
    a = np.array([[1 / 2, 1 / 2, 0, 0], [0, 0, 1 / 2, 1 / 2], [3 / 4, 0, 1 / 4, 0], [0, 0, 1, 0]])
    q = [[Fraction(v) for v in row] for row in a]
    c = [1, 2, 3]
    sub = [[q[i][j] / sum(q[i][k] for k in c) for j in c] for i in c]
    expected = {
        "all": exact_tight(q, range(4)),
        "content": exact_tight(sub, range(3)),
        "content-pairs": exact_tight(q, c),
        "content-complement": exact_tight(exact_complement_one_special(q, 0), range(3)),
    }
    assert expected == {"all": True, "content": True, "content-pairs": False,
                        "content-complement": False}
    for name, holds in expected.items():
        assert bool(evaluate(a, HAND_KINDS, name)["holds"][0]) == holds, name
    s = stochastic_complement(a, HAND_KINDS == CONTENT)
    assert s.tolist() == [[float(v) for v in row] for row in exact_complement_one_special(q, 0)]


def brute_content_pairs(a: np.ndarray, rows: np.ndarray, tol: float) -> dict:
    """The float64 oracle: M = 0.5 * (I + A), a double loop over content pairs i < j of
    0.5 * sequential sums over all columns, the maximum; the pair of least combined slack."""
    m = 0.5 * (np.eye(a.shape[0]) + a)

    def tv(x, i, j):
        s = 0.0
        for k in range(x.shape[1]):
            s += abs(x[i, k] - x[j, k])
        return 0.5 * s

    pairs = list(itertools.combinations(rows.tolist(), 2))
    ka = {p: tv(a, *p) for p in pairs}
    kappa, kappa_factor = max(ka.values()), max(tv(m, *p) for p in pairs)
    slack = {(i, j): 0.5 * (kappa - ka[i, j]) + 0.5 * (max(a[j, i] - a[i, i], 0.0)
                                                       + max(a[i, j] - a[j, j], 0.0))
             for i, j in pairs}
    within = [p for p in pairs if slack[p] <= tol]
    pair = min(within, key=lambda p: slack[p]) if within else (-1, -1)
    return {"kappa": kappa, "kappa_factor": kappa_factor, "bound": 0.5 * (1.0 + kappa),
            "margin": 0.5 * (1.0 + kappa) - kappa_factor, "pair": pair,
            "attaining_pairs": sum(kappa - v <= tol for v in ka.values()),
            "slack": min(slack.values())}


def random_attention(rng: np.random.Generator, n: int) -> np.ndarray:
    """Softmax rows with a sink on token 0 and a diagonal boost, a few tied or one-hot rows."""
    logits = rng.normal(size=(n, n)) * rng.uniform(0.5, 4)
    logits[:, 0] += rng.uniform(0, 3)
    logits[np.diag_indices(n)] += rng.uniform(0, 2)
    a = np.exp(logits)
    a /= a.sum(axis=1, keepdims=True)
    if rng.random() < 0.3:
        a[2] = a[1]  # identical content rows
    if rng.random() < 0.3:
        a[n - 2] = np.eye(n)[int(rng.integers(n))]  # a one-hot row
    return a


@pytest.mark.parametrize("seed", range(6))
def test_content_pairs_equal_the_float64_brute_force_bit_for_bit(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(4, 12))
    stack = np.stack([random_attention(rng, n) for _ in range(5)])  # (b, n, n)
    rows = np.arange(1, n - 1)  # CLS at 0, SEP at n - 1
    got = content_pairs(stack, rows, 1e-12)
    for b, a in enumerate(stack):
        want = brute_content_pairs(a, rows, 1e-12)
        for name in ("kappa", "kappa_factor", "bound", "margin", "attaining_pairs", "slack"):
            assert got[name][b] == want[name], (name, b)
        assert (got["pair_i"][b], got["pair_j"][b]) == want["pair"]
        assert got["holds"][b] == got["holds_by_characterisation"][b] == (want["margin"] <= 1e-12)


def test_content_pairs_on_a_token_set_of_identity_rows_holds():
    kinds = np.array([CLS, CONTENT, CONTENT, SEP], np.int8)
    out = evaluate(np.eye(4), kinds, "content-pairs")
    assert out["holds"][0] and (out["pair_i"][0], out["pair_j"][0]) == (1, 2)
    assert (out["kappa"][0], out["margin"][0]) == (1.0, 0.0)


@pytest.mark.parametrize("specials", [(0,), (0, 5), (0, 1, 7)])
def test_complement_is_the_solve_formula_and_stochastic(specials):
    rng = np.random.default_rng(len(specials))
    for _ in range(4):
        a = random_attention(rng, 8)
        content = np.ones(8, bool)
        content[list(specials)] = False
        c, s = np.flatnonzero(content), np.flatnonzero(~content)
        solve = a[np.ix_(c, c)] + a[np.ix_(c, s)] @ np.linalg.solve(
            np.eye(s.size) - a[np.ix_(s, s)], a[np.ix_(s, c)])
        got = stochastic_complement(a, content)
        np.testing.assert_allclose(got, solve, rtol=0, atol=1e-13)
        assert (got >= 0).all()
        np.testing.assert_allclose(got.sum(axis=1), 1.0, rtol=0, atol=1e-13)


def test_no_special_token_makes_the_complement_the_matrix_itself():
    a = random_attention(np.random.default_rng(9), 5)
    np.testing.assert_array_equal(stochastic_complement(a, np.ones(5, bool)), a)


def test_a_closed_class_of_special_tokens_is_singular_and_stops_the_rollout():
    rng = np.random.default_rng(4)
    layers = np.stack([random_attention(rng, 5) for _ in range(3)])
    layers[1, 0] = [0, 0, 0, 0, 1]  # CLS and SEP attend only to each other: a closed class
    layers[1, 4] = [1, 0, 0, 0, 0]
    kinds = np.array([CLS, CONTENT, CONTENT, CONTENT, SEP], np.int8)
    out = evaluate_input(layers.astype(np.float32), kinds, "content-complement", 1e-12)
    assert out["status"].tolist() == [ResultStatus.OK, ResultStatus.SINGULAR, ResultStatus.OK]
    assert np.isnan(out["kappa"][1]) and not np.isnan(out["kappa"][2])
    assert not np.isnan(out["rollout_kappa"][0]) and np.isnan(out["rollout_kappa"][1:]).all()
    assert stochastic_complement(np.eye(3), np.array([True, True, False])) is None  # a_ss = 1


@pytest.mark.parametrize("token_set", READINGS)
def test_a_token_set_with_one_token_has_a_status_of_its_own(token_set):
    attention = random_attention(np.random.default_rng(5), 3)[None]  # a one-word sentence
    kinds = np.array([CLS, CONTENT, SEP], np.int8)
    out = evaluate_input(attention.astype(np.float32), kinds, token_set, 1e-12)
    if token_set == "all":
        assert out["status"][0] == ResultStatus.OK
    else:
        assert out["status"][0] == ResultStatus.ONE_TOKEN and out["n_kept"][0] == 1
        assert np.isnan(out["kappa"][0]) and not out["holds"][0] and out["pair_i"][0] == -1
    single = evaluate_input(np.ones((2, 1, 1), np.float32), np.array([CONTENT], np.int8),
                            token_set, 1e-12)
    assert (single["status"] == ResultStatus.ONE_TOKEN).all()


def oracle_pairs(a: np.ndarray) -> dict[tuple[int, int], float]:
    """kappa_ij of every pair i < j in the oracle's order: 0.5 * sequential left-to-right sum."""
    def tv(i, j):
        s = 0.0
        for k in range(a.shape[1]):
            s += abs(a[i, k] - a[j, k])
        return 0.5 * s

    return {p: tv(*p) for p in itertools.combinations(range(a.shape[0]), 2)}


def brute_kind(a: np.ndarray, kinds: np.ndarray, tol: float) -> int:
    """The AttainingKind of a matrix by enumerating every pair in the oracle's order."""
    values = oracle_pairs(a)
    kappa = max(values.values())
    classes = set()
    for (i, j), v in values.items():
        if kappa - v <= tol:
            special = [int(kinds[t]) for t in (i, j) if kinds[t] != CONTENT]
            classes.add(AttainingKind.CONTENT_ONLY if not special else special[0]
                        if len(special) == 1 else AttainingKind.SPECIAL_SPECIAL)
    return classes.pop() if len(classes) == 1 else AttainingKind.MIXED


def test_attaining_kind_equals_the_classes_of_every_attaining_pair():
    rng = np.random.default_rng(7)
    seen = set()
    for trial in range(60):
        n = int(rng.integers(3, 8))
        kinds = rng.choice([CONTENT, CONTENT, CLS, TokenKind.REGISTER, SEP, TokenKind.DIST],
                           size=n).astype(np.int8)
        a = random_attention(rng, n)
        if trial % 5 == 0:
            a = np.eye(n)[rng.integers(n, size=n)]  # one-hot rows: many ties
        out = evaluate(a, kinds, "all")
        tested, _, _ = restrict_layers(a.astype(np.float32)[None], np.ones(n, bool))  # as `all`
        want = brute_kind(tested[0], kinds, 1e-12)
        assert out["attaining_kind"][0] == want, (trial, kinds)
        seen.add(want)
    assert {AttainingKind.CONTENT_ONLY, AttainingKind.MIXED} < seen and len(seen) >= 4


def brute_kappa_and_special(a: np.ndarray, kinds: np.ndarray, tol: float) -> tuple[float, bool]:
    """The oracle's kappa, and whether every pair within tol of it has a special token."""
    values = oracle_pairs(a)
    kappa = max(values.values())
    content_attains = any(kappa - v <= tol and kinds[i] == CONTENT and kinds[j] == CONTENT
                          for (i, j), v in values.items())
    return kappa, not content_attains


@pytest.mark.parametrize("tol", [0.0, 1e-12, 1e-3])
def test_attaining_kind_is_the_oracles_when_special_pairs_tie_kappa_to_the_last_bit(tol):
    """A special row copied from a row of the attaining pair, nudged by an ulp or not at all,
    ties kappa or misses it by an ulp: the screen that skips pairs far below kappa must leave
    every such pair to the oracle's sum."""
    rng = np.random.default_rng(11)
    for trial in range(12):
        n = int(rng.integers(20, 48))
        a = random_attention(rng, n).astype(np.float64)
        a /= a.sum(axis=1, keepdims=True)
        kinds = np.full(n, CONTENT, np.int8)
        specials = rng.choice(n, size=3, replace=False)
        kinds[specials] = rng.choice([CLS, TokenKind.REGISTER, SEP], size=3)
        kappa, _ = brute_kappa_and_special(a, kinds, 0.0)
        i, j = next(p for p in itertools.combinations(range(n), 2)
                    if 0.5 * sum(abs(a[p[0]] - a[p[1]])) >= kappa - 1e-9)
        s = next(t for t in specials if t not in (i, j))
        a[s] = a[j]
        if trial % 3:
            k = int(rng.integers(n))
            a[s, k] = np.nextafter(a[s, k], 1.0 if trial % 3 == 1 else 0.0)
        kappa, special = brute_kappa_and_special(a, kinds, tol)
        got = attaining_kinds(a[None], kinds, np.array([kappa]), np.array([special]), tol)
        assert got[0] == brute_kind(a, kinds, tol), (trial, tol)


def test_attaining_kinds_needs_real_token_kinds():
    with pytest.raises(ValueError, match="real tokens"):
        attaining_kinds(np.eye(2)[None], np.array([0, -1]), np.ones(1), np.zeros(1, bool), 0.0)

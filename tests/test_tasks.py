"""The test task's per-input body: statuses for token sets that lose rows or keep nothing."""

from __future__ import annotations

import numpy as np

from storage.layout import RESULT_VARS, ResultStatus
from workers.exact.equality import check, rollout
from workers.exact.token_kinds import TokenKind
from workers.tasks.verdicts import evaluate_input, evaluate_shard

CLS, CONTENT, PAD = TokenKind.CLS, TokenKind.CONTENT, TokenKind.PAD


def stochastic(rng: np.random.Generator, layers: int, n: int) -> np.ndarray:
    a = rng.random((layers, n, n))
    return (a / a.sum(-1, keepdims=True)).astype(np.float32)


def test_all_tokens_give_check_and_rollout_of_the_whole_matrices():
    attention = stochastic(np.random.default_rng(0), 3, 5)
    kinds = np.array([CLS, CONTENT, CONTENT, CONTENT, CONTENT], np.int8)
    out = evaluate_input(attention, kinds, "all", 1e-12)
    expected = check(attention.astype(np.float64), special=kinds != CONTENT)
    # Rows are renormalised once more by the (all-keeping) restriction: equal up to rounding.
    np.testing.assert_allclose(out["kappa"], expected.kappa, rtol=0, atol=1e-12)
    np.testing.assert_allclose(out["margin"], expected.margin, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(out["holds"], expected.holds)
    np.testing.assert_allclose(out["rollout_kappa"], rollout(attention.astype(np.float64))[0],
                               rtol=0, atol=1e-12)
    assert (out["status"] == ResultStatus.OK).all() and (out["n_kept"] == 5).all()


def test_pairs_are_numbered_on_the_input_token_axis():
    attention = np.zeros((1, 3, 3), np.float32)
    attention[0] = [[1, 0, 0], [0, 1, 0], [0, 0, 1]]  # identity: every content pair attains
    kinds = np.array([CLS, CONTENT, CONTENT], np.int8)
    out = evaluate_input(attention, kinds, "content", 1e-12)
    assert (out["pair_i"][0], out["pair_j"][0]) == (1, 2)  # not (0, 1) of the restricted matrix
    assert out["holds"][0] and out["n_kept"][0] == 2


def test_a_content_row_with_no_content_mass_is_reported_and_stops_the_rollout():
    rng = np.random.default_rng(1)
    attention = stochastic(rng, 3, 4)
    attention[1, 2] = [1, 0, 0, 0]  # layer 1: content token 2 attends only to CLS
    kinds = np.array([CLS, CONTENT, CONTENT, CONTENT], np.int8)
    out = evaluate_input(attention, kinds, "content", 1e-12)
    assert out["status"].tolist() == [ResultStatus.OK, ResultStatus.EMPTY_ROW, ResultStatus.OK]
    assert np.isnan(out["kappa"][1]) and not np.isnan(out["kappa"][2])
    assert not np.isnan(out["rollout_kappa"][0]) and np.isnan(out["rollout_kappa"][1:]).all()


def test_a_token_set_that_keeps_nothing_is_too_small():
    attention = stochastic(np.random.default_rng(2), 2, 2)
    out = evaluate_input(attention, np.array([CLS, CLS], np.int8), "content", 1e-12)
    assert (out["status"] == ResultStatus.TOO_SMALL).all() and (out["n_kept"] == 0).all()


def test_shard_results_cover_each_input_up_to_its_own_length():
    rng = np.random.default_rng(3)
    padded = np.zeros((2, 2, 1, 4, 4), np.float32)  # (input, layer, head, query, key)
    padded[0, :, 0] = stochastic(rng, 2, 4)
    padded[1, :, 0, :3, :3] = stochastic(rng, 2, 3)
    kinds = np.array([[CLS, CONTENT, CONTENT, CONTENT], [CLS, CONTENT, CONTENT, PAD]], np.int8)
    results = evaluate_shard(padded, np.array([4, 3]), kinds, ("all", "content"), 1e-12)
    assert set(results) == set(RESULT_VARS)
    assert results["n_kept"][:, 0, 0, :].tolist() == [[4, 3], [3, 2]]
    alone = evaluate_input(padded[1, :, 0, :3, :3], kinds[1, :3], "content", 1e-12)
    np.testing.assert_array_equal(results["margin"][1, :, 0, 1], alone["margin"])


def bfloat16_head_mean(rng: np.random.Generator, heads: int, t: int) -> np.ndarray:
    """(t, t) float32: each head's softmax rounded to bfloat16, then averaged in float32, as
    extraction stores a model run in bfloat16."""
    import torch

    logits = torch.from_numpy(rng.normal(size=(heads, t, t)) * 3.0)
    probs = torch.softmax(logits, dim=-1).to(torch.bfloat16)
    return probs.mean(dim=0, dtype=torch.float32).numpy()


def test_attention_extracted_in_bfloat16_is_tested_within_its_own_row_sum_tolerance():
    """Rows rounded to bfloat16 miss 1 by more than ROW_SUM_TOL (1e-3): refused at float32's
    tolerance, tested at bfloat16's (`row_sum_tolerance`), where every cell gets a verdict."""
    import pytest

    from storage.errors import NotStochasticError
    from workers.exact.equality import ROW_SUM_TOL, row_sum_tolerance

    rng = np.random.default_rng(8)
    stack = np.stack([bfloat16_head_mean(rng, 4, 160) for _ in range(3)])  # (layer, q, k)
    miss = np.abs(stack.astype(np.float64).sum(axis=-1) - 1.0).max()
    assert ROW_SUM_TOL < miss <= 2.0**-8  # the case at hand: past float32's, within bfloat16's
    kinds = np.full(160, TokenKind.CONTENT, dtype=np.int8)
    kinds[0] = TokenKind.CLS
    for token_set in ("all", "content", "content-pairs", "content-complement"):
        with pytest.raises(NotStochasticError, match="must be 1 within 0.001"):
            evaluate_input(stack, kinds, token_set, 1e-12)
        out = evaluate_input(stack, kinds, token_set, 1e-12,
                             row_sum_tol=row_sum_tolerance("bfloat16"))
        assert (out["status"] == ResultStatus.OK).all() and np.isfinite(out["radius"]).all()

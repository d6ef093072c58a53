"""The `rollout: every | last | off` sweep key: parsed, carried to the test tasks, fingerprinted
only when it changes stored values, and applied by the test stage (NaN where not computed)."""

from __future__ import annotations

import typing

import numpy as np
import pytest

from storage.errors import InputError
from sweep.config.load import parse_config
from sweep.config.schema import Rollout
from sweep.driver.plan import ModelFacts, TestTask, build_plan
from workers.exact.equality import ROLLOUT_MODES, restrict_layers, rollout
from workers.exact.token_kinds import TokenKind
from workers.tasks.verdicts import evaluate_input, evaluate_shard

CONFIG = {
    "store": "/tmp/never-written.zarr",
    "shard_size": 4,
    "datasets": {"photos": {"source": "sklearn:sample_images"}},
    "models": {"vit": {"source": "tiny-vit", "dataset": "photos"}},
}
FACTS = {"vit": ModelFacts.from_counts(tuple(f"img{i}" for i in range(6)), 3, (9,) * 6)}


def plan_of(**changes):
    return build_plan(parse_config({**CONFIG, **changes}), FACTS)


def attention_stack(rng: np.random.Generator, layers: int, t: int) -> np.ndarray:
    logits = rng.normal(size=(layers, t, t))
    e = np.exp(logits)
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


def test_the_config_modes_are_the_workers_modes():
    assert typing.get_args(Rollout) == ROLLOUT_MODES


def test_rollout_defaults_to_every_and_reaches_every_test_task():
    assert plan_of().config.rollout == "every"
    tasks = [t for t in plan_of(rollout="last").tasks if isinstance(t, TestTask)]
    assert tasks and {t.rollout for t in tasks} == {"last"}


def test_the_fingerprint_changes_only_away_from_the_default():
    base = plan_of().models[0]
    assert "rollout" not in base.fingerprint_inputs()  # stores from before the key still resume
    assert plan_of(rollout="every").models[0].fingerprint == base.fingerprint
    last, off = plan_of(rollout="last").models[0], plan_of(rollout="off").models[0]
    assert len({base.fingerprint, last.fingerprint, off.fingerprint}) == 3


def test_an_unknown_rollout_mode_is_a_one_line_error_naming_the_key():
    with pytest.raises(InputError, match="^rollout: .*'every'"):
        plan_of(rollout="sometimes")
    with pytest.raises(InputError, match="rollout 'sometimes'"):
        evaluate_input(np.ones((1, 2, 2), np.float32) / 2, np.zeros(2, np.int8), "all", 1e-12,
                       "sometimes")


def test_last_and_off_leave_the_rollout_nan_where_not_computed_and_the_rest_unchanged():
    rng = np.random.default_rng(3)
    attention = attention_stack(rng, 4, 7)
    kinds = np.zeros(7, np.int8)
    every = evaluate_input(attention, kinds, "all", 1e-12, "every")
    last = evaluate_input(attention, kinds, "all", 1e-12, "last")
    off = evaluate_input(attention, kinds, "all", 1e-12, "off")
    for name in ("kappa", "kappa_factor", "margin", "holds", "pair_i", "status"):
        assert np.array_equal(every[name], last[name]) and np.array_equal(every[name], off[name])
    stack = restrict_layers(attention, np.ones(7, dtype=bool))[0]
    kappa_r, bound_r = rollout(stack, validate=False)
    assert np.array_equal(every["rollout_kappa"], kappa_r)
    assert np.array_equal(every["rollout_bound"], bound_r)
    assert np.isnan(last["rollout_kappa"][:-1]).all() and np.isnan(last["rollout_bound"][:-1]).all()
    assert last["rollout_kappa"][-1] == kappa_r[-1] and last["rollout_bound"][-1] == bound_r[-1]
    assert np.isnan(off["rollout_kappa"]).all() and np.isnan(off["rollout_bound"]).all()


def test_last_computes_nothing_when_a_layer_fails_before_the_last():
    attention = np.full((3, 3, 3), 1 / 3, np.float32)
    attention[1, 2] = [1.0, 0.0, 0.0]  # layer 1: content row 2 has no content mass
    kinds = np.array([TokenKind.CLS, TokenKind.CONTENT, TokenKind.CONTENT], np.int8)
    out = evaluate_input(attention, kinds, "content", 1e-12, "last")
    assert np.isnan(out["rollout_kappa"]).all()
    assert not np.isnan(evaluate_input(attention, kinds, "content", 1e-12)["rollout_kappa"][0])


def test_the_shard_passes_the_mode_to_every_input():
    rng = np.random.default_rng(4)
    attention = np.stack([attention_stack(rng, 2, 5) for _ in range(2)])[:, :, None]  # one head
    kinds = np.zeros((2, 5), np.int8)
    out = evaluate_shard(attention, np.array([5, 5]), kinds, ("all",), 1e-12, "off")
    assert np.isnan(out["rollout_kappa"]).all() and not np.isnan(out["kappa"]).any()

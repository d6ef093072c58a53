"""`rollout_device: extraction`: the rollout's products and their kappa computed in float64 on the
extraction's torch device (here torch's `cpu`, the stand-in for a GPU), stored, and read back by
the test task instead of its own products. The rollout kappa stays within the documented bound
(`workers.exact.device_rollout.kappa_bound`) of the CPU path's, every other stored value is the
CPU path's bit for bit, and a default config's stores and fingerprints are unchanged."""

from __future__ import annotations

import numpy as np
import pytest

import workers.exact.cells
from storage.layout import DEVICE_ROLLOUT
from sweep.config.load import load_config, parse_config
from sweep.driver.plan import ExtractTask, TestTask, build_plan
from sweep.driver.runner import InProcessExecutor, run_sweep
from tests.store_fixtures import stored_arrays
from tests.test_rollout_option import CONFIG, FACTS
from tests.test_sweep_local import write_config
from workers.exact.device_rollout import kappa_bound, restricted_rollout_kappa
from workers.exact.equality import restrict_layers, rollout


def attention_like(rng: np.random.Generator, layers: int, t: int) -> np.ndarray:
    """Softmax rows with a sink on column 0 and a heavy diagonal, float32 (as extracted)."""
    logits = 2.0 * rng.normal(size=(layers, t, t))
    logits[..., 0] += 4.0
    logits[..., np.arange(t), np.arange(t)] += 2.0
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


def cpu_path(attention: np.ndarray, keep: np.ndarray, layers_out: str = "every") -> np.ndarray:
    """The test stage's rollout kappa per layer (NaN where it computes none)."""
    stack, _, ok = restrict_layers(attention, keep)
    out = np.full(len(attention), np.nan)
    prefix = int(np.argmin(ok)) if not ok.all() else ok.size
    if layers_out == "every" and prefix:
        out[:prefix] = rollout(stack[:prefix], validate=False)[0]
    elif layers_out == "last" and prefix == ok.size:
        out[-1] = rollout(stack, validate=False, layers_out="last")[0][0]
    return out


def bounds(layers: int, n: int) -> np.ndarray:
    return np.array([kappa_bound(layer, n) for layer in range(1, layers + 1)])


@pytest.mark.parametrize("t, layers", [(2, 3), (9, 12), (65, 12), (197, 4)])
@pytest.mark.parametrize("layers_out", ["every", "last"])
def test_the_device_rollout_kappa_is_within_the_bound_of_the_cpu_path(t, layers, layers_out):
    rng = np.random.default_rng(t)
    for keep in (np.ones(t, dtype=bool), np.arange(t) > 0):
        if keep.sum() < 2:
            continue
        attention = attention_like(rng, layers, t)
        cpu = cpu_path(attention, keep, layers_out)
        device = restricted_rollout_kappa(attention, keep, "cpu", layers_out)
        np.testing.assert_array_equal(np.isnan(device), np.isnan(cpu))
        done = ~np.isnan(cpu)
        gap = np.abs(device - cpu)[done]
        assert done.any() and np.all(gap <= bounds(layers, t)[done]), gap


def test_the_rollout_stops_where_a_kept_row_has_no_mass_on_both_paths():
    rng = np.random.default_rng(5)
    attention = attention_like(rng, 4, 6)
    attention[2, 3, 1:] = 0.0  # layer 3: token 3 attends only to token 0, dropped by `content`
    attention[2, 3, 0] = 1.0
    keep = np.arange(6) > 0
    cpu, device = cpu_path(attention, keep), restricted_rollout_kappa(attention, keep, "cpu")
    assert np.isnan(cpu).tolist() == np.isnan(device).tolist() == [False, False, True, True]
    assert np.all(np.abs(device - cpu)[:2] <= bounds(2, 6))
    assert np.isnan(restricted_rollout_kappa(attention, keep, "cpu", "last")).all()


def test_the_bound_grows_with_layers_and_tokens_and_stays_far_below_the_tolerance():
    assert kappa_bound(2, 100) == pytest.approx(2 * kappa_bound(1, 100))
    assert kappa_bound(1, 200) > kappa_bound(1, 100)
    assert kappa_bound(12, 197) < 3e-12 and kappa_bound(24, 1370) < 3e-11


def test_the_option_defaults_to_test_and_is_fingerprinted_only_when_set():
    default = build_plan(parse_config(CONFIG), FACTS)
    assert "rollout_device" not in default.models[0].fingerprint_inputs()
    assert {t.device_rollout for t in default.tasks if isinstance(t, ExtractTask)} == {"off"}
    assert {t.device_rollout for t in default.tasks if isinstance(t, TestTask)} == {False}
    on = build_plan(parse_config({**CONFIG, "rollout_device": "extraction",
                                  "rollout": "last"}), FACTS)
    assert on.models[0].fingerprint_inputs()["rollout_device"] == "extraction"
    assert {t.device_rollout for t in on.tasks if isinstance(t, ExtractTask)} == {"last"}
    assert {t.device_rollout for t in on.tasks if isinstance(t, TestTask)} == {True}


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """The same small sweep (tiny DeiT, tiny RoBERTa, content and all) with the default and with
    `rollout_device: extraction`; the second's test stage must never run the CPU products."""
    out = {}
    for name, extra in (("cpu", ""), ("device", "rollout_device: extraction")):
        folder = tmp_path_factory.mktemp(name)
        config = load_config(write_config(folder, models=("vit", "rob"), extra=extra))
        if name == "device":
            with pytest.MonkeyPatch.context() as patch:
                def no_products(*_args, **_kwargs):
                    raise AssertionError("the test stage ran the rollout's products")
                patch.setattr(workers.exact.cells, "rollout", no_products)
                assert run_sweep(config, InProcessExecutor(), progress=False).exit_code == 0
        else:
            assert run_sweep(config, InProcessExecutor(), progress=False).exit_code == 0
        out[name] = stored_arrays(config.store)
    return out


def test_a_sweep_on_the_device_equals_the_cpu_sweep_but_the_rollout_kappa_within_the_bound(
        stores):
    cpu, device = stores["cpu"], stores["device"]
    extra = {key for key in device if DEVICE_ROLLOUT in key}
    assert extra and not any(DEVICE_ROLLOUT in key for key in cpu)
    assert sorted(set(device) - extra) == sorted(cpu)
    compared = 0
    for key in cpu:
        if key.endswith("results/rollout_kappa"):
            a, b = cpu[key], device[key]
            np.testing.assert_array_equal(np.isnan(a), np.isnan(b), err_msg=key)
            t = cpu[key.replace("results/rollout_kappa", "n_tokens")][:, None, None, None]
            layer = np.arange(1, a.shape[1] + 1)[None, :, None, None]
            bound = np.broadcast_to(
                8 * layer * (t + 1) * 2.0**-53 / (1 - (t + 1) * 2.0**-53), a.shape)
            done = ~np.isnan(a)
            assert np.all(np.abs(a - b)[done] <= bound[done]), key
            assert np.array_equal(device[key.replace("results/rollout_kappa", DEVICE_ROLLOUT)][
                done], b[done])
            compared += int(done.sum())
        elif not key.endswith(".done") and "markers" not in key:
            np.testing.assert_array_equal(cpu[key], device[key], err_msg=key, strict=True)
    assert compared > 0

"""One input's result cells (per layer) filled from a `check` result and a rollout: shared by
the restriction readings (`workers.tasks.verdicts.evaluate_input`) and the stochastic complement
(`workers.exact.readings`)."""

from __future__ import annotations

import numpy as np

from workers.exact.equality import EqualityResult, rollout

CHECKED = ("kappa", "kappa_factor", "bound", "margin", "holds", "holds_by_characterisation",
           "attaining_pairs", "attaining_special", "slack", "content_gap")


def fill_verdicts(out: dict[str, np.ndarray], result: EqualityResult, ok: np.ndarray,
                  kept: np.ndarray) -> None:
    """Copy `result` (one row per ok layer; its radius too, when it has one) into the ok layers
    of `out`; the returned pair is mapped back to the input's token axis through `kept` (-1
    where there is none)."""
    for name in CHECKED:
        out[name][ok] = getattr(result, name)
    if result.radius is not None:
        out["radius"][ok] = result.radius
    has_pair = result.pair[:, 0] >= 0
    out["pair_i"][ok] = np.where(has_pair, kept[result.pair[:, 0]], -1)
    out["pair_j"][ok] = np.where(has_pair, kept[result.pair[:, 1]], -1)


def fill_rollout(out: dict[str, np.ndarray], stack: np.ndarray, bounds: np.ndarray,
                 ok: np.ndarray, rollout_mode: str, kappa: np.ndarray | None = None) -> None:
    """The whole rollout of the ok layers' `stack` where `rollout_mode` asks for it: `every`
    layer up to the first failed one, the `last` layer only if none failed, or `off`.
    `kappa`: the rollout's kappa per layer already computed on the extraction device
    (`workers.exact.device_rollout`, `rollout_prefix` says where), used instead of the products;
    the bound is computed here either way."""
    prefix = rollout_prefix(ok)
    if rollout_mode == "last" and prefix == ok.size:
        if kappa is None:
            kappa_r, bound_r = rollout(stack, bounds=bounds, validate=False, layers_out="last")
        else:
            kappa_r, bound_r = kappa[-1:], np.cumprod(bounds)[-1:]
        out["rollout_kappa"][-1:] = kappa_r
        out["rollout_bound"][-1:] = bound_r
    elif rollout_mode == "every" and prefix:
        if kappa is None:
            kappa_r, bound_r = rollout(stack[:prefix], bounds=bounds[:prefix], validate=False)
        else:
            kappa_r, bound_r = kappa[:prefix], np.cumprod(bounds[:prefix])
        out["rollout_kappa"][:prefix] = kappa_r
        out["rollout_bound"][:prefix] = bound_r


def rollout_prefix(ok: np.ndarray) -> int:
    """Layers the rollout runs through: up to the first layer that failed restriction."""
    return int(np.argmin(ok)) if not ok.all() else ok.size

"""The whole rollout's kappa on a torch device: the restriction to a token set, R_l = M_l R_{l-1}
and kappa(R_l) in float64 where the attention was extracted (`rollout_device: extraction`), so
the CPU test task skips them and the extraction worker's CPU does not take them on.

The CPU path (`workers.exact.equality.restrict_layers`, then `rollout`) returns the oracle's
kappa of its own float64 products; this one restricts, renormalises and sums in the device's
order (its sums, matmul and torch.cdist), so the two differ by float64 rounding only, at most
`kappa_bound(l, t)` at layer l of an input of t tokens (the derivation: docs/readings.md, "The
rollout on the extraction device"). Verdicts and each layer's kappa never come from here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

UNIT_ROUNDOFF = 2.0**-53


def gamma(n: int) -> float:
    """gamma_n = n u / (1 - n u): the relative error bound of a float64 sum of n terms, or of a
    dot product of length n, in any order (fused multiply-adds included)."""
    nu = n * UNIT_ROUNDOFF
    return nu / (1.0 - nu)


def kappa_bound(layer: int, t: int) -> float:
    """How far this module's kappa(R_layer) (1-based layer) for any token set of an input of t
    tokens may be from the CPU path's: 8 * layer * gamma_{t+1}. The paths' renormalised rows
    differ by at most 5 gamma_{t+1} (the CPU renormalises three times, once over the whole row of
    t, this path twice), so the factors M = (I + A)/2 by 3 gamma_{t+1} in the max-row-l1 norm;
    each product adds at most gamma_t per path, each kappa evaluation gamma_t, and kappa moves
    by at most the max-row-l1 change: at most (3 l + 2 l) gamma_{t+1} <= 8 l gamma_{t+1} with
    room for the row sums' own rounding (docs/readings.md)."""
    return 8.0 * layer * gamma(t + 1)


def restricted_rollout_kappa(attention: Any, keep: np.ndarray, device: str,
                             layers_out: str = "every") -> np.ndarray:
    """kappa(R_l) of one (L, T, T) attention stack (numpy, or a torch tensor: read where it
    is, e.g. the extraction's buffer on the device) restricted to the tokens `keep` (bool (T,),
    two or more), as the test stage computes it from `restrict_layers` and `rollout`, but on
    torch device `device` in float64: rows of A[keep, keep] renormalised (twice, as the CPU
    path's validation does), M_l = 0.5 * (eye + A_l), R_1 = M_1, R_l = M_l R_{l-1}, kappa(R) =
    max over row pairs of half their l1 distance (torch.cdist, p = 1). (L,) float64: `every`
    layer up to the first whose kept rows have a row without mass, or the last layer alone
    (`last`, only when none has one); NaN elsewhere."""
    import torch

    out = np.full(attention.shape[0], np.nan)
    kept = torch.from_numpy(np.flatnonzero(keep)).to(device)
    if not isinstance(attention, torch.Tensor):
        attention = torch.from_numpy(np.ascontiguousarray(attention))
    a = attention.to(device)  # (layer, T, T)
    sub = a.index_select(1, kept).index_select(2, kept).to(torch.float64)
    mass = sub.sum(dim=-1)  # (layer, kept row): 0 only where every kept entry is 0
    ok = (mass > 0).all(dim=-1).cpu().numpy()
    prefix = int(np.argmin(ok)) if not ok.all() else ok.size
    if prefix == 0 or (layers_out == "last" and prefix < ok.size):
        return out
    stack = sub[:prefix] / mass[:prefix, :, None]
    stack /= stack.sum(dim=-1, keepdim=True)
    factors = stack
    factors.diagonal(dim1=-2, dim2=-1).add_(1.0)  # eye + A, element by element
    factors.mul_(0.5)  # (layer, row, column)
    products = torch.empty_like(factors)
    products[0] = factors[0]
    for layer in range(1, prefix):
        torch.matmul(factors[layer], products[layer - 1], out=products[layer])
    wanted = products if layers_out == "every" else products[-1:]
    kappa = 0.5 * torch.cdist(wanted, wanted, p=1).amax(dim=(-2, -1))  # (layer,)
    if layers_out == "every":
        out[:prefix] = kappa.cpu().numpy()
    else:
        out[-1] = float(kappa[-1])
    return out

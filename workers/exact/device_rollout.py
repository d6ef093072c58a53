"""The whole rollout's kappa on a torch device: R_l = M_l R_{l-1} and kappa(R_l) in float64 where
the attention was extracted (`rollout_device: extraction`), so the CPU test task skips them.

The CPU path (`workers.exact.equality.rollout`) returns the oracle's kappa of its own float64
products; this one sums in the device's order (its matmul and torch.cdist), so the two differ by
float64 rounding only, at most `kappa_bound(l, n)` at layer l of an n-token stack (the
derivation: docs/readings.md, "The rollout on the extraction device"). Verdicts and each layer's
kappa never come from here.
"""

from __future__ import annotations

import numpy as np

UNIT_ROUNDOFF = 2.0**-53


def gamma(n: int) -> float:
    """gamma_n = n u / (1 - n u): the relative error bound of a float64 sum of n terms, or of a
    dot product of length n, in any order (fused multiply-adds included)."""
    nu = n * UNIT_ROUNDOFF
    return nu / (1.0 - nu)


def kappa_bound(layer: int, n: int) -> float:
    """How far this module's kappa(R_layer) (1-based layer) of an n-token stack may be from the
    CPU path's: 2.02 * layer * gamma_n. Each path's products are within (layer - 1) gamma_n of
    the exact ones in the max-row-l1 norm, each kappa evaluation within gamma_n of its matrix's
    exact kappa, and kappa moves by at most the max-row-l1 change; 2% covers the row sums' own
    rounding (below 1 + 1e-9 for n <= 4096 and 100 layers)."""
    return 2.02 * layer * gamma(n)


def rollout_kappa(stack: np.ndarray, device: str, layers_out: str = "every") -> np.ndarray:
    """kappa(R_l) for l = 1..L (`every`) or l = L alone (`last`), R_1 = M_1, R_l = M_l R_{l-1},
    M_l = 0.5 * (eye + A_l) of a validated float64 (L, n, n) stack (`restrict_layers`' output),
    computed in float64 on torch device `device`; kappa(R) = max over pairs of half the l1
    distance of two rows (torch.cdist, p = 1), 0 when n = 1. (L,) or (1,) float64."""
    import torch

    x = torch.from_numpy(np.ascontiguousarray(stack, dtype=np.float64)).to(device)
    n = x.shape[-1]
    factors = x.clone()
    factors.diagonal(dim1=-2, dim2=-1).add_(1.0)  # eye + A: as the CPU path, element by element
    factors.mul_(0.5)  # (layer, row, column)
    products = torch.empty_like(factors)
    products[0] = factors[0]
    for layer in range(1, factors.shape[0]):
        torch.matmul(factors[layer], products[layer - 1], out=products[layer])
    wanted = products if layers_out == "every" else products[-1:]
    if n == 1:
        return np.zeros(wanted.shape[0])
    distances = torch.cdist(wanted, wanted, p=1)  # (layer, row i, row j)
    return (0.5 * distances.amax(dim=(-2, -1))).cpu().numpy().astype(np.float64)

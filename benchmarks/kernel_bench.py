"""Time the pairwise total-variation kernel against torch.cdist(p=1) and scipy's cdist.

    python benchmarks/kernel_bench.py [--sizes 197,257,577,1025] [--memory-size 1370]

Work is counted as n^3 pair-elements per matrix (ordered row pairs x columns: what cdist computes;
our kernel computes each unordered pair once, so it does half of that). Each timing is the best of
repeated runs within --seconds; ratios are to torch.cdist in the same run, so compare them, not
absolute rates, on a loaded machine. Two inputs: uniform random stochastic rows and attention-like
rows (softmax of random logits with a heavy sink column). On a machine where torch sees a GPU,
torch.cdist and the full check also run there (check(device="cuda")).
"""

from __future__ import annotations

import argparse
import resource
import time
from collections.abc import Callable

import numba
import numpy as np
import torch
from scipy.spatial.distance import cdist

from workers import kernel
from workers.baseline import draw_uniform_stochastic
from workers.equality import check


def attention_like(rng: np.random.Generator, n: int) -> np.ndarray:
    """Softmax of N(0, 4) logits with +4 on column 0 (an attention sink); (n, n) float64."""
    logits = 2.0 * rng.normal(size=(n, n))
    logits[:, 0] += 4.0
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def best_time(fn: Callable[[], object], seconds: float) -> float:
    """Best wall time of fn() over repeats within `seconds` (after one warm-up call)."""
    fn()
    best, start = float("inf"), time.perf_counter()
    while True:
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
        if time.perf_counter() - start > seconds:
            return best


def contenders(a: np.ndarray, cuda: bool) -> dict[str, Callable[[], object]]:
    """Name -> zero-argument callable computing all pairwise L1 distances / the full test."""
    n = a.shape[0]
    tiles = kernel.tile_order(n)
    x, screened = kernel.screen_buffers(n)  # reused, as check reuses them across matrices

    def screen() -> None:
        kernel.fill_float32(a, x)
        kernel.screen_parallel(x, tiles, screened)

    x32 = torch.from_numpy(a.astype(np.float32))
    batch = a[None]
    runs = {
        "check (exact f64)": lambda: check(batch),
        "screen kernel f32": screen,
        "torch.cdist f32": lambda: torch.cdist(x32, x32, p=1),
        "scipy cdist f64": lambda: cdist(a, a, "cityblock"),
    }
    if cuda:
        xg = x32.cuda()

        def cdist_cuda() -> None:
            torch.cdist(xg, xg, p=1)
            torch.cuda.synchronize()

        runs["torch.cdist cuda"] = cdist_cuda
        runs["check cuda"] = lambda: check(batch, device="cuda")
    return runs


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far, MiB (Linux ru_maxrss is in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="197,257,577,1025")
    parser.add_argument("--memory-size", type=int, default=1370)
    parser.add_argument("--seconds", type=float, default=1.0, help="time budget per timing")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    print(
        f"numba threads {numba.get_num_threads()}, torch threads {torch.get_num_threads()}, "
        f"device {'cuda: ' + torch.cuda.get_device_name() if cuda else 'cpu only'}; "
        "rates in G pair-elements/s (n^3 per matrix); x = speed relative to torch.cdist f32 (cpu)"
    )
    rng = np.random.default_rng(0)
    for n in [int(s) for s in args.sizes.split(",")]:
        for label, a in (
            ("uniform", draw_uniform_stochastic(rng, 1, n)[0]),
            ("attention", attention_like(rng, n)),
        ):
            times = {name: best_time(fn, args.seconds) for name, fn in contenders(a, cuda).items()}
            ref = times["torch.cdist f32"]
            cells = "  ".join(
                f"{name} {n**3 / t / 1e9:6.2f} ({ref / t:5.1f}x)" for name, t in times.items()
            )
            print(f"n={n:5d} {label:9s}  {cells}", flush=True)
    n = args.memory_size
    a = attention_like(rng, n)
    before = peak_rss_mib()
    start = time.perf_counter()
    result = check(a[None])
    print(
        f"n={n} attention: full check {time.perf_counter() - start:.2f} s (incl. any compile), "
        f"peak RSS {before:.0f} -> {peak_rss_mib():.0f} MiB (input {a.nbytes / 2**20:.0f} MiB "
        f"float64), kappa={result.kappa[0]:.6f} margin={result.margin[0]:.3e}"
    )


if __name__ == "__main__":
    main()

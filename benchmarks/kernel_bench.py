"""Time the pairwise total-variation kernel against torch.cdist(p=1) and scipy's cdist.

    python benchmarks/kernel_bench.py [--sizes 197,257,577,1025,1370] [--stack 400]
        [--stack-sizes 257] [--memory-size 1370] [--seconds 1]

Work is counted as n^3 pair-elements per matrix (ordered row pairs x columns: what cdist computes;
our kernel computes each unordered pair once, so it does half of that). The contenders run in
turn, round after round, for --seconds; each keeps its best time, so all see the same load; ratios
are to torch.cdist in the same rounds: compare them, not absolute rates, on a loaded machine.
Two inputs: uniform random stochastic rows and attention-like rows (softmax of random logits with
a heavy sink column). `check x12` is one call on 12 distinct matrices (an input's layers) and
`check x400` one call on --stack distinct matrices (at --stack-sizes only); both are reported per
matrix. On a machine where torch sees a GPU,
torch.cdist and the full check also run there (check(device="cuda")).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numba
import numpy as np
import torch
from scipy.spatial.distance import cdist

from workers.exact.equality import check
from workers.nulls.baseline import draw_uniform_stochastic


def attention_like(rng: np.random.Generator, n: int, b: int | None = None) -> np.ndarray:
    """Softmax of N(0, 4) logits with +4 on column 0 (an attention sink); (n, n) float64, or
    (b, n, n) with b distinct matrices."""
    logits = 2.0 * rng.normal(size=(n, n) if b is None else (b, n, n))
    logits[..., 0] += 4.0
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def uniform(rng: np.random.Generator, n: int, b: int | None = None) -> np.ndarray:
    """Rows uniform on the simplex; (n, n) float64, or (b, n, n) with b distinct matrices."""
    if b is None:
        return draw_uniform_stochastic(rng, 1, n)[0]
    return np.stack([draw_uniform_stochastic(rng, 1, n)[0] for _ in range(b)])


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def best_times(
    fns: dict[str, Callable[[], object]], seconds: float, clock: str = "wall"
) -> dict[str, float]:
    """Best time of each fn(), calling them in turn (after one warm-up each) for `seconds` of
    wall time. clock "cpu": CPU seconds of the whole process (all threads; what a loaded
    machine does not inflate by descheduling) instead of wall seconds."""
    for fn in fns.values():
        fn()
    now = CLOCKS[clock]
    best = dict.fromkeys(fns, float("inf"))
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for name, fn in fns.items():
            t = now()
            fn()
            best[name] = min(best[name], now() - t)
    return best


LAYERS = 12  # matrices per `check` call in a sweep: one input's layers (ViT-B: 12)


def per_matrix(name: str) -> int:
    """How many matrices one call of contender `name` handles ('check x400' -> 400)."""
    head = name.split()[1] if name.startswith("check x") else "x1"
    return int(head[1:])


def contenders(
    a: np.ndarray, layers: np.ndarray, stack: np.ndarray | None, cuda: bool
) -> dict[str, Callable[[], object]]:
    """Name -> zero-argument callable computing all pairwise L1 distances / the full test:
    `a` (n, n), `layers` (LAYERS, n, n), `stack` (b, n, n) or None; all float64. `check
    f32 in` is `check` on the float32 matrix torch.cdist gets (what a sweep stores and tests)."""
    x32 = torch.from_numpy(a.astype(np.float32))
    batch = a[None]
    batch32 = x32.numpy()[None]
    runs = {
        "check (exact f64)": lambda: check(batch),
        "check f32 in": lambda: check(batch32),
        f"check x{LAYERS} layers": lambda: check(layers),
    }
    if stack is not None:
        runs[f"check x{stack.shape[0]} stack"] = lambda: check(stack)
    runs |= {
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


def memory_mib(key: str) -> float:
    """VmRSS (resident now) or VmHWM (peak since the last reset) of this process, MiB (Linux)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"{key} not in /proc/self/status")


def reset_peak_rss() -> None:
    """Reset VmHWM to the current RSS (Linux >= 4.0: write 5 to /proc/self/clear_refs)."""
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="197,257,577,1025")
    parser.add_argument("--stack", type=int, default=400, help="matrices in the big stack")
    parser.add_argument("--stack-sizes", default="257", help="sizes n timed on the big stack")
    parser.add_argument("--memory-size", type=int, default=1370)
    parser.add_argument("--seconds", type=float, default=1.0, help="time budget per timing")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall seconds, or CPU seconds of the process (for loaded machines)")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    print(
        f"numba threads {numba.get_num_threads()}, torch threads {torch.get_num_threads()}, "
        f"device {'cuda: ' + torch.cuda.get_device_name() if cuda else 'cpu only'}, "
        f"{args.clock} clock; "
        "rates in G pair-elements/s (n^3 per matrix); x = speed relative to torch.cdist f32 (cpu)"
    )
    rng = np.random.default_rng(0)
    stack_sizes = {int(s) for s in args.stack_sizes.split(",") if s}
    for n in [int(s) for s in args.sizes.split(",")]:
        for label, draw in (("uniform", uniform), ("attention", attention_like)):
            a, layers = draw(rng, n), draw(rng, n, LAYERS)
            stack = draw(rng, n, args.stack) if n in stack_sizes else None
            runs = contenders(a, layers, stack, cuda)
            times = {
                name: t / per_matrix(name)
                for name, t in best_times(runs, args.seconds, args.clock).items()
            }
            ref = times["torch.cdist f32"]
            cells = "  ".join(
                f"{name} {n**3 / t / 1e9:6.2f} ({ref / t:5.1f}x)" for name, t in times.items()
            )
            print(f"n={n:5d} {label:9s}  {cells}", flush=True)
    n = args.memory_size
    a = attention_like(rng, n)
    check(attention_like(rng, 8)[None])  # compile outside the measurement
    reset_peak_rss()
    before = memory_mib("VmRSS")
    start = time.perf_counter()
    result = check(a[None])
    print(
        f"n={n} attention: full check {time.perf_counter() - start:.2f} s, peak RSS "
        f"+{memory_mib('VmHWM') - before:.0f} MiB over the {before:.0f} MiB before it (input "
        f"{a.nbytes / 2**20:.0f} MiB float64); kappa={result.kappa[0]:.6f} "
        f"margin={result.margin[0]:.3e}"
    )


if __name__ == "__main__":
    main()

"""Peak store bytes and wall time of one sweep under `attention: keep` and `attention: drop`.

A tiny DINOv2-shaped model (2 layers) at `--image-size` pixels (224: T = 257, 0.5 MiB of
attention per input) on `--inputs` random PNG images, `shard_size` 16, token set `all`, rollout
off; each policy runs `python -m sweep run CONFIG --in-process` (or `--cluster FILE`) into a
fresh store while a thread sums the store's object sizes (`storage.location` listing) every
`--every` seconds. Prints a markdown table.

    PYTHONPATH=. python benchmarks/bounded_store.py --inputs 400
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
from PIL import Image

from storage.location import forget_memory_stores, locate

REPO = Path(__file__).parents[1]


def make_images(folder: Path, n: int, size: int) -> None:
    """`n` random RGB PNG images of `size` pixels (seeded)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(n):
        pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"img{i:05d}.png")


def write_config(folder: Path, images: Path, attention: str, image_size: int) -> Path:
    path = folder / f"{attention}.yaml"
    path.write_text(f"""\
store: {attention}.zarr
shard_size: 16
attention: {attention}
token_sets: [all]
rollout: "off"
matched_nulls: null
datasets:
  images: {{path: {images}, kind: image}}
models:
  dino: {{source: tiny-dinov2, dataset: images, batch_size: 16,
          options: {{image_size: {image_size}}}}}
""")
    return path


class Sampler:
    """Sums the sizes of a store's objects every `every` seconds on a thread: the peak of all
    objects and of the attention chunks alone."""

    def __init__(self, store: str, every: float) -> None:
        self.store, self.every = store, every
        self.peak = self.peak_attention = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.every)

    def sample(self) -> None:
        try:
            listing = locate(self.store).listing()
        except Exception:  # noqa: BLE001 - the store may not exist yet
            return
        self.samples += 1
        self.peak = max(self.peak, sum(info.size for info in listing.values()))
        self.peak_attention = max(self.peak_attention, sum(
            info.size for key, info in listing.items() if "/attention/c/" in key))

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def run_policy(folder: Path, images: Path, attention: str, args: argparse.Namespace
               ) -> dict[str, float]:
    config = write_config(folder, images, attention, args.image_size)
    command = [sys.executable, "-m", "sweep", "run", str(config), "--no-progress"]
    command += ["--cluster", str(args.cluster)] if args.cluster else ["--in-process"]
    store = str(folder / f"{attention}.zarr")
    start = time.perf_counter()
    with Sampler(store, args.every) as sampler:
        subprocess.run(command, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    final = sum(info.size for info in locate(store).listing().values())
    forget_memory_stores()
    return {"wall": wall, "peak": sampler.peak, "peak_attention": sampler.peak_attention,
            "final": final, "samples": sampler.samples}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inputs", type=int, default=400)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--every", type=float, default=1.0, help="seconds between samples")
    parser.add_argument("--cluster", type=Path, help="cluster.yaml (default: --in-process)")
    parser.add_argument("--policies", default="keep,drop")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        make_images(folder / "images", args.inputs, args.image_size)
        rows = {p: run_policy(folder, folder / "images", p, args)
                for p in args.policies.split(",")}
    mib = 1 << 20
    print(f"{args.inputs} inputs, tiny-dinov2 at {args.image_size} px, shard_size 16, "
          f"{'cluster ' + str(args.cluster) if args.cluster else 'in process'}")
    print("| policy | wall s | peak store MiB | peak attention MiB | final store MiB | samples |")
    print("|---|---:|---:|---:|---:|---:|")
    for policy, r in rows.items():
        print(f"| {policy} | {r['wall']:.1f} | {r['peak'] / mib:.1f} | "
              f"{r['peak_attention'] / mib:.1f} | {r['final'] / mib:.1f} | {r['samples']} |")


if __name__ == "__main__":
    main()

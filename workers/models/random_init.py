"""Seeded random initialisation for random-init controls, without touching the global RNG.

A control (`ModelSpec.random_init`) draws its weights from a torch seed derived from the model's
own `seed` (`control_seed`), a stream distinct from the one tiny presets (`pretrained=False`) use
with the same seed, so a tiny model's control is a different draw. Library initialisers read
torch's global generator, so `seeded` forks it (CPU state) for the duration of the build and
restores it afterwards: nothing leaks into the caller's RNG state.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

RANDOM_INIT_STREAM = 0x52494E49  # spawn key of the control stream ("RINI")


def control_seed(seed: int) -> int:
    """The torch seed a random-init control of a model with `seed` initialises from."""
    sequence = np.random.SeedSequence(int(seed), spawn_key=(RANDOM_INIT_STREAM,))
    return int(sequence.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


@contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Within the block torch's CPU generator starts from `seed`; its prior state comes back."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield

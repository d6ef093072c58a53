"""Devices checked before a run: `device: cuda:7` on a machine without that GPU is refused."""

from __future__ import annotations

import re

from storage.errors import EnvironmentFault
from sweep.config import SweepConfig

CUDA = re.compile(r"^cuda(?::(\d+))?$")


def cuda_device_count() -> int:
    """CUDA devices torch sees here (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_devices(config: SweepConfig) -> None:
    """EnvironmentFault naming the first model whose `device` this machine does not have.

    `auto` and `cpu` always pass; `cuda` needs one CUDA device, `cuda:N` needs N + 1. A sweep
    on a cluster whose workers have GPUs the driver lacks sets `device: auto`.
    """
    count: int | None = None
    for name in config.models:
        device = config.model_setting(name, "device")
        match = CUDA.match(device)
        if match is None:
            continue
        index = int(match.group(1) or 0)
        count = cuda_device_count() if count is None else count
        if index >= count:
            raise EnvironmentFault(
                f"models.{name}.device: {device} is not on this machine ({count} CUDA "
                f"device{'s' if count != 1 else ''}); use device: auto, cpu or cuda:0 to "
                f"cuda:{count - 1}"
                if count else
                f"models.{name}.device: {device} is not on this machine (no CUDA device); "
                f"use device: auto or cpu"
            )

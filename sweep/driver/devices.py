"""Devices checked before a run: `device: cuda:7` on a machine without that GPU is refused."""

from __future__ import annotations

import re

from storage.errors import EnvironmentFault
from sweep.config.schema import SweepConfig

CUDA = re.compile(r"^cuda(?::(\d+))?\Z")


def cuda_device_count() -> int:
    """CUDA devices torch sees here (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_device(device: str, where: str) -> None:
    """EnvironmentFault if this machine lacks `device` (`where`: the key that set it): `auto`
    and `cpu` always pass; `cuda` needs one CUDA device, `cuda:N` needs N + 1."""
    match = CUDA.match(device)
    if match is None:
        return
    index = int(match.group(1) or 0)
    count = cuda_device_count()
    if index >= count:
        raise EnvironmentFault(
            f"{where}: {device} is not on this machine ({count} CUDA "
            f"device{'s' if count != 1 else ''}); use device: auto, cpu or cuda:0 to "
            f"cuda:{count - 1}"
            if count else
            f"{where}: {device} is not on this machine (no CUDA device); use device: auto or "
            f"cpu"
        )


def check_devices(config: SweepConfig) -> None:
    """EnvironmentFault naming the first model whose `device` this machine does not have
    (`check_device`). A sweep on a cluster whose workers have GPUs the driver lacks sets
    `device: auto`."""
    for name in config.models:
        check_device(config.model_setting(name, "device"), f"models.{name}.device")

"""Torch settings under which training and extraction give the same bits on any machine.

Float32 reductions split over torch's intra-op threads sum in an order that depends on the thread
count, so a model trained (or a forward pass run) with 1 and with 2 threads differs in the last
bits, and a verdict at the edge of the data's precision can flip. Inside `fixed_torch()` torch
runs on `threads` intra-op threads (training also with deterministic algorithms); the process's
own settings are restored when the last concurrent user leaves (the settings are process-wide,
so every thread of a worker that enters asks for the same count).

The thread count is not all: torch dispatches its kernels by CPU (ATen's vector width, MKL's code
path for matrix products, oneDNN's for convolutions and GELU), so the same training on two CPUs
can differ in the last bits from its first epoch (docs/training.md, "Reproducible where").
`dispatch()` names what this process dispatches to, for the training record.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

TORCH_THREADS = 1  # the default for training and extraction (recorded in the store and records)

MKL_BRANCHES = {1: "OFF", 2: "AUTO", 3: "COMPATIBLE", 4: "SSE2", 5: "SSE3", 6: "SSSE3",
                7: "SSE4_1", 8: "SSE4_2", 9: "AVX", 10: "AVX2", 11: "AVX512_MIC", 12: "AVX512",
                13: "AVX512_MIC_E1", 14: "AVX512_E1"}
"""MKL's conditional-numerical-reproducibility branches (mkl_service.h's MKL_CBWR_*)."""

_LOCK = threading.Lock()
_users = 0
_held = 0  # the count the current users asked for
_saved: tuple[int, bool, bool] | None = None


@contextmanager
def fixed_torch(threads: int = TORCH_THREADS, *, deterministic: bool = False) -> Iterator[None]:
    """Within the block: `threads` intra-op threads, and with `deterministic` (training)
    deterministic algorithms too (a warning where an op has none). ValueError if another thread of
    this process holds a different count at the same time.

    torch keeps the count per OS thread (OpenMP) as well as process-wide, so every thread that
    enters sets it for itself; the process's settings come back when the last user leaves."""
    global _users, _held, _saved
    with _LOCK:
        if _users == 0:
            _saved = (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled(),
                      torch.is_deterministic_algorithms_warn_only_enabled())
            _held = threads
        elif threads != _held:
            raise ValueError(f"torch threads: {threads} asked while this process runs with "
                             f"{_held}")
        if torch.get_num_threads() != threads:  # setting it also clears oneDNN's caches
            torch.set_num_threads(threads)  # this thread's count (and the process's default)
        if deterministic and not torch.are_deterministic_algorithms_enabled():
            torch.use_deterministic_algorithms(True, warn_only=True)
        _users += 1
    try:
        yield
    finally:
        with _LOCK:
            _users -= 1
            if _users == 0 and _saved is not None:
                count, enabled, warn_only = _saved
                if torch.get_num_threads() != count:
                    torch.set_num_threads(count)
                torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


def dispatch() -> dict[str, str | None]:
    """What this process's torch kernels dispatch to: the CPU's model name, ATen's capability
    (`ATEN_CPU_CAPABILITY`: DEFAULT, AVX2, AVX512), MKL's code path (the branch its CNR mode
    would pick, `MKL_ENABLE_INSTRUCTIONS` caps it) and CNR branch (`MKL_CBWR`; OFF unless set),
    and oneDNN's ISA cap (`ONEDNN_MAX_CPU_ISA`, None: the CPU's best; "off": oneDNN disabled).
    None where unknown."""
    mkl = _mkl()
    onednn = os.environ.get("ONEDNN_MAX_CPU_ISA") if torch.backends.mkldnn.enabled else "off"
    return {
        "cpu": _cpu_model(),
        "aten": torch.backends.cpu.get_cpu_capability(),
        "mkl_isa": None if mkl is None else MKL_BRANCHES.get(mkl.mkl_serv_cbwr_get_auto_branch()),
        "mkl_cbwr": None if mkl is None else MKL_BRANCHES.get(mkl.mkl_serv_cbwr_get(1)),
        "onednn_max_isa": onednn,
    }


def _mkl() -> ctypes.CDLL | None:
    """torch's own MKL (linked into libtorch_cpu), None where torch has none."""
    library = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    try:
        mkl = ctypes.CDLL(str(library))
        mkl.mkl_serv_cbwr_get, mkl.mkl_serv_cbwr_get_auto_branch  # noqa: B018 - both exist
    except (OSError, AttributeError):
        return None
    return mkl


def _cpu_model() -> str | None:
    """The first `model name` of /proc/cpuinfo, None without one."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    names = [line.split(":", 1)[1].strip() for line in text.splitlines()
             if line.startswith("model name")]
    return names[0] if names else None

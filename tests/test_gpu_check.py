"""`benchmarks/gpu_check.sh --dry-run`: the GPU check's own steps on the CPU, as CI runs them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.sh"


def test_the_gpu_check_passes_its_cpu_dry_run(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(SCRIPT), "--dry-run"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    for step in ("extract tiny-vit", "check(device='cpu') == CPU kernel",
                 "rollout on cpu within kappa_bound", "sweep with a GPU pool",
                 "pipeline thin-vit-b on cpu",
                 "all checks passed"):
        assert step in out, out[-3000:]

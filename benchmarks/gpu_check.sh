#!/usr/bin/env bash
# The GPU check (issue 10): on a CUDA machine, in under 5 minutes, extraction on CUDA (tiny presets
# and a random-init ViT-B/16), check(device="cuda") against the CPU kernel (identical verdicts and
# kappa), the rollout on CUDA (rollout_device: extraction) against the CPU path (within its bound,
# both timed), a short sweep with a GPU pool, and throughput. Steps: benchmarks/gpu_check.py.
#
#   bash benchmarks/gpu_check.sh             # on a CUDA machine
#   bash benchmarks/gpu_check.sh --dry-run   # the same steps on the CPU, tiny sizes (CI)
#
# Runs from any folder; PYTHON overrides the interpreter (default: python3 on PATH).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="${root}${PYTHONPATH:+:${PYTHONPATH}}"
export HF_HUB_OFFLINE=1
exec "${PYTHON:-python3}" "${root}/benchmarks/gpu_check.py" "$@"

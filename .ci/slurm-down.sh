#!/usr/bin/env bash
# Stop what .ci/slurm-up.sh started: cancel every job, stop slurmd, slurmctld and munged.
set -uo pipefail

command -v scancel >/dev/null && scancel --user="$(id -un)" 2>/dev/null
source "$(dirname "$0")/slurm-lib.sh"
stop /run/slurmd.pid
stop /run/slurmctld.pid
stop /run/munge/munged.pid
echo "slurm-down: stopped"

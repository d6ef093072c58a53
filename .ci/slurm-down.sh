#!/usr/bin/env bash
# Stop what .ci/slurm-up.sh started: cancel every job, stop slurmd, slurmctld and munged.
set -uo pipefail

command -v scancel >/dev/null && scancel --user="$(id -un)" 2>/dev/null
stop() {
    local pid
    pid=$(cat "$1" 2>/dev/null) || return 0
    if kill -0 "$pid" 2>/dev/null; then
        kill "$pid"
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
}
stop /run/slurmd.pid
stop /run/slurmctld.pid
stop /run/munge/munged.pid
echo "slurm-down: stopped"

#!/usr/bin/env bash
# Bring up a single-node SLURM on this machine, as root, from nothing; safe to rerun.
# Installs munge + slurm (Debian packages), starts munged as user munge, writes slurm.conf from
# `slurmd -C` (this machine's CPUs and memory), starts slurmctld and slurmd, and waits until
# `sinfo` shows the node up. Prints one status line. Tear down with .ci/slurm-down.sh.
set -euo pipefail

if [[ $(id -u) -ne 0 ]]; then
    echo "slurm-up: must run as root (it installs packages and starts daemons)" >&2
    exit 1
fi

log() { echo "slurm-up: $*" >&2; }

# 1. Packages (skipped when already installed).
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
    || ! command -v sinfo >/dev/null || ! command -v munged >/dev/null; then
    log "installing slurmctld slurmd slurm-client munge"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq slurmctld slurmd slurm-client munge >/dev/null
fi

# 2. munge: a key owned by munge (kept if present), munged running as munge.
install -d -o munge -g munge -m 0700 /etc/munge /var/log/munge
install -d -o munge -g munge -m 0711 /var/lib/munge
install -d -o munge -g munge -m 0755 /run/munge
if [[ ! -s /etc/munge/munge.key ]]; then
    dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
fi
chown munge:munge /etc/munge/munge.key
chmod 400 /etc/munge/munge.key
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    log "starting munged as user munge"
    runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 50); do
        munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break
        sleep 0.1
    done
    munge -n | unmunge >/dev/null
fi

# 3. slurm.conf for this node.
host=$(hostname -s)
node_line=$(slurmd -C | head -n 1)               # NodeName=<host> CPUs=.. RealMemory=..
cpus=$(sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' <<<"$node_line")
memory=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$node_line")
install -d -m 0755 /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
conf=$(cat <<EOF
# Written by .ci/slurm-up.sh: a single-node cluster for tests.
ClusterName=dobrushin
SlurmctldHost=${host}
SlurmUser=root
AuthType=auth/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
ReturnToService=2
KillWait=5
MinJobAge=60
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
${node_line} State=UNKNOWN
PartitionName=debug Nodes=${host} Default=YES MaxTime=INFINITE State=UP
EOF
)
changed=0
if [[ ! -f /etc/slurm/slurm.conf ]] || [[ "$(cat /etc/slurm/slurm.conf)" != "$conf" ]]; then
    printf '%s\n' "$conf" >/etc/slurm/slurm.conf
    changed=1
fi

# 4. Daemons: (re)start when absent or when the configuration changed.
source "$(dirname "$0")/slurm-lib.sh"
if [[ $changed -eq 1 ]]; then
    stop /run/slurmd.pid
    stop /run/slurmctld.pid
fi
if ! running /run/slurmctld.pid; then
    log "starting slurmctld"
    slurmctld
fi
if ! running /run/slurmd.pid; then
    log "starting slurmd"
    slurmd
fi

# 5. Wait for the node to be schedulable (idle, or busy with jobs).
state=""
for _ in $(seq 120); do
    state=$(sinfo -h -N -n "$host" -o %t 2>/dev/null | head -n 1 || true)
    case "$state" in
        idle | mix | alloc | comp) break ;;
        down* | drain* | drng*) scontrol update NodeName="$host" State=RESUME 2>/dev/null || true ;;
    esac
    sleep 0.5
done
case "$state" in
    idle | mix | alloc | comp)
        echo "slurm-up: node ${host} ${state} (CPUs=${cpus} RealMemory=${memory}M, partition debug)"
        ;;
    *)
        echo "slurm-up: node ${host} not ready (state '${state}'); see /var/log/slurm/" >&2
        exit 1
        ;;
esac

# Shared by slurm-up.sh and slurm-down.sh (sourced, not run): daemons tracked by their pid files.

# running PIDFILE: true when the process named in PIDFILE is alive.
running() { local pid; pid=$(cat "$1" 2>/dev/null) && kill -0 "$pid" 2>/dev/null; }

# stop PIDFILE: terminate that process and wait up to 5 s for it to exit.
stop() {
    local pid
    pid=$(cat "$1" 2>/dev/null) || return 0
    if kill -0 "$pid" 2>/dev/null; then
        kill "$pid"
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
}

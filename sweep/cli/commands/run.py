"""`sweep run [CONFIG] [--cluster FILE] [--verify]`: run a sweep into its store, resuming what is
done (`--verify`: re-hash every done chunk first, `sweep.driver.freshness`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from sweep.clusters.config import load_cluster_config
from sweep.config.load import default_config_path, load_config
from sweep.terminal.interrupts import Interrupted


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "run",
        description="Run a sweep. With no CONFIG, the bundled default sweep runs offline into "
        "runs/default.zarr (relative to the current folder). Exit code 1 if tasks failed.",
    )
    parser.add_argument("config", nargs="?", type=Path, help="sweep YAML (default: bundled)")
    parser.add_argument("--cluster", type=Path, default=None,
                        help="cluster.yaml (default: a local cluster sized to this machine)")
    parser.add_argument("--in-process", action="store_true",
                        help="run every task in this process, without Dask (debugging): the "
                        "first task that keeps failing stops the run and its exception is "
                        "re-raised with its traceback (after its failed marker is written)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--verify", action="store_true",
                        help="re-hash every done task's chunks before skipping it (a full read "
                        "of the store). Without it, a chunk is re-hashed only if its size or "
                        "mtime differs from its marker's: a deleted, resized or rewritten chunk "
                        "is found either way (its shard recomputed), but a same-size edit "
                        "whose mtime was kept or set back needs --verify")
    parser.add_argument("--break-lock", action="store_true",
                        help="object stores: take over the lease of a run that stopped renewing "
                        "it (killed, or lost its network) before the lease expires by itself; "
                        "refused while the lease is fresh unless --force")
    parser.add_argument("--force", action="store_true",
                        help="with --break-lock: break even a fresh lease (the other run, if it "
                        "is alive, stops at its next renewal)")
    parser.add_argument("--reextract-attention", action="store_true",
                        help="extract again the attention that an earlier `attention:` policy "
                        "dropped and the config's policy keeps (their shards are retested); "
                        "without it such a policy change is refused")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.config is None:
        config = load_config(default_config_path(), base=Path.cwd())
    else:
        config = load_config(args.config)
    # What loads torch and dask waits until the config is read: its errors come first.
    from sweep.clusters.client import open_client
    from sweep.driver.graph import DaskExecutor
    from sweep.driver.preflight import check_cluster
    from sweep.driver.runner import (
        InProcessExecutor,
        execute_plan,
        interrupted_run,
        locked,
        materialise,
        naming_the_store,
    )

    progress = not args.no_progress
    cluster = None if args.in_process else load_cluster_config(args.cluster)
    check_cluster(config, cluster)  # `sweep plan` refuses what `sweep run` refuses: same calls
    reextract = args.reextract_attention
    with locked(config, break_lock=args.break_lock, force=args.force, reextract=reextract):
        try:
            plan = materialise(config, progress=progress)
        except KeyboardInterrupt:
            raise Interrupted(f"while planning, before any task ran; store {config.store} "
                              f"unlocked; rerun to resume") from None
        if cluster is None:
            summary = execute_plan(plan, InProcessExecutor(reraise=True), progress=progress,
                                   verify=args.verify, reextract=reextract)
        else:
            try:
                with open_client(cluster, restore_logs=not args.own_process) as client:
                    executor = DaskExecutor(client, shared=cluster.kind == "address")
                    summary = execute_plan(plan, executor, progress=progress,
                                           verify=args.verify, reextract=reextract)
            except Interrupted as stopped:  # counted again now that the workers have stopped
                raise interrupted_run(plan, getattr(stopped, "skipped", 0)) from None
    for line in summary.lines():
        print(line)
    print(f"store: {config.store}")
    fault = summary.fault()
    if fault is not None:  # the user's input, the machine, a damaged store: one line, its code
        raise naming_the_store(fault, config.store)
    return summary.exit_code

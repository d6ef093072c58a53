"""`sweep plan CONFIG [--cluster FILE]`: the resolved config, inputs/shards/tasks per model,
estimated store size and kernel work, what an existing store already holds, and what the cluster
file would start. Computes nothing: no model is built, no weight loaded, no image decoded, nothing
trained (sizes come from the specs: `workers.models.token_layout`); what it is doing goes to
stderr. It refuses what `sweep run` refuses, by the same calls and before printing anything
(the cluster against the store, the config against the store, the datasets, the sizes): one
line on stderr and the exit code of the cause."""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from storage import markers
from storage.errors import EnvironmentFault, InputError
from storage.layout import NULLS_STAGE
from storage.location import locate
from storage.store import redacted
from sweep.clusters.client import describe_cluster, load_cluster_config
from sweep.config.load import default_config_path, load_config
from sweep.config.schema import SweepConfig
from sweep.driver.balance import balance_lines, cluster_pools
from sweep.driver.plan import SweepPlan
from sweep.driver.preflight import check_cluster
from sweep.driver.runner import check_config, sized_plan


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan",
        description="Print what `sweep run CONFIG` would do, without computing anything. "
        "With no CONFIG, the bundled default sweep.",
    )
    parser.add_argument("config", nargs="?", type=Path, help="sweep YAML (default: bundled)")
    parser.add_argument("--cluster", type=Path, default=None,
                        help="also print what this cluster.yaml would start (SLURM scripts, ...)")
    parser.set_defaults(func=plan)


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    raise AssertionError("unreachable")


def _store_markers(config: SweepConfig) -> tuple[markers.MarkerIndex | None, str]:
    """The store's markers (None for a new store) and a word on its state: `new`, `exists:
    resumes`, or why it cannot be reached."""
    location = locate(config.store_ref)
    try:
        if location.read("zarr.json") is None:
            return None, "new"
        return markers.MarkerIndex(location), "exists: resumes"
    except (InputError, EnvironmentFault) as error:
        return None, f"cannot be reached: {error}"


def attention_lines(plan: SweepPlan, in_flight: int | None = None) -> list[str]:
    """Per model, the peak attention bytes its `attention:` policy implies (`storage.attention`)
    next to what `keep` stores: in process one shard is in flight; on Dask, up to `in_flight`
    (the cluster's GPU + CPU task slots, when known)."""
    lines = ["attention (peak bytes the policy lets the store hold, next to keep's total):"]
    for model in plan.models:
        peak = f"peak {human_bytes(model.peak_attention_bytes(1))} in process"
        if model.kept is not None and in_flight:
            peak += f", {human_bytes(model.peak_attention_bytes(in_flight))} with {in_flight} " \
                    f"shards in flight on the cluster"
        elif model.kept is not None:
            peak += f", + {human_bytes(model.shard_size * model.input_bytes)} per further " \
                    f"shard in flight on Dask (up to its GPU + CPU task slots)"
        lines.append(f"  {model.name:<22} {str(model.attention):<22} {peak}; keep: "
                     f"{human_bytes(model.attention_bytes)}")
    return lines


def describe(plan: SweepPlan, in_flight: int | None = None) -> list[str]:
    """The plan as printable lines: per model, the baseline, totals and the attention policy's
    peak bytes (`attention_lines`)."""
    index, state = _store_markers(plan.config)
    lines = ["", f"store: {plan.config.store} ({state})"]
    header = (f"{'model':<24} {'dataset':<14} {'inputs':>7} {'shards':>6} {'layers':>6} "
              f"{'heads':>5} {'T_max':>6} {'tasks':>6} {'done':>5} {'attention':>11} "
              f"{'test work':>11}")
    lines += ["", header]
    total_bytes = total_work = total_tasks = 0
    for model in plan.models:
        tasks = [t for t in plan.tasks
                 if getattr(t, "model", None) == model.name and t.stage != NULLS_STAGE]
        done = sum(index is not None and index.done(t.scope, t.marker) for t in tasks)
        total_bytes += model.attention_bytes
        total_work += model.work
        total_tasks += len(tasks)
        lines.append(
            f"{model.name:<24} {model.dataset_name:<14} {model.n_inputs:>7} {model.n_shards:>6} "
            f"{model.n_layers:>6} {model.n_heads:>5} {model.t_max:>6} {len(tasks):>6} {done:>5} "
            f"{human_bytes(model.attention_bytes):>11} {model.work:>11.3g}"
        )
    if plan.baseline is not None:
        b = plan.baseline
        tasks = [t for t in plan.tasks if t.stage == "baseline"]
        done = sum(index is not None and index.done(t.scope, t.marker) for t in tasks)
        total_work += b.work
        total_tasks += len(tasks)
        lines.append(
            f"{'baseline':<24} {'sizes ' + str(len(b.sizes)):<14} {b.trials:>7} "
            f"{b.n_chunks:>6} {'':>6} {max(b.sizes):>6} {len(tasks):>6} {done:>5} "
            f"{'':>11} {b.work:>11.3g}"
        )
    if plan.matched_nulls is not None:
        m = plan.matched_nulls
        tasks = [t for t in plan.tasks if t.stage == NULLS_STAGE]
        done = sum(index is not None and index.done(t.scope, t.marker) for t in tasks)
        total_tasks += len(tasks)
        lines.append(
            f"{'matched nulls':<20} {'nulls ' + str(len(m.nulls)):<14} {m.trials:>7} "
            f"{m.n_chunks:>6} {'':>6} {'':>6} {len(tasks):>6} {done:>5}"
        )
    lines += [
        "",
        f"total: {total_tasks} tasks; attention {human_bytes(total_bytes)} uncompressed "
        f"(float32, padded to T_max); test work {total_work:.3g} pair-elements "
        f"(sum of L * T^3/2 per token set and stored head: an upper bound)",
        f"preparation (training) and extraction tasks take the GPU resource, test and baseline "
        f"tasks the CPU resource; "
        f"checkpoints cache: {plan.config.checkpoint_dir}",
        *attention_lines(plan, in_flight),
    ]
    return lines


def plan(args: argparse.Namespace) -> int:
    if args.config is None:
        config = load_config(default_config_path(), base=Path.cwd())
    else:
        config = load_config(args.config)
    cluster = None if args.cluster is None else load_cluster_config(args.cluster)  # before work
    # what `sweep run CONFIG [--cluster FILE]` refuses before it writes, in its order
    check_cluster(config, cluster if cluster is not None else load_cluster_config(None))
    check_config(config, read_images=False)  # a plan opens no image: damage is run's to find
    sweep_plan = sized_plan(config, progress=True)[0]
    print("resolved config:")
    print(yaml.safe_dump(redacted(config.resolved()), sort_keys=False).rstrip())
    pools = None if cluster is None else cluster_pools(cluster)
    in_flight = None if pools is None else max(2, pools.extract_slots + pools.cpu_cores)
    for line in describe(sweep_plan, in_flight):
        print(line)
    if cluster is not None:
        print()
        print(describe_cluster(cluster))
        print("\n".join(["", *balance_lines(sweep_plan, pools)]))
    return 0

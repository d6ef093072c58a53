"""`sweep plan CONFIG [--cluster FILE] [--verbose] [--format json]`: inputs/shards/tasks per
model, estimated store size and kernel work, what an existing store already holds and what cannot
run; with --cluster the predicted seconds (--verbose: also the resolved config and what the
cluster file would start; json: the same data). Computes nothing: no model is built, no weight
loaded, no image decoded, nothing trained (sizes come from the specs:
`workers.models.token_layout`); what it is doing goes to stderr. It refuses what `sweep run`
refuses, by the same calls and before printing anything (the cluster against the store, the
config against the store, the datasets, the sizes): one line on stderr and the exit code of the
cause."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from storage import markers
from storage.errors import EnvironmentFault, InputError
from storage.layout import NULLS_STAGE
from storage.location import locate
from storage.store import redacted
from sweep.cli.outputs import add_format_argument
from sweep.clusters.config import load_cluster_config
from sweep.config.load import default_config_path, load_config
from sweep.config.schema import SweepConfig
from sweep.driver.plan import SweepPlan

if TYPE_CHECKING:  # the imports that load torch or dask wait until the config is read
    from sweep.clusters.config import ClusterConfig
    from sweep.driver.balance import Pools


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan",
        description="Print what `sweep run CONFIG` would do, without computing anything: the "
        "table of models and what cannot run (with --cluster, the predicted seconds). With no "
        "CONFIG, the bundled default sweep.",
    )
    parser.add_argument("config", nargs="?", type=Path, help="sweep YAML (default: bundled)")
    parser.add_argument("--cluster", type=Path, default=None,
                        help="also print what this cluster.yaml would start and the predicted "
                        "seconds per stage")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also the resolved config, every model's attention peak, the "
                        "cluster's scripts or manifests and the cost constants' sources")
    add_format_argument(parser, ("text", "json"),
                        help="json: the same data as one JSON object on stdout")
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


def attention_lines(plan: SweepPlan, in_flight: int | None = None,
                    every: bool = True) -> list[str]:
    """Per model, the peak attention bytes its `attention:` policy implies (`storage.attention`)
    next to what `keep` stores: in process one shard is in flight; on Dask, up to `in_flight`
    (the cluster's GPU + CPU task slots, when known). Without `every`, the models that keep
    all their attention are one line."""
    shown = [m for m in plan.models if every or m.kept is not None]
    kept = len(plan.models) - len(shown)
    lines = ["attention (peak bytes the policy lets the store hold, next to keep's total):"]
    if not every and kept:
        everything = "every model" if not shown else f"{kept} other models"
        lines = [f"attention: {everything} keep{'s' if not shown else ''} all of it (peak = "
                 f"the total above){':' if shown else ''}"]
    width = max([22, *(len(m.name) for m in shown)])
    for model in shown:
        peak = f"peak {human_bytes(model.peak_attention_bytes(1))} in process"
        if model.kept is not None and in_flight:
            peak += f", {human_bytes(model.peak_attention_bytes(in_flight))} with {in_flight} " \
                    f"shards in flight on the cluster"
        elif model.kept is not None:
            peak += f", + {human_bytes(model.shard_size * model.input_bytes)} per further " \
                    f"shard in flight on Dask (up to its GPU + CPU task slots)"
        lines.append(f"  {model.name:<{width}} {str(model.attention):<22} {peak}; keep: "
                     f"{human_bytes(model.attention_bytes)}")
    return lines


def plan_rows(plan: SweepPlan, index: markers.MarkerIndex | None) -> list[dict[str, Any]]:
    """One row per model, the baseline and the matched nulls: what `sweep run` would do
    (`done`: tasks the store's markers already vouch for)."""

    def done(tasks: list) -> int:
        return sum(index is not None and index.done(t.scope, t.marker) for t in tasks)

    rows = []
    for model in plan.models:
        tasks = [t for t in plan.tasks
                 if getattr(t, "model", None) == model.name and t.stage != NULLS_STAGE]
        rows.append({"name": model.name, "dataset": model.dataset_name,
                     "inputs": model.n_inputs, "shards": model.n_shards,
                     "layers": model.n_layers, "heads": model.n_heads, "t_max": model.t_max,
                     "tasks": len(tasks), "done": done(tasks),
                     "attention_bytes": model.attention_bytes, "test_work": model.work,
                     "attention_policy": str(model.attention)})
    if plan.baseline is not None:
        b = plan.baseline
        tasks = [t for t in plan.tasks if t.stage == "baseline"]
        rows.append({"name": "baseline", "dataset": f"sizes {len(b.sizes)}", "inputs": b.trials,
                     "shards": b.n_chunks, "layers": None, "heads": None, "t_max": max(b.sizes),
                     "tasks": len(tasks), "done": done(tasks), "attention_bytes": None,
                     "test_work": b.work, "attention_policy": None})
    if plan.matched_nulls is not None:
        m = plan.matched_nulls
        tasks = [t for t in plan.tasks if t.stage == NULLS_STAGE]
        rows.append({"name": "matched nulls", "dataset": f"nulls {len(m.nulls)}",
                     "inputs": m.trials, "shards": m.n_chunks, "layers": None, "heads": None,
                     "t_max": None, "tasks": len(tasks), "done": done(tasks),
                     "attention_bytes": None, "test_work": None, "attention_policy": None})
    return rows


def table_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The rows as a fixed-width table (inputs: trials for the baseline and nulls)."""
    width = max([24, *(len(row["name"]) + 1 for row in rows)])
    lines = [f"{'model':<{width}} {'dataset':<14} {'inputs':>7} {'shards':>6} {'layers':>6} "
             f"{'heads':>5} {'T_max':>6} {'tasks':>6} {'done':>5} {'attention':>11} "
             f"{'test work':>11}"]
    for row in rows:
        cell = {key: "" if value is None else value for key, value in row.items()}
        size = "" if row["attention_bytes"] is None else human_bytes(row["attention_bytes"])
        work = "" if row["test_work"] is None else f"{row['test_work']:.3g}"
        lines.append(
            f"{row['name']:<{width}} {row['dataset']:<14} {row['inputs']:>7} {row['shards']:>6} "
            f"{cell['layers']:>6} {cell['heads']:>5} {cell['t_max']:>6} {row['tasks']:>6} "
            f"{row['done']:>5} {size:>11} {work:>11}".rstrip())
    return lines


def totals(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Tasks, attention bytes and test work summed over the rows."""
    return {"tasks": sum(row["tasks"] for row in rows),
            "done": sum(row["done"] for row in rows),
            "attention_bytes": sum(row["attention_bytes"] or 0 for row in rows),
            "test_work": sum(row["test_work"] or 0 for row in rows)}


def describe(plan: SweepPlan, in_flight: int | None = None, verbose: bool = True) -> list[str]:
    """The plan as printable lines: the table (per model, the baseline, the nulls), totals, the
    attention policy's peak bytes (`attention_lines`; every model's when `verbose`)."""
    index, state = _store_markers(plan.config)
    rows = plan_rows(plan, index)
    total = totals(rows)
    lines = [f"store: {plan.config.store} ({state})", "", *table_lines(rows), "",
             f"total: {total['tasks']} tasks ({total['done']} done); attention "
             f"{human_bytes(total['attention_bytes'])} uncompressed (float32, padded to T_max); "
             f"test work {total['test_work']:.3g} pair-elements (an upper bound)"]
    if verbose:
        lines += [
            "test work: the sum of L * T^3/2 per token set and stored head",
            f"preparation (training) and extraction tasks take the GPU resource, test and "
            f"baseline tasks the CPU resource; checkpoints cache: {plan.config.checkpoint_dir}",
        ]
    lines += attention_lines(plan, in_flight, every=verbose)
    return lines


def plan_json(config: SweepConfig, plan: SweepPlan, pools: Pools | None,
              cluster_text: str | None, prices: dict[str, Any] | None = None,
              cluster: ClusterConfig | None = None) -> dict[str, Any]:
    """What the text shows, as JSON data: the resolved config, the rows, totals, the training
    runs and estimated wall times (`prices`: `pricing`'s data) and, with a cluster, its
    description, the predicted seconds per model and each extraction worker's pace."""
    from sweep.driver.balance import extraction_cores, pace_data, predictions

    index, state = _store_markers(config)
    rows = plan_rows(plan, index)
    out: dict[str, Any] = {"config": redacted(config.resolved()), "store": config.store,
                           "store_state": state, "rows": rows, "total": totals(rows)}
    if prices is not None:
        out["pricing"] = prices
    if cluster_text is not None:
        out["cluster"] = {"description": cluster_text, "prediction": predictions(plan, pools),
                          "pace": pace_data(plan, pools, extraction_cores(cluster))}
    return out


def pricing(plan: SweepPlan, datasets: dict[str, Any], cluster: ClusterConfig | None
            ) -> tuple[list[str], dict[str, Any]]:
    """The training runs that go first and the estimated wall time of what the store still
    lacks on the local default and, with `cluster`, on it: text lines and JSON data
    (`sweep.driver.balance`)."""
    from sweep.driver.balance import (
        cluster_pools,
        estimate_json,
        pricing_lines,
        training_runs,
        wall_estimate,
    )

    rows = {name: len(dataset.table.target) for name, dataset in datasets.items()
            if getattr(dataset, "table", None) is not None}
    index = _store_markers(plan.config)[0]
    done = frozenset(t.key for t in plan.tasks if index is not None
                     and index.done(t.scope, t.marker))
    runs = training_runs(plan, rows, done)
    local = cluster_pools(load_cluster_config(None))
    shape = f"{local.cpu_cores} worker process(es), " + (f"{local.gpus} GPU(s)" if local.gpus
                                                          else "no GPU")
    estimate = wall_estimate(plan, local, runs, done)
    lines = pricing_lines(runs, estimate, f"on the local default ({shape})")
    data = {**estimate_json(runs, estimate), "cluster": None}
    if cluster is not None:
        pools = cluster_pools(cluster)
        there = None if pools is None else wall_estimate(plan, pools, runs, done)
        lines += pricing_lines([], there, f"with --cluster ({cluster.kind})")
        data["cluster"] = estimate_json(runs, there)["estimate"]
    return lines, data


def plan(args: argparse.Namespace) -> int:
    if args.config is None:
        config = load_config(default_config_path(), base=Path.cwd())
    else:
        config = load_config(args.config)
    cluster = None if args.cluster is None else load_cluster_config(args.cluster)  # before work
    text = args.format == "text"
    from sweep.clusters.client import describe_cluster
    from sweep.clusters.memory import memory_data, memory_lines
    from sweep.driver.balance import balance_lines, cluster_pools, extraction_cores, pace_lines
    from sweep.driver.preflight import check_cluster
    from sweep.driver.runner import check_config, sized_plan

    # what `sweep run CONFIG [--cluster FILE]` refuses before it writes, in its order
    check_cluster(config, cluster if cluster is not None else load_cluster_config(None))
    check_config(config, read_images=False)  # a plan opens no image: damage is run's to find
    sweep_plan, _, datasets = sized_plan(config, progress=True)  # refusals before any line
    prices, prices_data = pricing(sweep_plan, datasets, cluster)
    if text and args.verbose:
        print("resolved config:")
        print(yaml.safe_dump(redacted(config.resolved()), sort_keys=False).rstrip())
        print()
    elif text:
        print(f"sweep plan: {len(config.models)} models")
    pools = None if cluster is None else cluster_pools(cluster)
    in_flight = None if pools is None else max(2, pools.extract_slots + pools.cpu_cores)
    if not text:
        cluster_text = None if cluster is None else describe_cluster(cluster)
        data = plan_json(config, sweep_plan, pools, cluster_text, prices_data, cluster)
        if cluster is not None:
            data["cluster"]["memory"] = memory_data(cluster, sweep_plan.models)
        print(json.dumps(data, indent=1, default=str))
        return 0
    for line in describe(sweep_plan, in_flight, verbose=args.verbose):
        print(line)
    print("\n".join(["", *prices]))
    if cluster is not None:
        print()
        print(describe_cluster(cluster) if args.verbose else cluster_summary(cluster, pools))
        print("\n".join(["", *balance_lines(sweep_plan, pools, constants=args.verbose)]))
        print("\n".join(["", *pace_lines(sweep_plan, pools, extraction_cores(cluster))]))
        print("\n".join(["", *memory_lines(cluster, sweep_plan.models, args.verbose)]))
    return 0


def cluster_summary(cluster: ClusterConfig, pools: Pools | None) -> str:
    """One line: the cluster's kind and pools (`--verbose`: its scripts or manifests)."""
    if pools is None:
        return f"cluster: {cluster.kind} (an existing scheduler: its pools are unknown here)"
    return (f"cluster: {cluster.kind}, {pools.extract_slots} extraction worker(s) "
            f"({pools.gpus} GPU(s)), {pools.cpu_cores} CPU core(s) for tests "
            f"(--verbose: what it would start)")

"""What a sweep costs before it runs: the measured training cost of each recipe the project
trains (TRAINING_COSTS), the training runs a plan starts first, and the run's estimated wall
time on the local default or on a cluster (from these and `sweep.driver.balance`).

Pure: plan, pools and the trained tables' row counts in, numbers and lines out.

- Training, CPU-s of one run = TRAINING_COSTS[recipe].seconds x the table's rows x the model's
  tokens x the epochs it runs (the recipe's epoch option when every epoch runs; the median of
  the measured runs, at most the cap, when early stopping ends it). One run per (recipe,
  options that determine training, seed, table): a model's checkpoints share their model's run;
  random-init controls train nothing. Measured on 1 torch thread on the CPU, as a preparation
  task trains; an FT-Transformer on a CUDA worker trains on the GPU (not measured: the CPU
  figure is then an upper bound).
- Size-matched nulls and the baseline, CPU-s per trial of size n = NULL_TRIAL_S +
  NULL_ELEMENT_S x n^2 + CHECK_S x n^3 / 2 (the draw, its softmax and the test).
- Wall time: without a GPU every task shares the CPU workers, so about the fixed costs + the
  larger of (all work / CPU workers) and the longest training run (one run is one thread);
  with GPUs, the fixed costs + the larger of the GPU workers' share (training and extraction,
  at least the longest run) and the CPU workers' (tests, nulls, baseline). Stages overlap; it
  is an estimate from measured constants, not a schedule.

A new recipe (a preset of a family the project trains) is one line in TRAINING_COSTS, measured
with `benchmarks/plan_costs.py training RECIPE TABLE` (benchmarks/README.md).
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass

from storage.attention import EXTRACT_STAGE
from storage.layout import BASELINE_GROUP, BASELINE_STAGE, NULLS_STAGE
from sweep.driver.balance import (
    CONSTANTS,
    Pools,
    extract_seconds,
    mean_tokens_cubed,
    stage_cpu_seconds,
)
from sweep.driver.plan import ModelPlan, SweepPlan, prepare_key
from workers.models.registry import OPTION_MODULES, resolve_model
from workers.models.token_layout import needs_preparation


@dataclass(frozen=True)
class TrainingCost:
    """One recipe's measured training cost: `seconds` CPU-s per (table row x token x epoch) on
    one torch thread; the epochs it runs: the option `epochs` names (every epoch runs) or, for
    early stopping, `typical` (the median of the measured runs) capped by the option `cap`."""

    seconds: float
    measured: str
    epochs: str | None = None
    typical: int | None = None
    cap: str | None = None


TRAINING_COSTS: dict[str, TrainingCost] = {
    "vit-digits": TrainingCost(3.6e-5, "plan_costs.py training vit-digits digits", "epochs"),
    "ft-transformer": TrainingCost(8.0e-5, "plan_costs.py training ft-transformer breast_cancer,"
                                   " wine", typical=42, cap="max_epochs"),
}
"""Recipe (the preset a model's `source` names) -> its measured training cost, one line each:
`measured` is the `benchmarks/plan_costs.py` command that measures it; benchmarks/README.md
("What sweep plan prices") has the runs behind each constant (vit-digits: 44.8 CPU-s here and
39.8-46.9 in docs/training.md, 3.3-3.8e-5; ft-transformer: 6.7e-5 on breast_cancer and 9.4e-5
on wine here, 8.5e-5 over docs/ft-transformer.md's six runs, whose epochs run 30-145, median
42)."""

NULL_CONSTANTS: dict[str, tuple[float, str]] = {
    "NULL_TRIAL_S": (4.1e-6, "CPU-s per null trial, whatever its size (draw, test call)"),
    "NULL_ELEMENT_S": (2.6e-8, "CPU-s per matrix element (n^2) of a null trial (the draw)"),
}
"""The nulls' constants (value, unit), fitted to `benchmarks/plan_costs.py nulls --sizes
8,17,32,64,128 --trials 2000` (uniform and softmax-b1: 5.5, 12.6, 34.3, 115, 424 CPU-us per
trial; the fit within 10% of each; benchmarks/README.md)."""


@dataclass(frozen=True)
class TrainingRun:
    """One training run a plan starts first: the models it serves (the first trains), its
    recipe, sizes and estimated CPU-s (None: no measured cost for the recipe)."""

    models: tuple[str, ...]
    recipe: str
    rows: int
    tokens: int
    epochs: int | None
    cpu_s: float | None
    note: str = ""  # why the figure is an estimate beyond its constant, if it is

    def line(self) -> str:
        """'vit@seed0 (and 3 checkpoints): vit-digits, 1,797 rows x 17 tokens x 40 epochs:
        about 43 CPU-s'."""
        more = f" (and {len(self.models) - 1} of its checkpoints)" if len(self.models) > 1 else ""
        if self.cpu_s is None:
            return (f"{self.models[0]}{more}: {self.recipe}, no measured cost (add its line "
                    f"to TRAINING_COSTS: benchmarks/plan_costs.py training {self.recipe} TABLE)")
        return (f"{self.models[0]}{more}: {self.recipe}, {self.rows:,} rows x {self.tokens} "
                f"tokens x {self.epochs} epochs: about {_duration(self.cpu_s)} of CPU"
                f"{self.note}")


def training_runs(plan: SweepPlan, rows: dict[str, int],
                  done: frozenset[str] = frozenset()) -> list[TrainingRun]:
    """The distinct training runs of `plan`'s models that need preparation and whose
    preparation task is not `done` (task keys the store's markers vouch for), in plan order;
    `rows`: model name -> rows of the table it trains on."""
    runs: dict[str, list[ModelPlan]] = {}
    for model in plan.models:
        if needs_preparation(model.spec) and prepare_key(model.name) not in done:
            runs.setdefault(_run_key(model), []).append(model)
    return [_run(models, rows[models[-1].name]) for models in runs.values()]


def _run_key(model: ModelPlan) -> str:
    spec = model.spec
    trained = importlib.import_module(OPTION_MODULES[spec.family]).training_options
    return json.dumps([spec.name, spec.seed, trained(spec.options), model.dataset.to_dict()],
                      sort_keys=True, default=str)


def _run(models: list[ModelPlan], rows: int) -> TrainingRun:
    """The run of `models` (checkpoints first, the trained model last: it names the run)."""
    model = models[-1]
    names = (model.name, *(m.name for m in models[:-1]))
    cost = TRAINING_COSTS.get(model.spec.name)
    if cost is None:
        return TrainingRun(names, model.spec.name, rows, model.t_max, None, None)
    options = model.spec.options
    epochs = int(options[cost.epochs]) if cost.epochs else min(
        int(cost.typical or 0), int(options.get(cost.cap, cost.typical or 0)))
    note = "" if cost.epochs else f" (early stopping: {epochs} epochs, the measured median)"
    if _differs_from_recipe(model):
        note += "; its options differ from the measured recipe's: a rougher estimate"
    return TrainingRun(names, model.spec.name, rows, model.t_max, epochs,
                       cost.seconds * rows * model.t_max * epochs, note)


EPOCH_OPTIONS = ("epochs", "max_epochs", "patience")
"""Training options the cost scales with (epochs) or that only end it sooner."""


def _differs_from_recipe(model: ModelPlan) -> bool:
    """Whether `model`'s training options, epochs aside, differ from its recipe's defaults."""
    spec = model.spec
    trained = importlib.import_module(OPTION_MODULES[spec.family]).training_options
    mine, recipe = (
        {k: v for k, v in trained(options).items() if k not in EPOCH_OPTIONS}
        for options in (spec.options, resolve_model(spec.name).options))
    return mine != recipe


def null_trial_seconds(n: float) -> float:
    """Predicted CPU-s of one null trial of size n (module doc)."""
    return (NULL_CONSTANTS["NULL_TRIAL_S"][0] + NULL_CONSTANTS["NULL_ELEMENT_S"][0] * n**2
            + CONSTANTS["CHECK_S"].seconds * n**3 / 2)


def null_seconds(plan: SweepPlan, left: dict[tuple[str, str], float]) -> float:
    """Predicted CPU-s of the size-matched nulls and the baseline still to run (`left`:
    `pending_shares`)."""
    seconds = 0.0
    if plan.matched_nulls is not None:
        m = plan.matched_nulls
        for model in plan.models:
            n = mean_tokens_cubed(model) ** (1.0 / 3.0)
            trials = m.trials * len(model.token_sets) * len(m.model_nulls(model))
            seconds += trials * null_trial_seconds(n) * left.get((model.name, NULLS_STAGE), 0)
    if plan.baseline is not None:
        b = plan.baseline
        seconds += b.trials * len(b.nulls) * sum(null_trial_seconds(n) for n in b.sizes) * \
            left.get((BASELINE_GROUP, BASELINE_STAGE), 0)
    return seconds


def pending_shares(plan: SweepPlan, done: frozenset[str]) -> dict[tuple[str, str], float]:
    """(model or `baseline`, stage) -> the share of its tasks not `done` (1.0: all pending)."""
    tasks: dict[tuple[str, str], list[bool]] = {}
    for task in plan.tasks:
        owner = getattr(task, "model", None) or BASELINE_GROUP
        tasks.setdefault((owner, task.stage), []).append(task.key not in done)
    return {key: sum(left) / len(left) for key, left in tasks.items()}


@dataclass(frozen=True)
class WallEstimate:
    """A run's estimated wall seconds and the work it comes from (seconds of one worker)."""

    wall_s: float
    training_s: float  # all training runs
    longest_training_s: float
    extract_s: float
    test_s: float
    nulls_s: float
    fixed_s: float
    gpu: bool
    unpriced: tuple[str, ...]  # recipes without a measured cost (their training left out)


def wall_estimate(plan: SweepPlan, pools: Pools, runs: list[TrainingRun],
                  done: frozenset[str] = frozenset()) -> WallEstimate:
    """The estimated wall time of what `plan` still has to do (tasks not `done`) on `pools`
    (module doc): `runs` are its pending training runs (`training_runs`)."""
    gpu, left = pools.gpus > 0, pending_shares(plan, done)
    priced = [r.cpu_s for r in runs if r.cpu_s is not None]
    training, longest = sum(priced), max(priced, default=0.0)
    extract = sum(m.n_inputs * extract_seconds(m, gpu) * left.get((m.name, EXTRACT_STAGE), 0)
                  for m in plan.models)
    test = sum(m.n_inputs * stage_cpu_seconds(m) * left.get((m.name, "test"), 0)
               for m in plan.models)
    loads = sum(left.get((m.name, EXTRACT_STAGE), 0) > 0 for m in plan.models)
    nulls = null_seconds(plan, left)
    fixed = 0.0 if not any(left.values()) else CONSTANTS["WORKER_START_S"].seconds + \
        CONSTANTS["MODEL_LOAD_S"].seconds * loads / max(pools.extract_slots, 1)
    cores, slots = max(pools.cpu_cores, 1), max(pools.extract_slots, 1)
    if gpu:
        work = max(max((training + extract) / slots, longest), (test + nulls) / cores)
    else:
        work = max((training + extract + test + nulls) / cores, longest)
    return WallEstimate(fixed + work, training, longest, extract, test, nulls, fixed, gpu,
                        tuple(dict.fromkeys(r.recipe for r in runs if r.cpu_s is None)))


def pricing_lines(runs: list[TrainingRun], estimate: WallEstimate | None, where: str
                  ) -> list[str]:
    """The plan's training and wall-time lines: the runs that train first, then the estimate
    `where` (the local default or the cluster) names; None: the cluster's size is unknown."""
    lines = []
    if runs:
        lines.append(f"training first: {len(runs)} run(s), each before its models' extraction "
                     f"(sweep/driver/pricing.py TRAINING_COSTS, measured):")
        lines += [f"  {run.line()}" for run in runs]
    if estimate is None:
        return [*lines, f"estimated wall time {where}: unknown (an existing cluster's size)"]
    e = estimate
    share = ("GPU workers: training + extraction; CPU workers: tests, nulls" if e.gpu else
             "every task on the CPU workers")
    lines.append(
        f"estimated wall time {where}: about {_duration(e.wall_s)} (work in CPU-s: training "
        f"{_duration(e.training_s)}, longest run {_duration(e.longest_training_s)}; "
        f"extraction {_duration(e.extract_s)}; tests {_duration(e.test_s)}; nulls and baseline "
        f"{_duration(e.nulls_s)}; fixed {_duration(e.fixed_s)}; {share})")
    if e.unpriced:
        lines.append(f"  not counted: the training of {', '.join(e.unpriced)} (no measured cost)")
    return lines


def estimate_json(runs: list[TrainingRun], estimate: WallEstimate | None) -> dict:
    """The training runs and the estimate as JSON data."""
    return {"training": [{"models": list(r.models), "recipe": r.recipe, "rows": r.rows,
                          "tokens": r.tokens, "epochs": r.epochs, "cpu_s": r.cpu_s}
                         for r in runs],
            "estimate": None if estimate is None else {
                key: getattr(estimate, key) for key in (
                    "wall_s", "training_s", "longest_training_s", "extract_s", "test_s",
                    "nulls_s", "fixed_s", "gpu")}}


def _duration(seconds: float) -> str:
    """12.3 -> '12 s', 754 -> '12.6 min', 9000 -> '2.5 h'."""
    if seconds < 100:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.2g} s"
    if seconds < 6000:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"

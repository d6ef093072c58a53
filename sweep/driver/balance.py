"""The balance of a sweep on a cluster: predicted seconds per input of each stage, from measured
constants, and how many CPU workers per GPU keep pace with extraction.

Pure: plan + cluster config in, numbers and lines out. Costs scale with the plan's sizes:

- test stage, CPU-seconds per input = SHARD_S / shard_size (what a shard costs whatever its
  inputs: the store opened, the results written, checksums, marker) + sum over kept heads (1 for
  `heads: mean`) and token sets of STACK_S (what one stack costs regardless of T: its read,
  result cells, calls) + sum over layers of
  CHECK_S * T^3 / 2 (the pairwise kernel) + RADIUS_S * T^2 (the decision radius, found on the
  kernel's own screen: O(T^2) scans and a few exact sums) + RESTRICT_IO_S * T^2 (read,
  restriction, write)
  + the rollout: PRODUCTS_S * T^3 / 2 per product (layers - 1 of them unless `rollout: off`)
  and ROLLOUT_KAPPA_S * T^3 / 2 per layer whose kappa is computed (every: L, last: 1, off: 0);
  T^3 is the mean over the plan's inputs of their token count cubed (`ModelPlan.cube_sum`),
  T^2 its 2/3 power. The content token set is costed at the whole T (an upper bound). The size
  constants were measured on parts that include their calls' fixed cost, which STACK_S counts
  again: small stacks are costed a little high.
- extraction, seconds per input = layers x tokens x a per-(layer, token) constant: GPU_LAYER_TOKEN_S
  on a CUDA GPU, CPU_LAYER_TOKEN_S (CPU-seconds) where extraction runs on CPU workers. Widths
  differ between models (MiniLM 384, ViT-B 768, ViT-L 1024); the constants are ViT-B's. On CPU
  workers the per-(layer, token) cost scales as (width / 768)^2 when the plan knows the width
  (`ModelPlan.width`; the projections and MLP dominate at these T): measured, 1.6e-5 CPU-s for
  the 64-wide digits ViT (predicted 1.1e-5) and 7.5e-5 for MiniLM (384: predicted 4.0e-4, an
  upper bound); benchmarks/README.md ("What sweep plan prices").
- `rollout_device: extraction` moves the rollout's two terms from the test stage to the
  extraction: GPU_ROLLOUT_S * T^3 / 2 per product and per kappa there (on a GPU; the CPU terms
  where extraction runs on CPU workers).

- fixed, seconds per run: WORKER_START_S + MODEL_LOAD_S x models / extraction workers
  (`fixed_seconds`), added to the larger stage.

The constants (CONSTANTS) were measured as stated beside each; rerun the commands named there on
the target hardware and replace them. The GPU constants come from `benchmarks/gpu_check.sh` on one
H200; a constant not measured on the hardware it stands for is marked `estimate` and named
wherever a figure rests on it.

What a run costs (issue 45; the last section of this module): the measured training cost of
each recipe the project trains (TRAINING_COSTS), the training runs a plan starts first, and the
run's estimated wall time on the local default or on a cluster, for `sweep plan`.

- Training, CPU-s of one run = TRAINING_COSTS[recipe].seconds x the table's rows x the model's
  tokens x the epochs it runs (the recipe's epoch option when every epoch runs; the median of
  the measured runs, at most the cap, when early stopping ends it). One run per (recipe,
  options that determine training, seed, table): a model's checkpoints share their model's run;
  random-init controls train nothing. Measured on 1 torch thread on the CPU, as a preparation
  task trains; an FT-Transformer on a CUDA worker trains on the GPU (not measured: the CPU
  figure is then an upper bound).
- Size-matched nulls and the baseline, CPU-s per trial of size n = NULL_TRIAL_S +
  NULL_ELEMENT_S x n^2 + CHECK_S x n^3 / 2 (the draw, its softmax and the test).
- Wall time of what the store still lacks: without a GPU every task shares the CPU workers, so
  about the fixed costs + the larger of (all work / CPU workers) and the longest training run
  (one run is one thread); with GPUs, the fixed costs + the larger of the GPU workers' share
  (training and extraction, at least the longest run) and the CPU workers' (tests, nulls,
  baseline). Stages overlap; it is an estimate from measured constants, not a schedule.

A new recipe (a preset of a family the project trains) is one line in TRAINING_COSTS, measured
with `benchmarks/plan_costs.py training RECIPE TABLE` (benchmarks/README.md).
"""

from __future__ import annotations

import importlib
import json
import math
from dataclasses import dataclass
from typing import Any

from storage.attention import EXTRACT_STAGE
from storage.layout import BASELINE_GROUP, BASELINE_STAGE, NULLS_STAGE
from sweep.clusters.config import ClusterConfig
from sweep.clusters.local import cuda_devices
from sweep.clusters.shapes import pool_shapes
from sweep.driver.plan import ModelPlan, SweepPlan, prepare_key
from workers.models.registry import OPTION_MODULES, resolve_model
from workers.models.token_layout import needs_preparation
from workers.models.trained.options import MEASUREMENT_ONLY, training_options


@dataclass(frozen=True)
class Constant:
    """A cost constant: its value in seconds per unit and where it comes from; `estimate` when
    it was not measured on the hardware it stands for."""

    seconds: float
    unit: str
    measured: str
    estimate: bool = False


CONSTANTS: dict[str, Constant] = {
    "SHARD_S": Constant(
        5.5e-2, "CPU-s per shard of the test stage, whatever its inputs (opening the store, "
        "token counts, the 17 result variables' write, checksums, marker)",
        "NUMBA_NUM_THREADS=1 OMP_NUM_THREADS=1 benchmarks/test_stage_bench.py --cases tiny "
        "(T = 8, 12 layers) at --inputs 32 (3.39 and 3.48 CPU ms per input, two runs) and "
        "--inputs 256 (1.93): the difference per input is SHARD_S x (1/32 - 1/256); ffa1ef2, "
        "2-core AMD EPYC, 2026-12-01",
    ),
    "STACK_S": Constant(
        8.6e-4, "CPU-s per (input, head, token set) stack, whatever its size (its attention "
        "chunk's read, result cells, Python and kernel calls)",
        "that run: (1.93 ms - SHARD_S / 256) / 2 token sets, at T = 8 where the size terms "
        "below are negligible",
    ),
    "CHECK_S": Constant(
        4.1e-11, "CPU-s per pair-element (T^3/2 per matrix) of `check`",
        "NUMBA_NUM_THREADS=1 OMP_NUM_THREADS=1 benchmarks/test_stage_bench.py --cases "
        "vit-b,dinov2-l-reg --inputs 32 --rounds 3, part 'check' (CPU ms / pair-elements), "
        "one thread, 2-core AMD EPYC otherwise idle, 2026-11-30; DINOv2-L-reg 224 in the same "
        "run: 4.3e-11",
    ),
    "PRODUCTS_S": Constant(
        1.2e-10, "CPU-s per pair-element (T^3/2) of one float64 rollout product",
        "same run, part 'rollout products' (DINOv2-L-reg: 1.1e-10)",
    ),
    "ROLLOUT_KAPPA_S": Constant(
        3.5e-11, "CPU-s per pair-element (T^3/2) of kappa of one rollout product",
        "the same bench, 1 thread, re-run 2026-11-30 at 9c11c5e (mean of two runs), part "
        "'rollout kappa' (DINOv2-L-reg: 4.6e-11; both after the centre bound)",
    ),
    "RESTRICT_IO_S": Constant(
        6.7e-9, "CPU-s per attention element (T^2 per layer and token set): read, "
        "restriction, write",
        "that re-run, parts 'read' + 'restriction' + 'write' (DINOv2-L-reg: 4.0e-9; after the "
        "reused read buffer)",
    ),
    "RADIUS_S": Constant(
        1.1e-10, "CPU-s per matrix element (T^2 per matrix) of the decision radius",
        "NUMBA_NUM_THREADS=1 OMP_NUM_THREADS=1 benchmarks/test_stage_bench.py, part 'radius' "
        "(screened_radius alone, with its per-matrix call) / T^2 per matrix: the largest of "
        "ViT-B T = 197 (1.07e-10), DINOv2-L-reg 261 (6.4e-11), DINOv2-B 336 577 (2.5e-11) and "
        "DINOv2 518 1370 (1.02e-10), 0.8-4.4% of check; benchmarks/README.md, 2026-12-03",
    ),
    "GPU_ROLLOUT_S": Constant(
        2.0e-12, "GPU-s per pair-element (T^3/2) of one float64 rollout product or of its kappa "
        "on one CUDA GPU (`rollout_device: extraction`; restriction and copy to the GPU included)",
        "benchmarks/gpu_check.sh on one H200 (torch 2.11), 2026-12-04, two runs: 'rollout on "
        "cuda at T=1370, 12 layers' 60.9 and 69.7 ms / (12 x 2 x 1370^3 / 2) = 2.0-2.3e-12",
    ),
    "CPU_LAYER_TOKEN_S": Constant(
        1.6e-3, "CPU-s per (layer x token) of extraction on CPU workers",
        "benchmarks/README.md (extract_bench.py vit-base-16 --random-init --batch-size 8: 0.54 "
        "inputs/s on 2 cores = 3.7 CPU-s per input / (12 x 197))",
    ),
    "WORKER_START_S": Constant(
        2.9, "s to start the cluster's workers and import the task code in them, once per run",
        "python benchmarks/fixed_costs.py: open_client on the default local cluster (2 workers "
        "as threads) until its workers import workers.tasks; 2-core AMD EPYC under load "
        "average 4, 2026-12-04",
    ),
    "MODEL_LOAD_S": Constant(
        5.9, "s to load one model on a worker (imports, weights), once per model and "
        "extraction worker",
        "that run: a fresh process imports the model code and builds minilm-l6 (4.9 s), "
        "tiny-roberta (5.6 s), tiny-deit-distilled (7.2 s), torch's import included: an upper "
        "bound for a worker's second model",
    ),
    "GPU_LAYER_TOKEN_S": Constant(
        3.0e-6, "GPU-s per (layer x token) of extraction on one CUDA GPU",
        "benchmarks/gpu_check.sh on one H200 (torch 2.11), 2026-12-04, two runs: a random-init "
        "ViT-B/16 (timm) on 14 images in one batch, preprocessing included, 142 and 112 inputs/s "
        "= 1 / (142 x 12 x 197) to 1 / (112 x 12 x 197) = 3.0-3.8e-6; larger batches may be "
        "faster",
    ),
}


CONSTANTS.update({  # one GPU worker's pace (`worker_pace`, issue 41)
    "GPU_FORWARD_LAYER_TOKEN_S": Constant(
        3.5e-7, "GPU-s per (layer x token) of the eager forward pass alone (attention "
        "materialised, float32) on one data-centre GPU, at batch 64",
        "ViT-B/16's 35 GFLOP per image at 40 TFLOP/s of float32 (an H100 or H200 without TF32) "
        "= 0.9 ms / (12 x 197); to measure: benchmarks/gpu_check.sh ('bare eager forward')",
        estimate=True,
    ),
    "HOST_IMAGE_S": Constant(
        1.55e-3, "CPU-s per image input outside the forward pass, its attention bytes aside: "
        "reading and decoding a 500 x 375 JPEG (torchvision's decoder), the model's own "
        "image processor, and the task's other work per input",
        "thin ViT-B (224 px, ViTImageProcessor) on a simulated device (no forward pass): "
        "1.80 and 2.00 CPU ms per input less HOST_BYTE_S x its 1.86 MB = 1.47 and 1.63 ms in "
        "two runs of PYTHONPATH=. python benchmarks/plan_costs.py host (2-core AMD EPYC, "
        "2 cores a task, nothing deleted in the last minute; 2026-12-07, at 5acd794)",
    ),
    "HOST_TEXT_S": Constant(
        0.72e-3, "CPU-s per text input outside the forward pass, its attention bytes aside "
        "(tokenisation: the model's own tokenizer; the task's other work per input)",
        "thin RoBERTa (T <= 128, pydoc's topics, the tiny BPE): 0.74 and 1.01 CPU ms per input "
        "less HOST_BYTE_S x its 0.79 MB = 0.60 and 0.85 ms; the same two runs",
    ),
    "HOST_BYTE_S": Constant(
        1.9e-10, "CPU-s per byte of an input's padded attention: cropped into the chunk "
        "buffer (on a GPU worker the device does this: an upper bound there), checked finite, "
        "written to the store (direct where the file system takes it) and its checksum taken",
        "thin DINOv2 at 518 px (T = 1370, 90.1 MB per input) on a simulated device: 17.6 and "
        "19.6 CPU ms per input less its load alone (1.75 and 1.65 ms) / 90.1 MB = 1.76e-10 and "
        "2.00e-10; the same two runs (buffered writes at 0b5a2e6 gave 1.43e-9)",
    ),
})


def _c(name: str) -> float:
    return CONSTANTS[name].seconds


def mean_tokens_cubed(model: ModelPlan) -> float:
    """Mean over the model's inputs of T^3 (from `cube_sum`, the sum of T^3 // 2)."""
    return 2.0 * model.cube_sum / max(model.n_inputs, 1)


def rollout_pair_elements(model: ModelPlan) -> tuple[float, float]:
    """Pair-elements (T^3/2 each) per input of the rollout's products and of their kappa."""
    if model.rollout == "off":
        return 0.0, 0.0
    pairs, layers = mean_tokens_cubed(model) / 2.0, model.n_layers
    stacks = model.n_heads * len(model.token_sets)
    kappas = layers if model.rollout == "every" else 1
    return stacks * (layers - 1) * pairs, stacks * kappas * pairs


def stage_cpu_seconds(model: ModelPlan) -> float:
    """Predicted CPU-seconds of the test stage per input of `model` (see the module doc)."""
    cube = mean_tokens_cubed(model)
    pairs, square, layers = cube / 2.0, cube ** (2.0 / 3.0), model.n_layers
    per_set = layers * (_c("CHECK_S") * pairs + (_c("RADIUS_S") + _c("RESTRICT_IO_S")) * square)
    stacks = model.n_heads * len(model.token_sets)
    seconds = _c("SHARD_S") / max(model.shard_size, 1) + stacks * (_c("STACK_S") + per_set)
    if model.rollout_device == "test":
        products, kappas = rollout_pair_elements(model)
        seconds += products * _c("PRODUCTS_S") + kappas * _c("ROLLOUT_KAPPA_S")
    return seconds


VIT_B_WIDTH = 768  # the width CPU_LAYER_TOKEN_S was measured at


def cpu_width_scale(model: ModelPlan) -> float:
    """(width / 768)^2: CPU_LAYER_TOKEN_S scaled from ViT-B's width to `model`'s (1 when the
    plan does not know it)."""
    return 1.0 if model.width is None else (model.width / VIT_B_WIDTH) ** 2


def extract_seconds(model: ModelPlan, gpu: bool) -> float:
    """Predicted extraction seconds per input: GPU-seconds, or CPU-seconds without a GPU (the
    rollout's products and kappa included with `rollout_device: extraction`)."""
    tokens = mean_tokens_cubed(model) ** (1.0 / 3.0)
    per = _c("GPU_LAYER_TOKEN_S") if gpu else _c("CPU_LAYER_TOKEN_S") * cpu_width_scale(model)
    seconds = per * model.n_layers * tokens
    if model.rollout_device == "extraction":
        products, kappas = rollout_pair_elements(model)
        if gpu:
            seconds += (products + kappas) * _c("GPU_ROLLOUT_S")
        else:
            seconds += products * _c("PRODUCTS_S") + kappas * _c("ROLLOUT_KAPPA_S")
    return seconds


@dataclass(frozen=True)
class Pools:
    """What a cluster config starts: GPU devices for extraction, CPU cores for tests."""

    gpus: int  # CUDA devices (0: extraction runs on CPU workers)
    cpu_cores: int  # cores of the workers that run test tasks
    extract_slots: int  # workers that run extraction (GPUs, or CPU workers without GPUs)


def cluster_pools(cfg: ClusterConfig, cpu_count: int | None = None,
                  devices: list[int] | None = None) -> Pools | None:
    """The pool sizes `cfg` starts (`sweep.clusters.shapes`); None for `address` (an existing
    cluster: sizes unknown). Test cores are the threads of the workers carrying CPU."""
    shapes = pool_shapes(cfg, cpu_count, devices)
    if shapes is None:
        return None
    cores = sum(s.workers * s.threads for s in shapes.values() if s.resources.get("CPU"))
    slots = sum(s.workers for s in shapes.values() if s.resources.get("GPU"))
    if cfg.kind == "local":
        gpus = len(devices if devices is not None else cuda_devices(cfg.local.gpus))
    elif cfg.kind == "kubernetes" and cfg.kubernetes is not None:
        gpus = cfg.kubernetes.gpu.workers * max(cfg.kubernetes.gpu.gpus, 1)
    else:
        gpus = shapes["gpu"].workers
    return Pools(gpus=gpus, cpu_cores=cores, extract_slots=slots)


@dataclass(frozen=True)
class CoresPerGpu:
    """How many CPU cores of the test pool keep one GPU busy with one model's inputs."""

    model: str
    cores: float  # test CPU-s per input / extraction GPU-s per input
    test_s: float  # CPU-s of the test stage per input
    extract_s: float  # GPU-s of extraction per input
    estimates: tuple[str, ...]  # the CONSTANTS it rests on that are estimates

    def line(self) -> str:
        """'vit-b: 19.6 CPU cores per GPU (...)'; one line."""
        rests = f"; estimated: {', '.join(self.estimates)}" if self.estimates else ""
        return (f"{self.model}: {self.cores:.1f} CPU cores per GPU ({self.test_s:.3g} CPU-s of "
                f"test / {self.extract_s:.3g} GPU-s of extraction per input{rests})")


CORES_PER_GPU_MEANING = (
    "CPU cores per GPU: test CPU-s per input / extraction GPU-s per input, the single-threaded "
    "test workers that keep one GPU busy; fewer leave it waiting, more wait for it")


def cores_per_gpu(model: ModelPlan) -> CoresPerGpu:
    """The test pool's cores that keep pace with one GPU extracting `model` (from CONSTANTS)."""
    extract, test = extract_seconds(model, gpu=True), stage_cpu_seconds(model)
    used = ("GPU_LAYER_TOKEN_S",) + (("GPU_ROLLOUT_S",) if model.rollout_device == "extraction"
                                     else ())
    estimates = tuple(name for name in used if CONSTANTS[name].estimate)
    return CoresPerGpu(model=model.name, cores=test / extract, test_s=test, extract_s=extract,
                       estimates=estimates)


def fixed_seconds(plan: SweepPlan, pools: Pools | None) -> float:
    """Predicted seconds a run spends before and between its per-input work: the workers' start
    plus each model's load, the loads spread over the extraction workers (training not
    counted: a prepared model's `PrepareTask` is its own cost)."""
    slots = 1 if pools is None else max(pools.extract_slots, 1)
    return _c("WORKER_START_S") + _c("MODEL_LOAD_S") * len(plan.models) / slots


def predictions(plan: SweepPlan, pools: Pools | None) -> dict[str, object]:
    """The numbers of `balance_lines` as data: per model, seconds per input of each stage and
    CPU cores per GPU (None without a GPU), and the fixed seconds."""
    gpu = pools is None or pools.gpus > 0
    models = {}
    for model in plan.models:
        extract, test = extract_seconds(model, gpu), stage_cpu_seconds(model)
        models[model.name] = {"extract_s_per_input": extract, "test_cpu_s_per_input": test,
                              "cpu_cores_per_gpu": cores_per_gpu(model).cores if gpu else None}
    return {"gpu": gpu, "models": models, "fixed_s": fixed_seconds(plan, pools)}


def balance_lines(plan: SweepPlan, pools: Pools | None, constants: bool = True) -> list[str]:
    """Per model: predicted GPU- and CPU-seconds per input, CPU cores per GPU that keep pace
    (`cores_per_gpu`), per-stage seconds on `pools` (when known), the fixed costs, and
    (`constants`) the constants with their sources. Every number is from CONSTANTS; the
    estimated ones are marked."""
    gpu = pools is None or pools.gpus > 0
    lines = ["balance (predicted from measured constants: sweep/driver/balance.py CONSTANTS):"]
    unit = "GPU-s" if gpu else "CPU-s (no GPU)"
    lines.append(f"{'model':<20} {'extract ' + unit + '/input':>26} {'test CPU-s/input':>17} "
                 f"{'CPU cores per GPU':>17} {'extract s':>10} {'test s':>10}")
    for model in plan.models:
        extract, test = extract_seconds(model, gpu), stage_cpu_seconds(model)
        per_gpu = f"{cores_per_gpu(model).cores:.1f}" if gpu else "-"
        if pools is None:
            stage_extract = stage_test = "?"
        else:
            stage_extract = f"{model.n_inputs * extract / max(pools.extract_slots, 1):.3g}"
            stage_test = f"{model.n_inputs * test / max(pools.cpu_cores, 1):.3g}"
        lines.append(f"{model.name:<20} {extract:>26.3g} {test:>17.3g} {per_gpu:>17} "
                     f"{stage_extract:>10} {stage_test:>10}")
    estimated = dict.fromkeys(e for model in plan.models for e in cores_per_gpu(model).estimates)
    rests = f"estimated constants: {', '.join(estimated)}" if estimated else "no estimated constant"
    lines.append(f"{CORES_PER_GPU_MEANING}; {rests}")
    if pools is None:
        lines.append("per-stage seconds: unknown for an existing cluster (kind: address)")
    else:
        lines.append(
            f"per-stage seconds on this cluster: {pools.extract_slots} extraction worker(s) "
            f"({pools.gpus} GPU(s)), {pools.cpu_cores} CPU core(s) for tests; stages overlap, "
            f"so the sweep takes about the larger of the two"
        )
    slots = 1 if pools is None else max(pools.extract_slots, 1)
    lines.append(
        f"fixed: {fixed_seconds(plan, pools):.3g} s = worker start {_c('WORKER_START_S'):.2g} s "
        f"+ {len(plan.models)} model loads x {_c('MODEL_LOAD_S'):.2g} s / {slots} extraction "
        f"worker(s), added to the larger stage (measured: python benchmarks/fixed_costs.py)")
    if not constants:
        lines.append("constants: sweep/driver/balance.py CONSTANTS (--verbose: their sources)")
        return lines
    lines.append("constants (value, unit, where measured; ESTIMATE: not measured yet):")
    lines += [f"  {name} = {c.seconds:.2g} {c.unit}{' (ESTIMATE)' if c.estimate else ''}\n"
              f"      [{c.measured}]" for name, c in CONSTANTS.items()]
    return lines


# What a run costs: the training runs that go first and the wall time (issue 45). Kept apart
# from the balance above; `sweep plan` prints it with `pricing_lines` (sweep/cli/commands/plan.py
# `pricing`).

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
    "vit-digits objective=dino": TrainingCost(
        1.7e-4, "plan_costs.py training vit-digits digits --option objective=dino", "epochs"),
    "vit-digits objective=distilled": TrainingCost(
        4.0e-5, "plan_costs.py training vit-digits digits --option objective=distilled",
        "epochs"),
    "ft-transformer": TrainingCost(8.0e-5, "plan_costs.py training ft-transformer breast_cancer,"
                                   " wine", typical=42, cap="max_epochs"),
}
"""Recipe (the preset a model's `source` names, with its RECIPE_OPTIONS: `recipe_key`) -> its
measured training cost, one line each (the digits ViT's objectives, 2026-12-06 on a quiet
machine: dino 207.9 CPU-s, distilled 52.1 with its convnet teacher, seed 0, 40 epochs):
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
    return json.dumps([spec.name, spec.seed, _training_options(spec.family, spec.options),
                       model.dataset.to_dict()],
                      sort_keys=True, default=str)


def _run(models: list[ModelPlan], rows: int) -> TrainingRun:
    """The run of `models` (checkpoints first, the trained model last: it names the run)."""
    model = models[-1]
    names = (model.name, *(m.name for m in models[:-1]))
    recipe = recipe_key(model.spec.name, model.spec.options)
    cost = TRAINING_COSTS.get(recipe)
    if cost is None:
        return TrainingRun(names, recipe, rows, model.t_max, None, None)
    options = model.spec.options
    epochs = int(options[cost.epochs]) if cost.epochs else min(
        int(cost.typical or 0), int(options.get(cost.cap, cost.typical or 0)))
    note = "" if cost.epochs else f" (early stopping: {epochs} epochs, the measured median)"
    if _differs_from_recipe(model):
        note += "; its options differ from the measured recipe's: a rougher estimate"
    return TrainingRun(names, recipe, rows, model.t_max, epochs,
                       cost.seconds * rows * model.t_max * epochs, note)


EPOCH_OPTIONS = ("epochs", "max_epochs", "patience")
"""Training options the cost scales with (epochs) or that only end it sooner."""


RECIPE_OPTIONS = {"objective": "supervised"}
"""Training options that make a recipe of their own (a TRAINING_COSTS line each: `recipe_key`),
with the value a spec without the option trains by."""


def recipe_key(name: str, options: dict[str, Any]) -> str:
    """The TRAINING_COSTS key of a preset trained with `options`: the preset's name, then each
    RECIPE_OPTIONS option it sets other than its default ('vit-digits objective=dino')."""
    defaults = {**RECIPE_OPTIONS, **resolve_model(name).options}
    named = [f"{k}={options[k]}" for k in RECIPE_OPTIONS
             if options.get(k) is not None and options[k] != defaults[k]]
    return " ".join([name, *named])


def _differs_from_recipe(model: ModelPlan) -> bool:
    """Whether `model`'s training options, epochs and recipe options aside, differ from its
    recipe's defaults."""
    spec = model.spec
    mine, recipe = (
        {k: v for k, v in _training_options(spec.family, options).items()
         if k not in EPOCH_OPTIONS and k not in RECIPE_OPTIONS}
        for options in (spec.options, resolve_model(spec.name).options))
    return mine != recipe


def _training_options(family: str, options: dict[str, Any]) -> dict[str, Any]:
    """The options that determine a trained family's training (its checkpoint key's)."""
    module = importlib.import_module(OPTION_MODULES[family])
    return training_options(options, getattr(module, "MEASUREMENT_ONLY", MEASUREMENT_ONLY))


def null_trial_seconds(n: float) -> float:
    """Predicted CPU-s of one null trial of size n (module doc)."""
    return (NULL_CONSTANTS["NULL_TRIAL_S"][0] + NULL_CONSTANTS["NULL_ELEMENT_S"][0] * n**2
            + _c("CHECK_S") * n**3 / 2)


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
    fixed = 0.0 if not any(left.values()) else _c("WORKER_START_S") + \
        _c("MODEL_LOAD_S") * loads / max(pools.extract_slots, 1)
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
                     f"(sweep/driver/balance.py TRAINING_COSTS, measured):")
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


# --- one GPU worker's pace ----------------------------------------------------------------------
@dataclass(frozen=True)
class Pace:
    """Inputs per second one extraction worker of `cores` threads is predicted to extract of a
    model: its pipeline (`workers.tasks.pipeline`) keeps the device busy while the host's work
    per input, spread over the cores, takes less than the device's; within one task only, so a
    task's first load and last write overlap nothing (`batches` per task amortise them)."""

    model: str
    inputs_s: float
    device_s: float  # seconds per input on the device: the forward pass (and rollout)
    host_s: float  # CPU-seconds per input outside the forward pass
    cores: int
    store_bytes_s: float  # attention bytes per second the store must take at that pace
    estimates: tuple[str, ...]
    batches: int = 1  # batches per extraction task (a shard's inputs over the batch size)
    steady_s: float = 0.0  # seconds per input with the pipeline full (0: no pipeline, 1 core)

    @property
    def limit(self) -> str:
        """What sets the pace: the device, or the host's cores."""
        return "device" if self.device_s * self.cores >= self.host_s else f"{self.cores} core(s)"

    @property
    def kept(self) -> float:
        """The share of the full pipeline's pace a task keeps (1.0 without a pipeline)."""
        return self.steady_s * self.inputs_s if self.steady_s else 1.0


FEW_BATCHES = 4  # fewer batches per task than this: `sweep plan --cluster` warns


def worker_pace(model: ModelPlan, cores: int, gpu: bool = True) -> Pace:
    """`model`'s pace on one extraction worker of `cores` threads (a GPU worker, or a CPU
    worker where `gpu` is False): pipelined, max(device s, host CPU-s / cores) per input plus,
    per task of B batches, one batch's host work on the cores (its first load and last write,
    which overlap nothing): host CPU-s / (cores B) per input; 1 / (device s + host CPU-s) on one
    core; CONSTANTS' estimates named."""
    tokens = mean_tokens_cubed(model) ** (1.0 / 3.0)
    forward = "GPU_FORWARD_LAYER_TOKEN_S" if gpu else "CPU_LAYER_TOKEN_S"
    device = _c(forward) * model.n_layers * tokens
    used = [forward]
    if model.rollout_device == "extraction":
        products, kappas = rollout_pair_elements(model)
        device += (products + kappas) * _c("GPU_ROLLOUT_S") if gpu else \
            products * _c("PRODUCTS_S") + kappas * _c("ROLLOUT_KAPPA_S")
        used.append("GPU_ROLLOUT_S" if gpu else "PRODUCTS_S")
    per_input = "HOST_IMAGE_S" if model.spec.modality == "image" else "HOST_TEXT_S"
    host = _c(per_input) + _c("HOST_BYTE_S") * model.input_bytes
    used += [per_input, "HOST_BYTE_S"]
    batches = math.ceil(min(model.shard_size, model.n_inputs) / model.batch_size)
    steady = max(device, host / cores) if cores > 1 else 0.0
    seconds = steady + host / (cores * batches) if cores > 1 else device + host
    estimates = tuple(name for name in used if CONSTANTS[name].estimate)
    return Pace(model.name, 1.0 / seconds, device, host, cores,
                model.input_bytes / seconds, estimates, batches, steady)


def extraction_cores(cfg: ClusterConfig | None, cpu_count: int | None = None,
                     devices: list[int] | None = None) -> int | None:
    """The threads of one extraction worker `cfg` starts (the fewest, where pools differ);
    None for an existing cluster (`address`: its workers are its own)."""
    shapes = None if cfg is None else pool_shapes(cfg, cpu_count, devices)
    if not shapes:
        return None
    threads = [s.threads for s in shapes.values() if s.resources.get("GPU")]
    return min(threads) if threads else None


def pace_lines(plan: SweepPlan, pools: Pools | None, cores: int | None) -> list[str]:
    """Per model: inputs/s one extraction worker of `cores` threads is predicted to extract,
    what sets it, and the attention bytes/s the store must take at that pace (also under
    `attention: drop` or `{sample: N}`, which write every input's attention and delete it
    once tested)."""
    gpu = pools is None or pools.gpus > 0
    shown = cores or 1
    worker = "GPU worker" if gpu else "extraction worker (no GPU: the forward pass on its CPU)"
    width = max([20, *(len(model.name) for model in plan.models)])
    lines = [f"pace of one {worker} of {shown} thread(s){'' if cores else ' (unknown here)'} "
             f"(predicted: sweep/driver/balance.py CONSTANTS):",
             f"{'model':<{width}} {'inputs/s':>9} {'device s/input':>15} "
             f"{'host CPU-s/input':>17} {'limit':>10} {'batches/task':>13} "
             f"{'store must take':>16}"]
    estimated: dict[str, None] = {}
    few = []
    for model in plan.models:
        pace = worker_pace(model, shown, gpu)
        estimated.update(dict.fromkeys(pace.estimates))
        lines.append(f"{model.name:<{width}} {pace.inputs_s:>9.3g} {pace.device_s:>15.3g} "
                     f"{pace.host_s:>17.3g} {pace.limit:>10} {pace.batches:>13} "
                     f"{_rate(pace.store_bytes_s):>16}")
        if shown > 1 and pace.batches < FEW_BATCHES and model.n_inputs > model.shard_size:
            few.append((model, pace))
    rests = f"estimated: {', '.join(estimated)}" if estimated else "no estimated constant"
    lines.append(f"the store must take the attention bytes at that pace (drop and sample write "
                 f"them too, then delete them); a slower store sets the pace; {rests}")
    for model, pace in few:
        lines.append(
            f"WARNING: {model.name}: {pace.batches} batch(es) per extraction task (shard_size "
            f"{model.shard_size}, batch_size {model.batch_size}): a task's first load and last "
            f"write overlap nothing, so it keeps about {pace.kept:.0%} of the pipeline's pace; "
            f"shard_size >= {FEW_BATCHES * model.batch_size} amortises them")
    return lines


def pace_data(plan: SweepPlan, pools: Pools | None, cores: int | None) -> dict[str, object]:
    """`pace_lines` as data: per model, inputs/s, seconds per input on the device and the
    host, bytes/s to the store, what limits it and the estimated constants it rests on."""
    gpu = pools is None or pools.gpus > 0
    out = {}
    for model in plan.models:
        pace = worker_pace(model, cores or 1, gpu)
        out[model.name] = {"inputs_per_s": pace.inputs_s, "device_s_per_input": pace.device_s,
                           "host_cpu_s_per_input": pace.host_s, "cores": pace.cores,
                           "store_bytes_per_s": pace.store_bytes_s, "limit": pace.limit,
                           "batches_per_task": pace.batches, "kept": pace.kept,
                           "estimated": list(pace.estimates)}
    return {"gpu": gpu, "cores": cores, "models": out}


def _rate(bytes_s: float) -> str:
    for unit in ("B/s", "KB/s", "MB/s", "GB/s"):
        if bytes_s < 1000 or unit == "GB/s":
            return f"{bytes_s:.3g} {unit}"
        bytes_s /= 1000
    raise AssertionError("unreachable")

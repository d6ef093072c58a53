"""The plan is data: config + measured facts -> frozen task specs with deterministic keys.

Pure: no I/O, no Dask. Inputs split into contiguous shards of `shard_size` in dataset order;
per model that needs it (FT-Transformer: training) a preparation task (GPU pool) that its
extractions depend on; per (model, shard) an extraction task (GPU pool) and a test task (CPU
pool) that depends on it; per (baseline null, size, trial chunk) a baseline task (CPU pool); per
(model, null, trial chunk) a size-matched null task (CPU pool) that depends on all of the model's
test tasks. The task specs themselves live with the code that runs them
(`workers.task_specs`, run by `workers.tasks`). `sweep.driver.runner` gathers the facts and
interprets the plan; `sweep plan` prints it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from storage.attention import AttentionPolicy
from storage.errors import InputError
from storage.fingerprint import fingerprint
from storage.layout import head_labels
from storage.location import StoreRef
from sweep.config.checkpoints import CHECKPOINT_NAME
from sweep.config.schema import SweepConfig
from workers.exact.equality import row_sum_tolerance
from workers.inputs import DatasetSpec
from workers.models.registry import ModelSpec, resolve_model
from workers.models.tiny_text import fingerprint_entry
from workers.models.token_layout import needs_preparation
from workers.nulls.baseline import BlockSpan, chunk_span
from workers.nulls.registry import resolve_nulls
from workers.task_specs import (
    BaselineTask,
    ExtractTask,
    NullTask,
    PrepareTask,
    Task,
    TestTask,
    baseline_index,
)

ATTENTION_ITEMSIZE = 4  # float32
MAX_PLAN_TASKS = 200_000  # tasks one sweep plans: 200,460 took 1.5 s and 69 MB to plan


@dataclass(frozen=True)
class ModelFacts:
    """What sizing a model's store needs, measured without a forward pass."""

    input_ids: tuple[str, ...]
    n_layers: int
    t_max: int  # most real tokens of any input
    cube_sum: int  # sum over inputs of T^3 // 2: pair-elements of one layer's test
    n_heads: int = 1  # maps the store keeps per layer: 1 (head-averaged), or the model's heads
    head_dim: int | None = None  # each head's query/key width (the `qk-head` null's d)
    width: int | None = None  # the model's width (heads x head_dim): what extraction costs

    @classmethod
    def from_counts(cls, input_ids: tuple[str, ...], n_layers: int,
                    token_counts: list[int] | tuple[int, ...], n_heads: int = 1,
                    head_dim: int | None = None, width: int | None = None) -> ModelFacts:
        """Facts from each input's real token count."""
        return cls(input_ids, n_layers, max(token_counts), sum(t**3 // 2 for t in token_counts),
                   n_heads, head_dim, width)


class Fingerprinted:
    """A plan part whose `fingerprint` hashes what determines its results (`fingerprint_inputs`)."""

    def fingerprint_inputs(self) -> dict[str, Any]:
        raise NotImplementedError

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.fingerprint_inputs())


class ChunkedTrials:
    """Null trials cut into chunks of `chunk_trials` (the dataclass holds both fields)."""

    trials: int
    chunk_trials: int

    @property
    def n_chunks(self) -> int:
        return -(-self.trials // self.chunk_trials)

    def chunk_blocks(self, chunk: int) -> BlockSpan:
        """The (block index, trials) blocks of `chunk`, lazily, in O(1)."""
        return chunk_span(self.trials, self.chunk_trials, chunk)


# Fingerprint inputs left out when they hold these defaults, so stores made before the key was
# fingerprinted keep their fingerprint; `with_defaults` shows them in refusals.
OMITTED_DEFAULTS: dict[str, Any] = {"rollout": "every", "batch_size": 8, "device": "auto",
                                     "rollout_device": "test"}


def device_kind(device: str) -> str:
    """What of a `device` setting changes stored values: its kind (`cuda:1` -> `cuda`); `auto`
    as written (the workers resolve it)."""
    return device.split(":", 1)[0]


def config_inputs(spec: ModelSpec, dataset: DatasetSpec, shard_size: int,
                  token_sets: tuple[str, ...], tol: float, dtype: str,
                  rollout: str, batch_size: int = 8, device: str = "auto",
                  rollout_device: str = "test") -> dict[str, Any]:
    """The part of a model's fingerprint inputs that the config alone decides: the one owner of
    these keys, for the plan and for the refusals decided before the lock. The batch size and
    the device kind change a model's attention in its last float bits (padding, kernels); a tiny
    text model's tokenizer is the digest of its shipped vocabulary
    (`workers.models.tiny_text.fingerprint_entry`)."""
    optional = {"rollout": rollout, "batch_size": batch_size, "device": device_kind(device),
                "rollout_device": rollout_device}
    return {
        "model": spec.to_dict(),
        **fingerprint_entry(spec.pretrained, spec.modality, spec.source),
        "dataset": dataset.to_dict(),
        "shard_size": shard_size,
        "token_sets": list(token_sets),
        "tol": tol,
        "dtype": dtype,
        **{key: value for key, value in optional.items() if value != OMITTED_DEFAULTS[key]},
    }


def with_defaults(inputs: dict[str, Any]) -> dict[str, Any]:
    """`inputs` with the defaults `config_inputs` leaves out filled in (for messages)."""
    return {**OMITTED_DEFAULTS, **inputs}


def model_config_inputs(config: SweepConfig, name: str) -> dict[str, Any]:
    """`config_inputs` of model `name` of `config` (no facts needed)."""
    entry = config.models[name]
    return config_inputs(resolve_model(entry.source, **entry.options),
                         config.datasets[entry.dataset].to_spec(), config.shard_size,
                         config.token_sets, config.tol, config.model_setting(name, "dtype"),
                         config.rollout, config.model_setting(name, "batch_size"),
                         config.model_setting(name, "device"), config.rollout_device)


@dataclass(frozen=True)
class ModelPlan(Fingerprinted):
    """One model's slice of the sweep: its specs, sizes and shards."""

    name: str
    spec: ModelSpec
    dataset: DatasetSpec
    dataset_name: str
    n_inputs: int
    n_layers: int
    t_max: int
    shard_size: int
    token_sets: tuple[str, ...]
    tol: float
    dtype: str
    batch_size: int
    device: str
    ids_sha256: str
    work: int  # pair-elements of the test: sum over inputs, layers, heads, sets of T^3 / 2 (bound)
    cube_sum: int
    rollout: str = "every"  # workers.exact.equality.ROLLOUT_MODES
    n_heads: int = 1  # maps kept per layer: 1 (spec.heads mean), or the model's heads (each)
    attention: AttentionPolicy = AttentionPolicy()  # not a fingerprint input: results equal
    kept: frozenset[int] | None = None  # inputs whose attention stays (None: all)
    head_dim: int | None = None  # each head's query/key width: not a fingerprint input
    rollout_device: str = "test"  # where the rollout's products run: test (CPU) or extraction
    width: int | None = None  # heads x head_dim (None: unknown): not a fingerprint input

    @property
    def heads(self) -> list[str]:
        """The store's `head` coordinate (`storage.layout.head_labels`)."""
        return head_labels(self.spec.heads, self.n_heads)

    @property
    def n_shards(self) -> int:
        return math.ceil(self.n_inputs / self.shard_size)

    def shard_range(self, shard: int) -> tuple[int, int]:
        """[start, stop) of the inputs in `shard`."""
        start = shard * self.shard_size
        return start, min(start + self.shard_size, self.n_inputs)

    def fingerprint_inputs(self) -> dict[str, Any]:
        """Everything that determines this model's stored values: what the config decides
        (`config_inputs`, the batch size and device kind included) and what the inputs are."""
        return {
            **config_inputs(self.spec, self.dataset, self.shard_size, self.token_sets, self.tol,
                            self.dtype, self.rollout, self.batch_size, self.device,
                            self.rollout_device),
            "input_ids_sha256": self.ids_sha256,
            "n_inputs": self.n_inputs,
            "n_layers": self.n_layers,
            "t_max": self.t_max,
        }

    @property
    def input_bytes(self) -> int:
        """Uncompressed size of one input's padded attention (every layer and stored head)."""
        return self.n_layers * self.n_heads * self.t_max**2 * ATTENTION_ITEMSIZE

    @property
    def attention_bytes(self) -> int:
        """Uncompressed size of the padded attention array."""
        return self.n_inputs * self.input_bytes

    def dropped_after_test(self, shard: int) -> tuple[int, ...]:
        """Inputs of `shard` whose attention its test task deletes (the policy's complement)."""
        start, stop = self.shard_range(shard)
        if self.kept is None:
            return ()
        return tuple(i for i in range(start, stop) if i not in self.kept)

    def peak_attention_bytes(self, in_flight: int) -> int:
        """Most attention bytes the policy lets the store hold at once with `in_flight` shards
        extracted and not yet tested: the kept inputs plus those shards' (at most the total)."""
        if self.kept is None:
            return self.attention_bytes
        flight = min(self.n_inputs, in_flight * self.shard_size)
        return min(self.n_inputs, len(self.kept) + flight) * self.input_bytes


@dataclass(frozen=True)
class BaselinePlan(ChunkedTrials, Fingerprinted):
    """The config-size baseline: `trials` per null and size, cut into chunks of `chunk_trials`."""

    sizes: tuple[int, ...]
    trials: int
    seed: int
    chunk_trials: int  # a multiple of workers.nulls.baseline.BLOCK
    tol: float
    nulls: tuple[str, ...] = ("uniform",)

    def fingerprint_inputs(self) -> dict[str, Any]:
        return {
            "sizes": list(self.sizes),
            "trials": self.trials,
            "seed": self.seed,
            "chunk_trials": self.chunk_trials,
            "tol": self.tol,
            "nulls": list(self.nulls),
        }

    @property
    def work(self) -> int:
        """Pair-elements of the test over all trials (n^3 / 2 per matrix)."""
        return len(self.nulls) * sum(self.trials * n**3 // 2 for n in self.sizes)


@dataclass(frozen=True)
class MatchedNullsPlan(ChunkedTrials, Fingerprinted):
    """Size-matched nulls: per model, token set and null, `trials` draws at the model's sizes."""

    nulls: tuple[str, ...]
    trials: int
    seed: int
    chunk_trials: int  # a multiple of workers.nulls.baseline.BLOCK
    tol: float

    def fingerprint_inputs(self) -> dict[str, Any]:
        return {"nulls": list(self.nulls), "trials": self.trials, "seed": self.seed,
                "chunk_trials": self.chunk_trials, "tol": self.tol}

    def model_nulls(self, model: ModelPlan) -> tuple[str, ...]:
        """The nulls `model` gets: `qk-head[-b<beta>]` resolved to `qk-d<its head_dim>`
        (`workers.nulls.registry.resolve_nulls`), the names its store and report carry."""
        return resolve_nulls(self.nulls, model.head_dim, model.name)


@dataclass(frozen=True)
class SweepPlan:
    """The whole sweep as data: per-model plans, the baseline plan and every task."""

    config: SweepConfig
    models: tuple[ModelPlan, ...]
    baseline: BaselinePlan | None
    tasks: tuple[Task, ...]
    matched_nulls: MatchedNullsPlan | None = None

    def depends_on(self, task: Task) -> tuple[str, ...]:
        """Keys of the tasks `task` must wait for, possibly none: a test waits for its shard's
        extraction, an extraction for its model's preparation (when the model has one), the
        preparation of a checkpoint model (`<name>@epoch<k>`) for its trained model's (their
        one training run: trained once, then found in the cache), a size-matched null task for
        every test task of its model."""
        if isinstance(task, TestTask):
            return (extract_key(task.model, task.shard),)
        if isinstance(task, PrepareTask):
            match = CHECKPOINT_NAME.match(task.model)
            trained = match and match["epoch"] is not None and prepare_key(match["model"])
            return (trained,) if trained in self._prepare_keys else ()
        if isinstance(task, ExtractTask) and prepare_key(task.model) in self._prepare_keys:
            return (prepare_key(task.model),)
        if isinstance(task, NullTask):
            model = next(m for m in self.models if m.name == task.model)
            return tuple(test_key(model.name, shard) for shard in range(model.n_shards))
        return ()

    @cached_property
    def _prepare_keys(self) -> frozenset[str]:
        return frozenset(t.key for t in self.tasks if isinstance(t, PrepareTask))


def prepare_key(model: str) -> str:
    return f"prepare-{model}"


def extract_key(model: str, shard: int) -> str:
    return f"extract-{model}-{shard:05d}"


def test_key(model: str, shard: int) -> str:
    return f"test-{model}-{shard:05d}"


def baseline_key(n: int, chunk: int, null: str = "uniform") -> str:
    return f"baseline-{baseline_index(null, n, chunk)}"


def null_key(model: str, null: str, chunk: int) -> str:
    return f"nulls-{model}-{null}-c{chunk:05d}"


def model_plan(config: SweepConfig, name: str, facts: ModelFacts) -> ModelPlan:
    """Size one model from its facts (ids, layers, token counts)."""
    entry = config.models[name]
    spec = resolve_model(entry.source, **entry.options)
    work = len(config.token_sets) * facts.n_layers * facts.n_heads * facts.cube_sum
    policy = config.attention_policy(name)
    return ModelPlan(
        name=name,
        spec=spec,
        dataset=config.datasets[entry.dataset].to_spec(),
        dataset_name=entry.dataset,
        n_inputs=len(facts.input_ids),
        n_layers=facts.n_layers,
        t_max=facts.t_max,
        shard_size=config.shard_size,
        token_sets=config.token_sets,
        tol=config.tol,
        dtype=config.model_setting(name, "dtype"),
        batch_size=config.model_setting(name, "batch_size"),
        device=config.model_setting(name, "device"),
        ids_sha256=fingerprint(list(facts.input_ids)),
        work=work,
        cube_sum=facts.cube_sum,
        rollout=config.rollout,
        rollout_device=config.rollout_device,
        n_heads=facts.n_heads,
        attention=policy,
        kept=None if policy.mode == "keep" else policy.kept(name, facts.input_ids),
        head_dim=facts.head_dim,
        width=facts.width,
    )


def _model_tasks(config: SweepConfig, plan: ModelPlan) -> list[Task]:
    store, cache = config.store_ref, config.checkpoint_dir
    tasks: list[Task] = []
    if needs_preparation(plan.spec):
        tasks.append(PrepareTask(prepare_key(plan.name), store, plan.name, plan.spec,
                                 plan.dataset, cache))
    for shard in range(plan.n_shards):
        start, stop = plan.shard_range(shard)
        on_device = plan.rollout_device == "extraction"
        tasks.append(ExtractTask(
            extract_key(plan.name, shard), store, plan.name, shard, start, stop, plan.spec,
            plan.dataset, plan.batch_size, plan.device, plan.dtype, cache,
            device_rollout=plan.rollout if on_device else "off",
        ))
        tasks.append(TestTask(
            test_key(plan.name, shard), store, plan.name, shard, start, stop, plan.token_sets,
            plan.tol, plan.rollout, plan.dropped_after_test(shard),
            row_sum_tolerance(plan.dtype), device_rollout=on_device,
        ))
    return tasks


def _baseline_tasks(store: StoreRef, plan: BaselinePlan) -> list[Task]:
    tasks: list[Task] = []
    for null_index, null in enumerate(plan.nulls):
        for index, n in enumerate(plan.sizes):
            for chunk in range(plan.n_chunks):
                tasks.append(BaselineTask(
                    baseline_key(n, chunk, null), store, index, n, chunk,
                    plan.chunk_blocks(chunk), plan.seed, plan.tol, null, null_index,
                ))
    return tasks


def _null_tasks(store: StoreRef, model: ModelPlan, plan: MatchedNullsPlan) -> list[Task]:
    return [
        NullTask(null_key(model.name, null, chunk), store, model.name, null, null_index,
                 chunk, plan.chunk_blocks(chunk), model.token_sets, plan.seed, plan.tol)
        for null_index, null in enumerate(plan.model_nulls(model))
        for chunk in range(plan.n_chunks)
    ]


def baseline_plan(config: SweepConfig) -> BaselinePlan | None:
    """The configured config-size baseline (None without one): the one owner of its
    fingerprint inputs, for the plan and for the refusals decided before the lock."""
    if config.baseline is None:
        return None
    b = config.baseline
    return BaselinePlan(tuple(b.sizes), b.trials, b.seed, b.chunk_trials, config.tol,
                        tuple(b.nulls))


def _shard_count(n_inputs: int, shard_size: int) -> int:
    return -(-n_inputs // shard_size)


def check_plan_size(config: SweepConfig, n_inputs: dict[str, int]) -> int:
    """The number of tasks the sweep plans for its models' input counts (`n_inputs`: model ->
    inputs), before any task spec exists; InputError naming the count, MAX_PLAN_TASKS and what
    to change if it is larger (the driver and the scheduler hold every task in memory)."""
    trained = sum(needs_preparation(resolve_model(config.models[name].source,
                                                  **config.models[name].options))
                  for name in n_inputs)
    shards = sum(_shard_count(n, config.shard_size) for n in n_inputs.values())
    other = trained
    if config.baseline is not None:
        b = config.baseline
        other += len(b.sizes) * len(b.nulls) * -(-b.trials // b.chunk_trials)
    if config.matched_nulls is not None:
        m = config.matched_nulls
        other += len(n_inputs) * len(m.nulls) * -(-m.trials // m.chunk_trials)
    total = other + 2 * shards
    if total <= MAX_PLAN_TASKS:
        return total
    fixes = ["split the models over several sweep configs"]
    if other > trained:
        fixes.insert(0, "raise chunk_trials")
    room = MAX_PLAN_TASKS - other
    if 2 * len(n_inputs) <= room:
        size = max(config.shard_size, -(-2 * sum(n_inputs.values()) // room))
        while other + 2 * sum(_shard_count(n, size) for n in n_inputs.values()) > MAX_PLAN_TASKS:
            size += 1
        fixes.insert(0, f"raise shard_size to at least {size}")
    fix = ", or ".join(fixes)
    raise InputError(
        f"the sweep plans {total} tasks ({2 * shards} extraction and test tasks of "
        f"{config.shard_size} inputs, {other} training and trial-chunk tasks); at most "
        f"{MAX_PLAN_TASKS} (the driver and the scheduler hold every task in memory); {fix}")


def build_plan(config: SweepConfig, facts: dict[str, ModelFacts]) -> SweepPlan:
    """The sweep for the models in `facts` (in config order) and the configured baseline;
    InputError if it has more than MAX_PLAN_TASKS tasks (`check_plan_size`)."""
    check_plan_size(config, {name: len(facts[name].input_ids) for name in config.models
                             if name in facts})
    models = tuple(model_plan(config, name, facts[name]) for name in config.models if name in facts)
    baseline = baseline_plan(config)
    matched = None
    if config.matched_nulls is not None:
        m = config.matched_nulls
        matched = MatchedNullsPlan(tuple(m.nulls), m.trials, m.seed, m.chunk_trials, config.tol)
    tasks: list[Task] = []
    for plan in models:
        tasks.extend(_model_tasks(config, plan))
    if baseline is not None:
        tasks.extend(_baseline_tasks(config.store_ref, baseline))
    if matched is not None:
        for plan in models:
            tasks.extend(_null_tasks(config.store_ref, plan, matched))
    return SweepPlan(config, models, baseline, tuple(tasks), matched)

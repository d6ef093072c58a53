"""Interpret a sweep plan: gather facts, create/extend the store, run what is not done.

The driver holds the store lock from start to end. Tasks write their own data and done markers;
the driver writes failed markers for tasks that kept failing after their retries. Executors run
a list of tasks: `InProcessExecutor` here (plain Python, for tests and debugging) and
`sweep.driver.graph.DaskExecutor`; both pass the same tests.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

from tqdm import tqdm

from storage import markers
from storage.device_pin import forget_device
from storage.layout import NULLS_GROUP, PREPARE_STAGE
from storage.lock import StoreBusyError, StoreLock
from storage.store import (
    consolidate,
    create_root,
    drop_consolidated,
    ensure_baseline,
    ensure_matched_nulls,
    ensure_model,
    matched_nulls_inputs,
    stored_model_attrs,
    write_root_attrs,
)
from sweep.config.schema import SweepConfig
from sweep.driver import compaction
from sweep.driver.bounded import check_attention_change, finish_drops, reextractions
from sweep.driver.freshness import (
    damaged_tasks,
    measured_datasets,
    plan_digests,
    repair_metadata,
    stale_extractions,
    with_digests,
)
from sweep.driver.plan import (
    ExtractTask,
    ModelFacts,
    NullTask,
    SweepPlan,
    Task,
    TestTask,
    build_plan,
    check_plan_size,
)
from sweep.driver.preflight import check_before_lock, check_plan_fits_store
from sweep.driver.training_watch import TrainingWatch
from sweep.driver.weights import ATTR as WEIGHTS_ATTR
from sweep.driver.weights import check_weights, weights_record
from sweep.terminal.faults import EXIT_INTERRUPTED, TASK_FAILURE, classify
from sweep.terminal.interrupts import Interrupted, raise_if_interrupted
from sweep.terminal.progress import LineProgress
from workers.inputs import Dataset, open_dataset
from workers.models.extraction import model_dataset
from workers.models.registry import resolve_model
from workers.models.token_layout import TokenLayout, token_layout
from workers.tasks import run_task

FACT_BATCH = 256  # inputs per token_counts call while sizing


def say(line: str, progress: bool) -> None:
    """One line of what the driver is doing, on stderr, when progress is on and stderr is a
    terminal (logs and captured output keep only results and one-line errors)."""
    if progress and sys.stderr.isatty():
        print(line, file=sys.stderr, flush=True)


def _token_counts(name: str, layout: TokenLayout, dataset: Dataset, progress: bool) -> list[int]:
    """Every input's real tokens: one value for fixed layouts, the tokenizer in batches else
    (a bar on a terminal)."""
    if not layout.per_input:
        return layout.token_counts(range(len(dataset)))
    counts: list[int] = []
    with tqdm(total=len(dataset), desc=f"tokenizing {name}", unit="input", file=sys.stderr,
              disable=None if progress else True, leave=False) as bar:
        for first in range(0, len(dataset), FACT_BATCH):
            items = dataset.load(range(first, min(first + FACT_BATCH, len(dataset))))
            counts.extend(layout.token_counts(items))
            bar.update(len(items))
    return counts


def gather_facts(config: SweepConfig, name: str, *, progress: bool = False,
                 dataset: Dataset | None = None) -> ModelFacts:
    """Input ids, layer count and token counts of one model, from its spec and dataset alone.

    O(1) per model for images and tables (no model built, no weights, no input decoded: see
    `workers.models.token_layout`), one tokenizer pass for text; nothing is trained here (that is
    the model's `PrepareTask`). When the store already holds the model, its sizes come from the
    store. With `progress`, one line on stderr says what was planned. `dataset`: the model's
    measured inputs when the caller has them open (`measured_datasets`).
    """
    entry = config.models[name]
    spec = resolve_model(entry.source, **entry.options)
    if dataset is None:
        dataset = model_dataset(spec, open_dataset(config.datasets[entry.dataset].to_spec()))
    stored = stored_model_attrs(config.store_ref, name)
    if stored is not None:
        head_dim = stored.get("head_dim")  # absent: planned before head_dim, ask the layout
        if head_dim is None:
            head_dim = token_layout(spec, dataset).head_dim
        facts = ModelFacts(tuple(dataset.ids), stored["n_layers"], stored["t_max"],
                           stored["cube_sum"], stored.get("n_heads", 1),  # 1: before heads
                           head_dim)
        say(f"planning {name}: {len(dataset)} inputs, T_max {facts.t_max}, {facts.n_layers} "
            "layers (from the store)", progress)
        return facts
    layout = token_layout(spec, dataset)
    counts = _token_counts(name, layout, dataset, progress)
    facts = ModelFacts.from_counts(tuple(dataset.ids), layout.n_layers, counts,
                                   layout.n_heads if spec.heads == "each" else 1, layout.head_dim,
                                   None if layout.head_dim is None else
                                   layout.n_heads * layout.head_dim)
    tokens = f"{facts.t_max} tokens" if not layout.per_input else \
        f"{min(counts)}-{facts.t_max} tokens"
    say(f"planning {name}: {len(dataset)} inputs, {tokens}, {facts.n_layers} layers", progress)
    return facts


def sized_plan(config: SweepConfig, *, progress: bool = False
               ) -> tuple[SweepPlan, dict[str, ModelFacts], dict[str, Dataset]]:
    """The plan, every model's facts and dataset, nothing written (`sweep plan`; `materialise`
    before it creates anything), refused as a run refuses it: a dataset that cannot be read
    (one line, once), more tasks than one plans, a model that cannot be sized, a planned group
    the store holds with another fingerprint (`check_plan_fits_store`, all groups at once)."""
    datasets = measured_datasets(config)
    check_plan_size(config, {name: len(dataset) for name, dataset in datasets.items()})
    facts = {name: gather_facts(config, name, progress=progress, dataset=datasets[name])
             for name in config.models}
    plan = build_plan(config, facts)
    planned = {model.name: model.fingerprint_inputs() for model in plan.models}
    if plan.baseline is not None:
        planned["baseline"] = plan.baseline.fingerprint_inputs()
    if plan.matched_nulls is not None:
        m = plan.matched_nulls
        for model in plan.models:
            planned[f"{model.name}/{NULLS_GROUP}"] = matched_nulls_inputs(
                nulls=m.model_nulls(model), token_sets=model.token_sets, trials=m.trials,
                seed=m.seed, chunk_trials=m.chunk_trials, tol=m.tol)
    check_plan_fits_store(config.store_ref, planned)  # all groups, before any is created
    return plan, facts, datasets


def materialise(config: SweepConfig, *, progress: bool = False) -> SweepPlan:
    """Plan the sweep and create (or extend, or check) its store. Call with the lock held.

    Runs before any task: the store's arrays, fingerprints and refusals are all decided here.
    """
    say(f"sweep: planning {len(config.models)} models into {config.store}", progress)
    plan, facts, datasets = sized_plan(config, progress=progress)
    plan = with_digests(plan, plan_digests(config, datasets))
    root = create_root(config.store_ref, list(config.models))  # writes nothing to a store
    # that exists
    repair_metadata(root, plan, {name: f.input_ids for name, f in facts.items()})
    weights = {}
    for model in plan.models:  # local weights overwritten in place: refused before any write
        group = root[model.name] if model.name in root else None
        stored = group.attrs.get(WEIGHTS_ATTR) if group is not None and \
            "fingerprint" in group.attrs else None
        weights[model.name] = weights_record(model.spec, stored)
        check_weights(config.store, model.name, stored, weights[model.name])
    drop_consolidated(config.store_ref)  # refusals done: no stale copy while this run writes
    for model in plan.models:
        if ensure_model(
            root, model.name, input_ids=facts[model.name].input_ids, n_layers=model.n_layers,
            t_max=model.t_max, shard_size=model.shard_size, token_sets=model.token_sets,
            attrs={"source": model.spec.name, "dataset": model.dataset_name,
                   "model_spec": model.spec.to_dict(), "dataset_spec": model.dataset.to_dict(),
                   "cube_sum": model.cube_sum},
            fingerprint_inputs=model.fingerprint_inputs(), heads=model.heads,
            device_rollout=model.rollout_device == "extraction",
        ):
            forget_device(config.store_ref, model.name)  # a pin left by a deleted group
            markers.clear(config.store_ref, model.name, PREPARE_STAGE)  # its training record
        if weights[model.name] and root[model.name].attrs.get(WEIGHTS_ATTR) != weights[model.name]:
            root[model.name].attrs[WEIGHTS_ATTR] = weights[model.name]
        if root[model.name].attrs.get("attention") != model.attention.to_json():
            root[model.name].attrs["attention"] = model.attention.to_json()
        if model.head_dim is not None and root[model.name].attrs.get("head_dim") is None:
            root[model.name].attrs["head_dim"] = model.head_dim  # also on stores planned before
    if plan.baseline is not None:
        b = plan.baseline
        ensure_baseline(root, sizes=b.sizes, trials=b.trials, seed=b.seed,
                        chunk_trials=b.chunk_trials, n_chunks=b.n_chunks, tol=b.tol,
                        nulls=b.nulls)
    if plan.matched_nulls is not None:
        m = plan.matched_nulls
        for model in plan.models:
            ensure_matched_nulls(root, model.name, nulls=m.model_nulls(model),
                                 token_sets=model.token_sets,
                                 trials=m.trials, seed=m.seed, chunk_trials=m.chunk_trials,
                                 n_chunks=m.n_chunks, tol=m.tol)
    write_root_attrs(root, config.resolved())
    return plan


def pending_tasks(plan: SweepPlan, *, verify: bool = False,
                  reextract: bool = False) -> list[Task]:
    """Tasks without a done marker, in plan order. A shard whose extraction reruns also reruns
    its test (its done marker is cleared: the data it vouched for is about to be rewritten), and
    a model whose tests rerun reruns its size-matched nulls (drawn at the tested sizes).
    Done tasks whose inputs changed or whose chunks are damaged (`sweep.driver.freshness`) rerun;
    `verify` re-hashes every done chunk instead of those whose size or version changed. A
    shard whose test reruns but whose attention was dropped re-extracts first, and so does one
    whose dropped attention the policy now keeps when `reextract` (`sweep.driver.bounded`). The
    store's markers are listed once (`storage.markers.MarkerIndex`)."""
    index = markers.MarkerIndex(plan.config.store_ref)
    for task in [*stale_extractions(plan, index), *damaged_tasks(plan, verify=verify,
                                                                  index=index)]:
        index.clear(task.scope, task.marker)
    for task in reextractions(plan, index, reextract=reextract):
        index.clear(task.scope, task.marker)

    def done(task: Task) -> bool:
        return index.done(task.scope, task.marker)

    redo = {(t.model, t.shard) for t in plan.tasks if isinstance(t, ExtractTask) and not done(t)}
    retested = {t.model for t in plan.tasks
                if isinstance(t, TestTask) and ((t.model, t.shard) in redo or not done(t))}
    pending = []
    for task in plan.tasks:
        if isinstance(task, TestTask) and (task.model, task.shard) in redo and done(task):
            index.clear(task.scope, task.marker)
        if isinstance(task, NullTask) and task.model in retested and done(task):
            index.clear(task.scope, task.marker)
        if not done(task):
            pending.append(task)
    return pending


def error_line(error: BaseException) -> str:
    """`Type: message` on one line."""
    return f"{type(error).__name__}: {' '.join(str(error).split())}"


def failure_text(error: BaseException) -> str:
    """What a failed marker holds: `error_line(error)` first, then the full traceback."""
    trace = "".join(traceback.format_exception(error)).rstrip()
    return f"{error_line(error)}\n{trace}"


def naming_the_store(error: BaseException, store: str) -> BaseException:
    """A failed task's exception as `sweep.cli.entry.main` reports it: an OSError that names no path
    (a write deep inside zarr or a codec) names the store the task was writing to."""
    if isinstance(error, OSError) and error.filename is None and error.errno is not None:
        named = OSError(error.errno, error.strerror or str(error), str(store))
        named.__cause__ = error
        return named
    return error


@dataclass
class RunSummary:
    """What one run did: tasks completed, skipped as already done, failed (with errors), blocked;
    `raised`: the exception of each failed task, where the executor kept it."""

    completed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    blocked: list[str] = field(default_factory=list)
    raised: dict[str, BaseException] = field(default_factory=dict, repr=False, compare=False)

    def fault(self) -> BaseException | None:
        """The first failed task's exception that `sweep.terminal.faults.classify` reports in one
        line (bad input, the environment, a damaged store or checkpoint, a model without attention),
        or None: the run then ends with the summary and exit code 1."""
        for key in self.failed:
            fault = classify(self.raised[key]) if key in self.raised else None
            if fault is not None and fault[0] != EXIT_INTERRUPTED:
                return self.raised[key]
        return None

    @property
    def exit_code(self) -> int:
        return 1 if self.failed or self.blocked else 0

    def lines(self) -> list[str]:
        """A human summary, one line per failure (its `Type: message` line)."""
        out = [f"{len(self.completed)} tasks completed, {len(self.skipped)} already done, "
               f"{len(self.failed)} failed, {len(self.blocked)} blocked by a failure"]
        out += [f"  failed {key}: {error.splitlines()[0] if error else ''}"
                for key, error in sorted(self.failed.items())]
        return out


class Executor(Protocol):
    """Runs tasks; returns per key None (success) or the error line, and the blocked keys. An
    executor may keep `errors` (key -> exception of a failed task): `RunSummary.fault`."""

    def execute(self, plan: SweepPlan, tasks: list[Task], retries: int,
                progress: bool) -> tuple[dict[str, str | None], list[str]]: ...


class InProcessExecutor:
    """Plain Python: tasks in plan order in this process, each retried `retries` times.

    With `reraise`, the first task that keeps failing stops the run: `execute_plan` records its
    failed marker, then re-raises the task's own exception (with its traceback) for debugging.
    With `progress`, a line per task and, while a model trains, a progress line every 30 s
    naming it (`sweep.driver.training_watch`).
    """

    def __init__(self, *, reraise: bool = False) -> None:
        self.reraise = reraise
        self.raised: tuple[str, BaseException] | None = None
        self.errors: dict[str, BaseException] = {}  # key -> the last error of a failed task

    def execute(self, plan: SweepPlan, tasks: list[Task], retries: int,
                progress: bool) -> tuple[dict[str, str | None], list[str]]:
        training = {t.key: t.model for t in tasks if t.stage == PREPARE_STAGE}
        if not (progress and training):
            return self._execute(plan, tasks, retries, progress, None)
        watch = TrainingWatch(plan.config.store_ref, training.values())
        line = LineProgress(len(tasks), "sweep", "task", sys.stderr, heartbeat=True,
                            note=watch.note, training_total=len(training))
        try:  # a line every 30 s while a task trains, as a batch log gets from a cluster's run
            return self._execute(plan, tasks, retries, progress, (line, watch, training))
        finally:
            line.close(final=False)

    def _execute(self, plan: SweepPlan, tasks: list[Task], retries: int, progress: bool,
                 watched: tuple | None) -> tuple[dict[str, str | None], list[str]]:
        outcomes: dict[str, str | None] = {}
        blocked: list[str] = []
        stopped: set[str] = set()  # failed or blocked: what depends on them is blocked too
        for task in tasks:
            raise_if_interrupted()  # a Ctrl-C that a compiler callback swallowed
            if any(dependency in stopped for dependency in plan.depends_on(task)):
                blocked.append(task.key)
                stopped.add(task.key)
                continue
            error = self._attempt(task, retries)
            outcomes[task.key] = None if error is None else failure_text(error)
            if error is not None:
                stopped.add(task.key)
                self.errors[task.key] = error
            if progress:
                print(f"{task.key}: {'done' if error is None else error_line(error)}",
                      file=sys.stderr)
            if watched is not None:
                line, watch, training = watched
                if task.key in training:
                    watch.done(training[task.key])
                line.update(failed=int(error is not None), training=task.key in training)
            if error is not None and self.reraise:
                self.raised = (task.key, error)
                break
        return outcomes, blocked

    @staticmethod
    def _attempt(task: Task, retries: int) -> Exception | None:
        """None if the task succeeded within 1 + retries tries, else the last error."""
        error: Exception | None = None
        for _ in range(retries + 1):
            try:
                run_task(task)
                return None
            except Exception as caught:  # noqa: BLE001 - a failed task is recorded, not fatal
                error = caught
        return error


def interrupted_run(plan: SweepPlan, skipped: int | None) -> Interrupted:
    """`Interrupted` with the done tasks counted from the store's markers now, as a rerun will
    count them: call it once the workers have stopped (tasks still running at the Ctrl-C write
    their markers until then). `skipped`: tasks done before this run (None: no task ran yet)."""
    index = markers.MarkerIndex(plan.config.store_ref)
    done = sum(index.done(t.scope, t.marker) for t in plan.tasks)
    skipped = done if skipped is None else skipped
    error = Interrupted(
        f"{done} of {len(plan.tasks)} tasks done ({done - skipped} in this run), "
        f"{len(plan.tasks) - done} pending; store {plan.config.store} unlocked; rerun to resume")
    error.skipped = skipped
    return error


def execute_plan(plan: SweepPlan, executor: Executor, *, progress: bool = True,
                 verify: bool = False, reextract: bool = False) -> RunSummary:
    """Run every pending task of `plan` (`verify`, `reextract`: see `pending_tasks`); failed
    markers for tasks that kept failing. Tested shards still holding attention that their
    model's policy drops have it dropped first (`sweep.driver.bounded.finish_drops`).

    Ctrl-C raises `Interrupted` with a one-line count of the done tasks; an executor with
    `raised` set (`InProcessExecutor(reraise=True)`) has its task's exception re-raised after
    the failed marker is written.
    """
    try:  # the start-up check (a --verify re-hash reads the whole store) and finished drops
        compaction.settle(plan, verify=verify)
        pending = pending_tasks(plan, verify=verify, reextract=reextract)
        keys = {t.key for t in pending}
        finish_drops(plan, markers.MarkerIndex(plan.config.store_ref), keys)
        compaction.expand(plan, pending)
    except KeyboardInterrupt:
        raise interrupted_run(plan, None) from None
    summary = RunSummary(skipped=[t.key for t in plan.tasks if t.key not in keys])
    try:
        outcomes, summary.blocked = executor.execute(plan, pending, plan.config.retries,
                                                     progress)
        raise_if_interrupted()
    except KeyboardInterrupt:
        raise interrupted_run(plan, len(summary.skipped)) from None
    by_key = {t.key: t for t in pending}
    raised_by = getattr(executor, "errors", {})
    unwritten: OSError | None = None  # a failed marker the store did not take (a full disk)
    for key, error in outcomes.items():
        if error is None:
            summary.completed.append(key)
        else:
            summary.failed[key] = error
            if key in raised_by:
                summary.raised[key] = raised_by[key]
            task = by_key[key]
            try:
                markers.mark_failed(task.store, task.scope, task.marker, error)
            except OSError as caught:  # the task's own error says more: reported first
                unwritten = unwritten or caught
    if unwritten is None:  # no task runs any more: finished models' results become few
        # objects, the metadata is final, readers get one copy
        try:
            compaction.compact(plan)
        except KeyboardInterrupt:
            raise interrupted_run(plan, len(summary.skipped)) from None
        consolidate(plan.config.store_ref)
    raised = getattr(executor, "raised", None)
    if raised is not None:
        key, error = raised
        error = naming_the_store(error, plan.config.store)
        setattr(error, TASK_FAILURE, key)
        raise error
    if unwritten is not None and summary.fault() is None:
        raise naming_the_store(unwritten, plan.config.store)
    return summary


def check_config(config: SweepConfig, *, reextract: bool = False,
                 read_images: bool = True) -> None:
    """What the config alone decides against the store, before the lock (`sweep run`) or
    before anything is printed (`sweep plan`, `read_images=False`):
    `sweep.driver.preflight.check_before_lock`, and an `attention` policy wanting dropped
    attention back without `reextract`."""
    check_before_lock(config, read_images=read_images)
    check_attention_change(config, reextract=reextract)


@contextmanager
def locked(config: SweepConfig, *, break_lock: bool = False, force: bool = False,
           reextract: bool = False) -> Iterator[StoreLock]:
    """Hold the store's exclusive lock (a second `sweep run` on it is refused; `break_lock`,
    `force`: see `storage.lease`), after the refusals the config alone decides
    (`sweep.driver.preflight`, and an `attention` policy wanting dropped attention back without
    `reextract`: `sweep.driver.bounded`): a refused run writes nothing. A run whose lease another
    run broke meanwhile ends with StoreBusyError once its tasks are done."""
    check_config(config, reextract=reextract)
    with StoreLock(config.store_ref, break_lock=break_lock, force=force) as lock:
        yield lock
        if lock.lost:
            raise StoreBusyError(
                f"store {config.store}: another run broke this run's lease while it ran; what "
                f"this run finished is kept (each task wrote its data before its marker), and "
                f"`sweep status` shows the store as the other run leaves it")


def run_sweep(config: SweepConfig, executor: Executor, *, progress: bool = True,
              verify: bool = False, reextract: bool = False) -> RunSummary:
    """Lock the store, plan and create/extend it, run what is not done yet (`verify`: re-hash
    every done chunk first; `reextract`: extract dropped attention the policy now keeps; see
    `pending_tasks`)."""
    with locked(config, reextract=reextract):
        plan = materialise(config, progress=progress)
        return execute_plan(plan, executor, progress=progress, verify=verify,
                            reextract=reextract)

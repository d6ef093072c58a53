"""The sweep on Dask: one future per task, tagged with its pool, keyed by its task key.

Bounded stores (`attention: drop | {sample: N}`): test tasks take a higher Dask priority than
extractions, and the extractions of such models are submitted at most `in_flight` shards ahead
of their tests (a window that moves as tests finish), so the attention on disk is bounded by the
shards in flight, not by the dataset.

Preparation and extraction take the `GPU` resource, tests and baseline chunks the `CPU` resource
(untagged tasks would land on GPU workers too). A task's future takes its dependencies' futures as
arguments (a test its shard's extraction, an extraction its model's preparation), so it runs
after them and never runs if one failed. Futures carry only the small frozen task specs; workers
load models once through `workers.tasks`' per-process cache; a worker imports only
`workers.on_worker` and the modules of the stages it runs.
"""

from __future__ import annotations

import contextlib
import heapq

from distributed import Client, Future, as_completed

from sweep.driver.plan import ExtractTask, SweepPlan, Task, test_key
from sweep.driver.runner import failure_text
from sweep.driver.training_watch import TrainingWatch
from sweep.terminal.interrupts import raise_if_interrupted
from sweep.terminal.progress import progress as progress_reporter
from sweep.terminal.quiet_logs import QuietTaskFailures, drop_compute_failed, quiet_shutdown
from workers.on_worker import run_on_worker

PRIORITY = {"test": 1}  # tests of extracted shards before new extractions (default 0)


def bounded_models(plan: SweepPlan) -> frozenset[str]:
    """Models whose policy drops attention after the test (`attention:` not keep)."""
    return frozenset(m.name for m in plan.models if m.kept is not None)


def task_slots(client: Client) -> int:
    """GPU plus CPU task slots of the cluster's workers now (at least 2): the shards a bounded
    model may have in flight."""
    workers = client.scheduler_info().get("workers", {}).values()
    slots = sum(int(w.get("resources", {}).get(pool, 0)) for w in workers
                for pool in ("GPU", "CPU"))
    return max(2, slots)


class Submitter:
    """Submits a plan's tasks; a bounded model's extraction (and what depends on it) waits
    until fewer than `in_flight` of its model's extracted shards are untested.

    Each call submits, in plan order, every held task whose dependencies are all submitted and,
    for a bounded extraction, whose model has room in its window. The held tasks are indexed
    (what each waits for, which extractions wait for room), so a call costs what it submits,
    not what is held: a sweep's driver otherwise spends O(tasks) on every finished task
    (benchmarks/README.md, "The driver's submission loop")."""

    def __init__(self, client: Client, plan: SweepPlan, tasks: list[Task], retries: int,
                 in_flight: int) -> None:
        self.client, self.plan, self.retries, self.in_flight = client, plan, retries, in_flight
        self.futures: dict[str, Future] = {}
        self.bounded = bounded_models(plan)
        self.flying: dict[str, set[str]] = {name: set() for name in self.bounded}  # test keys
        self.pending_keys = {t.key for t in tasks}
        self._tasks = tasks  # plan order: a task's place is its index here
        self._missing: list[int] = []  # per task: its dependencies not submitted yet
        self._dependents: dict[str, list[int]] = {}  # key -> tasks waiting for its submission
        self._ready: list[int] = []  # heap: tasks whose dependencies are all submitted
        self._room: dict[str, list[int]] = {name: [] for name in self.bounded}  # heaps:
        # bounded extractions ready but for their model's window
        for index, task in enumerate(tasks):
            deps = [k for k in plan.depends_on(task) if k in self.pending_keys]
            self._missing.append(len(deps))
            for key in deps:
                self._dependents.setdefault(key, []).append(index)
            if not deps:
                self._ready.append(index)  # increasing: already a heap

    def submit_ready(self) -> list[Future]:
        """Submit every held task now allowed, in plan order; returns the new futures."""
        for model, waiting in self._room.items():  # as many as the window now has room for
            for _ in range(min(len(waiting), self.in_flight - len(self.flying[model]))):
                heapq.heappush(self._ready, heapq.heappop(waiting))
        new = []
        while self._ready:
            place = heapq.heappop(self._ready)
            task = self._tasks[place]
            if isinstance(task, ExtractTask) and task.model in self.bounded:
                if len(self.flying[task.model]) >= self.in_flight:
                    heapq.heappush(self._room[task.model], place)
                    continue
                self.flying[task.model].add(test_key(task.model, task.shard))
            new.append(self._submit(task))
            for index in self._dependents.pop(task.key, ()):
                self._missing[index] -= 1
                if not self._missing[index]:
                    heapq.heappush(self._ready, index)
        return new

    def _submit(self, task: Task) -> Future:
        after = tuple(self.futures[k] for k in self.plan.depends_on(task) if k in self.futures)
        future = self.client.submit(
            run_on_worker, task, *after, key=task.key, resources=task.resources,
            retries=self.retries, pure=False, priority=PRIORITY.get(task.stage, 0))
        self.futures[task.key] = future
        return future

    def finished(self, key: str) -> None:
        """A task ended (done or failed): a test frees its shard's place in the window."""
        for keys in self.flying.values():
            keys.discard(key)


def submit_tasks(client: Client, plan: SweepPlan, tasks: list[Task],
                 retries: int) -> dict[str, Future]:
    """Submit every task in plan order; a task takes the futures of its dependencies that
    rerun (a test its extraction, an extraction its model's preparation) as arguments."""
    submitter = Submitter(client, plan, tasks, retries, in_flight=len(tasks) + 1)
    submitter.submit_ready()
    return submitter.futures


class DaskExecutor:
    """Runs tasks on a `distributed.Client` with a progress bar on a terminal, a plain line
    every 30 s off one (`sweep.terminal.progress`; `open_client` prints the dashboard address);
    while models train, the progress names them with their epoch and validation score, and its
    ETA counts the training left (`sweep.driver.training_watch`)."""

    def __init__(self, client: Client, in_flight: int | None = None,
                 shared: bool = False) -> None:
        self.client = client
        self.shared = shared  # a cluster the sweep did not start: leave it as it was
        self.in_flight = in_flight  # shards per bounded model; default: `task_slots`
        self.errors: dict[str, BaseException] = {}  # key -> the exception of a failed task

    def execute(self, plan: SweepPlan, tasks: list[Task], retries: int,
                progress: bool) -> tuple[dict[str, str | None], list[str]]:
        drop_compute_failed()  # workers that are threads of this process
        self.client.register_plugin(QuietTaskFailures())
        window = self.in_flight or task_slots(self.client)
        submitter = Submitter(self.client, plan, tasks, retries, window)
        try:
            return self._collect(plan, tasks, submitter, progress)
        except KeyboardInterrupt:  # cancelled tasks and broken heartbeats follow: no fault
            quiet_shutdown()
            raise
        finally:
            if self.shared:
                with contextlib.suppress(Exception):  # its workers keep logging as before
                    self.client.unregister_worker_plugin(QuietTaskFailures.name)

    def _collect(self, plan: SweepPlan, tasks: list[Task], submitter: Submitter,
                 progress: bool) -> tuple[dict[str, str | None], list[str]]:
        outcomes: dict[str, str | None] = {}
        errors: dict[str, BaseException] = {}
        running = as_completed(submitter.submit_ready())
        training = {t.key: t.model for t in tasks if t.stage == "prepare"}
        watch = TrainingWatch(plan.config.store_ref, training.values()) if training else None
        bar = progress_reporter(len(tasks), "sweep", "task", enabled=progress,
                                note=None if watch is None else watch.note,
                                training_total=len(training))
        try:
            for future in running:
                raise_if_interrupted()  # a Ctrl-C that a compiler callback swallowed
                if future.status == "error":
                    error = future.exception()
                    errors[future.key] = error.with_traceback(future.traceback())
                elif future.status == "cancelled":  # not done: the scheduler dropped it
                    errors[future.key] = RuntimeError(
                        "cancelled by the Dask scheduler before it finished (a restart or a "
                        "lost client); rerun to resume")
                else:
                    outcomes[future.key] = None
                if watch is not None and future.key in training:
                    watch.done(training[future.key])
                bar.update(failed=int(future.key in errors), training=future.key in training)
                submitter.finished(future.key)
                for new in submitter.submit_ready():
                    running.add(new)
        finally:
            bar.close()
        blocked = []
        for task in tasks:
            if task.key not in errors:
                continue
            if any(key in errors for key in plan.depends_on(task)):
                blocked.append(task.key)  # a dependency failed (or was blocked): it never ran
            else:
                outcomes[task.key] = failure_text(errors[task.key])
                self.errors[task.key] = errors[task.key]
        self.client.cancel(list(submitter.futures.values()))
        return outcomes, blocked

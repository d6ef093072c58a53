"""The driver's submission loop (`sweep.driver.graph.Submitter`): call by call the same
submissions as a full pass over the held tasks in plan order (the reference below, the loop
before issue 42), at a cost that grows with what a call submits, not with what is held."""

from __future__ import annotations

import heapq
from collections import deque

import numpy as np
import pytest

from sweep.config.load import parse_config
from sweep.driver import plan as plans
from sweep.driver.graph import Submitter, bounded_models
from sweep.driver.plan import ExtractTask, ModelFacts, SweepPlan, build_plan

CONFIG = {
    "store": "/tmp/never-written.zarr",
    "shard_size": 2,
    "datasets": {"photos": {"source": "sklearn:sample_images"},
                 "wine": {"source": "sklearn:wine"}},
    "models": {"vit": {"source": "tiny-vit", "dataset": "photos", "attention": "drop"},
               "ft": {"source": "ft-transformer", "dataset": "wine"},
               "deit": {"source": "tiny-deit", "dataset": "photos",
                        "attention": {"sample": 3, "seed": 0}}},
    "baseline": {"sizes": [2, 8], "trials": 2500, "seed": 7, "chunk_trials": 1000},
    "matched_nulls": {"nulls": ["uniform"], "trials": 3000, "seed": 0, "chunk_trials": 1000},
}


def plan_of(inputs: int) -> SweepPlan:
    ids = tuple(f"i{i}" for i in range(inputs))
    facts = {"vit": ModelFacts.from_counts(ids, 2, (17,) * inputs),
             "deit": ModelFacts.from_counts(ids, 2, (17,) * inputs),
             "ft": ModelFacts.from_counts(ids[:5], 3, (14,) * 5)}
    return build_plan(parse_config(CONFIG), facts)


class Recorder:
    """A client whose futures are their keys; it records what each task was given to wait for."""

    def __init__(self) -> None:
        self.after: dict[str, tuple[str, ...]] = {}

    def submit(self, function, task, *after, key, **options):
        self.after[key] = after
        return key


class PassSubmitter:
    """The reference: each call walks every held task in plan order once."""

    def __init__(self, client, plan, tasks, retries, in_flight):
        self.client, self.plan, self.in_flight = client, plan, in_flight
        self.futures, self.bounded = {}, bounded_models(plan)
        self.flying = {name: set() for name in self.bounded}
        self.held, self.pending_keys = deque(tasks), {t.key for t in tasks}

    def _ready(self, task):
        deps = [k for k in self.plan.depends_on(task) if k in self.pending_keys]
        if any(k not in self.futures for k in deps):
            return False
        if isinstance(task, ExtractTask) and task.model in self.bounded:
            return len(self.flying[task.model]) < self.in_flight
        return True

    def submit_ready(self):
        new, still = [], deque()
        while self.held:
            task = self.held.popleft()
            if not self._ready(task):
                still.append(task)
                continue
            after = tuple(self.futures[k] for k in self.plan.depends_on(task)
                          if k in self.futures)
            self.futures[task.key] = self.client.submit(None, task, *after, key=task.key)
            new.append(self.futures[task.key])
            if isinstance(task, ExtractTask) and task.model in self.bounded:
                self.flying[task.model].add(plans.test_key(task.model, task.shard))
        self.held = still
        return new

    def finished(self, key):
        for keys in self.flying.values():
            keys.discard(key)


def calls(kind, plan, tasks, in_flight, seed):
    """Each call's submissions (with what each waits for) while tasks finish in a seeded
    random order among those submitted."""
    client = Recorder()
    submitter = kind(client, plan, tasks, 0, in_flight)
    rng = np.random.default_rng(seed)
    running = list(submitter.submit_ready())
    out = [[(key, client.after[key]) for key in running]]
    while running:
        key = running.pop(int(rng.integers(len(running))))
        submitter.finished(key)
        new = submitter.submit_ready()
        running += new
        out.append([(k, client.after[k]) for k in new])
    return out


@pytest.mark.parametrize("in_flight", [1, 2, 5])
@pytest.mark.parametrize("seed", [0, 1])
def test_each_call_submits_what_a_pass_in_plan_order_submits(in_flight, seed):
    plan = plan_of(13)
    assert bounded_models(plan) == {"vit", "deit"}
    tasks = list(plan.tasks)
    reference = calls(PassSubmitter, plan, tasks, in_flight, seed)
    assert calls(Submitter, plan, tasks, in_flight, seed) == reference
    assert sum(len(batch) for batch in reference) == len(tasks)
    resumed = [t for t in tasks if t.key not in {"extract-vit-00002", "test-deit-00001"}]
    assert calls(Submitter, plan, resumed, in_flight, seed) == \
        calls(PassSubmitter, plan, resumed, in_flight, seed)


def test_a_call_costs_what_it_submits_not_what_is_held(monkeypatch):
    """A bounded model of 400 shards, one test in flight: the reference asks for a task's
    dependencies over a hundred thousand times; the submitter twice per task, and it moves
    each task through its queues a few times, not once per call."""
    plan = plan_of(800)
    seen = {"depends_on": 0, "heappush": 0}
    depends_on, heappush = SweepPlan.depends_on, heapq.heappush

    def counting_depends_on(self, task):
        seen["depends_on"] += 1
        return depends_on(self, task)

    def counting_heappush(heap, item):
        seen["heappush"] += 1
        heappush(heap, item)

    monkeypatch.setattr(SweepPlan, "depends_on", counting_depends_on)
    monkeypatch.setattr(heapq, "heappush", counting_heappush)
    tasks = list(plan.tasks)
    calls(Submitter, plan, tasks, 1, 0)
    assert seen["depends_on"] <= 2 * len(tasks) and seen["heappush"] <= 4 * len(tasks)
    seen["depends_on"] = 0
    calls(PassSubmitter, plan, tasks, 1, 0)
    assert seen["depends_on"] > 100 * len(tasks)

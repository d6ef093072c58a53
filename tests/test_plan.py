"""The plan is data: shards, keys, dependencies, pools and estimates from config + facts."""

from __future__ import annotations

import pytest

from sweep.cli.commands.plan import describe
from sweep.config.load import parse_config
from sweep.driver.plan import (
    BaselineTask,
    ExtractTask,
    ModelFacts,
    NullTask,
    PrepareTask,
    TestTask,
    build_plan,
    model_config_inputs,
)

CONFIG = {
    "store": "/tmp/never-written.zarr",
    "shard_size": 4,
    "datasets": {"photos": {"source": "sklearn:sample_images"},
                 "wine": {"source": "sklearn:wine"}},
    "models": {"vit": {"source": "tiny-vit", "dataset": "photos", "batch_size": 3},
               "ft": {"source": "ft-transformer", "dataset": "wine"}},
    "baseline": {"sizes": [2, 8], "trials": 2500, "seed": 7, "chunk_trials": 1000},
}
FACTS = {
    "vit": ModelFacts.from_counts(tuple(f"img{i}" for i in range(10)), 2, (17,) * 10),
    "ft": ModelFacts.from_counts(tuple(f"row{i}" for i in range(5)), 3, (14,) * 5),
}


def plan_of(**changes):
    return build_plan(parse_config({**CONFIG, **changes}), FACTS)


def test_shards_are_contiguous_ranges_in_dataset_order():
    plan = plan_of()
    vit = plan.models[0]
    assert (vit.name, vit.n_inputs, vit.n_shards, vit.t_max) == ("vit", 10, 3, 17)
    ranges = [vit.shard_range(s) for s in range(vit.n_shards)]
    assert ranges == [(0, 4), (4, 8), (8, 10)]
    extracts = [t for t in plan.tasks if isinstance(t, ExtractTask) and t.model == "vit"]
    assert [(t.start, t.stop) for t in extracts] == ranges
    assert extracts[0].batch_size == 3 and extracts[0].device == "auto"


def test_keys_are_deterministic_unique_and_tests_follow_their_extraction():
    plan = plan_of()
    keys = [t.key for t in plan.tasks]
    assert keys == [t.key for t in plan_of().tasks]
    assert len(set(keys)) == len(keys)
    assert keys[:2] == ["extract-vit-00000", "test-vit-00000"]
    for task in plan.tasks:
        if isinstance(task, TestTask):
            assert plan.depends_on(task) == (f"extract-{task.model}-{task.shard:05d}",)
        elif isinstance(task, NullTask):  # waits for every test task of its model
            shards = 3 if task.model == "vit" else 2
            assert plan.depends_on(task) == tuple(f"test-{task.model}-{s:05d}"
                                                  for s in range(shards))
        elif isinstance(task, ExtractTask) and task.model == "ft":
            assert plan.depends_on(task) == ("prepare-ft",)
        else:
            assert plan.depends_on(task) == ()


def test_a_model_that_trains_is_prepared_by_one_task_before_its_extractions():
    keys = [t.key for t in plan_of().tasks]
    prepares = [t for t in plan_of().tasks if isinstance(t, PrepareTask)]
    assert [(t.key, t.model, t.scope, t.marker) for t in prepares] == [
        ("prepare-ft", "ft", "ft", "prepare")]
    assert prepares[0].resources == {"GPU": 1}
    first_extract = keys.index("extract-ft-00000")
    assert keys.index("prepare-ft") < first_extract
    assert not any(k.startswith("prepare-vit") for k in keys)  # random weights: nothing to do


def test_each_task_type_is_tagged_with_its_pool():
    resources = {type(t).__name__: t.resources for t in plan_of().tasks}
    assert resources == {"PrepareTask": {"GPU": 1}, "ExtractTask": {"GPU": 1},
                         "TestTask": {"CPU": 1}, "BaselineTask": {"CPU": 1},
                         "NullTask": {"CPU": 1}}


def test_baseline_chunks_cover_every_trial_once():
    tasks = [t for t in plan_of().tasks if isinstance(t, BaselineTask)]
    assert [t.key for t in tasks[:3]] == [
        "baseline-uniform-n0002-c00000", "baseline-uniform-n0002-c00001",
        "baseline-uniform-n0002-c00002"]
    for n in (2, 8):
        chunks = [tuple(t.blocks) for t in tasks if t.n == n and t.null == "uniform"]
        assert chunks == [((0, 1000),), ((1, 1000),), ((2, 500),)]
    assert {t.seed for t in tasks} == {7}


def test_fingerprint_tracks_what_changes_stored_values():
    """The batch size and the device kind change a model's attention in its last float bits
    (issue 22); the device index does not, and the defaults leave old fingerprints alone."""
    base = plan_of().models[0].fingerprint
    config = parse_config({**CONFIG, "models": {**CONFIG["models"], "vit": {
        "source": "tiny-vit", "dataset": "photos"}}})
    assert "batch_size" not in model_config_inputs(config, "vit")  # the default: left out
    assert plan_of(models={**CONFIG["models"], "vit": {**CONFIG["models"]["vit"],
                                                       "batch_size": 4}}
                   ).models[0].fingerprint != base
    assert plan_of(device="cuda").models[0].fingerprint != base
    assert plan_of(device="cuda:1").models[0].fingerprint == \
        plan_of(device="cuda:0").models[0].fingerprint
    assert plan_of(tol=1e-9).models[0].fingerprint != base
    assert plan_of(token_sets=["all"]).models[0].fingerprint != base
    assert plan_of(shard_size=5).models[0].fingerprint != base


def test_estimates_follow_the_formulas():
    plan = plan_of()
    vit = plan.models[0]
    assert vit.attention_bytes == 10 * 2 * 17 * 17 * 4
    assert vit.work == 2 * 2 * 10 * (17**3 // 2)  # token sets x layers x inputs x T^3/2
    nulls = len(plan.baseline.nulls)  # every null by default
    assert plan.baseline.work == nulls * (2500 * (2**3 // 2) + 2500 * (8**3 // 2))


def test_models_without_facts_are_left_out():
    plan = build_plan(parse_config(CONFIG), {"vit": FACTS["vit"]})
    assert [m.name for m in plan.models] == ["vit"]
    lines = describe(plan)
    row = next(line for line in lines if line.startswith("vit "))
    assert row.split()[:8] == ["vit", "photos", "10", "3", "2", "1", "17", "6"]


@pytest.mark.parametrize("shard_size", [1, 3, 10, 11])
def test_any_shard_size_partitions_the_inputs(shard_size):
    vit = plan_of(shard_size=shard_size).models[0]
    covered = [i for s in range(vit.n_shards) for i in range(*vit.shard_range(s))]
    assert covered == list(range(10))


def test_chunks_hold_whole_blocks():
    tasks = [t for t in plan_of(baseline={**CONFIG["baseline"], "chunk_trials": 2000}).tasks
             if isinstance(t, BaselineTask) and t.n == 2]
    assert [tuple(t.blocks) for t in tasks if t.null == "uniform"] == [
        ((0, 1000), (1, 1000)), ((2, 500),)]


def test_test_tasks_take_the_row_sum_tolerance_of_their_models_extraction_dtype():
    """A bfloat16 softmax row misses 1 by up to its unit roundoff 2^-8, past the 1e-3 that
    float32 and float16 rows keep: its test tasks allow 2^-7."""
    models = {"vit": {**CONFIG["models"]["vit"], "dtype": "bfloat16"}, "ft": CONFIG["models"]["ft"]}
    tests = {t.model: t for t in plan_of(models=models).tasks if isinstance(t, TestTask)}
    assert tests["vit"].row_sum_tol == 2.0**-7
    assert tests["ft"].row_sum_tol == 1e-3

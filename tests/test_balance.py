"""The plan's balance: predicted seconds per input from the measured constants, pool sizes of each
cluster kind, and the lines `sweep plan --cluster` prints."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweep.cli.entry import main
from sweep.clusters.config import load_cluster_config
from sweep.config.load import parse_config
from sweep.driver import runner
from sweep.driver.balance import (
    CONSTANTS,
    Pools,
    balance_lines,
    cluster_pools,
    cores_per_gpu,
    extract_seconds,
    extraction_cores,
    pace_lines,
    stage_cpu_seconds,
    worker_pace,
)
from sweep.driver.plan import ModelFacts, build_plan

REPO = Path(__file__).resolve().parents[1]
CONFIG = {
    "store": "/tmp/never-written.zarr",
    "datasets": {"photos": {"source": "sklearn:sample_images"}},
    "models": {"vit-b": {"source": "tiny-vit", "dataset": "photos"},
               "dino-l": {"source": "tiny-vit", "dataset": "photos"}},
}
FACTS = {
    "vit-b": ModelFacts.from_counts(tuple(f"i{i}" for i in range(100)), 12, (197,) * 100),
    "dino-l": ModelFacts.from_counts(tuple(f"i{i}" for i in range(100)), 24, (261,) * 100),
}


def plan_of(**changes):
    return build_plan(parse_config({**CONFIG, **changes}), FACTS)


def test_every_constant_says_where_it_was_measured():
    for name, constant in CONSTANTS.items():
        assert constant.seconds > 0 and constant.unit and constant.measured, name
    assert "gpu_check.sh on one H200" in CONSTANTS["GPU_LAYER_TOKEN_S"].measured
    # the one estimate: a GPU's forward pass alone (no device was lent to measure it)
    assert [name for name, c in CONSTANTS.items() if c.estimate] == ["GPU_FORWARD_LAYER_TOKEN_S"]


def test_test_seconds_grow_with_size_and_shrink_with_less_rollout():
    vit, dino = plan_of().models
    ratio = stage_cpu_seconds(dino) / stage_cpu_seconds(vit)  # 2x layers; T^2 to T^3 terms
    assert 2 * (261 / 197) ** 2 < ratio < 2 * (261 / 197) ** 3
    every, last, off = (plan_of(rollout=mode).models[0] for mode in ("every", "last", "off"))
    assert stage_cpu_seconds(every) > stage_cpu_seconds(last) > stage_cpu_seconds(off) > 0
    one_set = plan_of(token_sets=["all"]).models[0]
    assert per_stack(every) == pytest.approx(2 * per_stack(one_set))


def per_stack(model) -> float:
    """The model's test CPU-seconds per input without the shard's share."""
    return stage_cpu_seconds(model) - CONSTANTS["SHARD_S"].seconds / model.shard_size


def test_the_decision_radius_is_counted_per_matrix_beside_the_check(monkeypatch):
    """Each tested matrix (layers x token sets) costs RADIUS_S per matrix element (T^2) on top
    of CHECK_S per pair-element: the radius runs in the same kernel, on the same screen."""
    from sweep.driver import balance

    vit = plan_of().models[0]
    before = stage_cpu_seconds(vit)
    extra = balance.Constant(1e-9, "CPU-s per matrix element", "a test's value")
    monkeypatch.setitem(balance.CONSTANTS, "RADIUS_S",
                        balance.Constant(CONSTANTS["RADIUS_S"].seconds + extra.seconds,
                                         extra.unit, extra.measured))
    matrices = vit.n_layers * len(vit.token_sets)
    assert stage_cpu_seconds(vit) - before == pytest.approx(matrices * 1e-9 * 197**2)


def test_larger_shards_share_out_the_cost_of_a_shard():
    small, large = (plan_of(shard_size=size).models[0] for size in (8, 256))
    assert small.shard_size == 8 and large.shard_size == 256
    assert stage_cpu_seconds(small) - stage_cpu_seconds(large) == pytest.approx(
        CONSTANTS["SHARD_S"].seconds * (1 / 8 - 1 / 256))


def test_every_kept_head_is_a_stack_to_test():
    """`heads: each` tests each head's maps: H stacks per token set where `mean` tests one."""
    facts = {**FACTS, "vit-b": ModelFacts.from_counts(FACTS["vit-b"].input_ids, 12, (197,) * 100,
                                                      n_heads=12)}
    config = parse_config({**CONFIG, "models": {
        "vit-b": {"source": "tiny-vit", "dataset": "photos", "options": {"heads": "each"}},
        "dino-l": CONFIG["models"]["dino-l"]}})
    each = build_plan(config, facts).models[0]
    assert each.n_heads == 12
    assert per_stack(each) == pytest.approx(12 * per_stack(plan_of().models[0]))


def test_a_stack_costs_something_however_few_its_tokens():
    """Small stacks are dominated by the fixed cost per stack (STACK_S), not by T^3."""
    tiny = {**FACTS, "vit-b": ModelFacts.from_counts(FACTS["vit-b"].input_ids, 6, (3,) * 100)}
    model = build_plan(parse_config(CONFIG), tiny).models[0]
    assert stage_cpu_seconds(model) > 2 * CONSTANTS["STACK_S"].seconds


def test_extraction_on_a_gpu_is_cheaper_than_on_cpu_workers():
    vit = plan_of().models[0]
    assert 0 < extract_seconds(vit, gpu=True) < extract_seconds(vit, gpu=False)


def test_pool_sizes_of_each_cluster_kind():
    cfg = load_cluster_config(REPO / "cluster.yaml")
    assert cluster_pools(cfg, cpu_count=8, devices=[]) == Pools(0, 8, 8)
    assert cluster_pools(cfg, cpu_count=8, devices=[0, 1]) == Pools(2, 4, 2)  # gpu_threads 2
    slurm = cfg.model_copy(update={"kind": "slurm"})
    assert cluster_pools(slurm) == Pools(gpus=2, cpu_cores=4 * 16, extract_slots=2)
    kube = cfg.model_copy(update={"kind": "kubernetes"})
    assert cluster_pools(kube) == Pools(gpus=2, cpu_cores=16, extract_slots=2)
    assert cluster_pools(cfg.model_copy(update={"kind": "address"})) is None


def test_balance_lines_give_cores_per_gpu_and_stage_seconds():
    plan = plan_of()
    lines = balance_lines(plan, Pools(gpus=2, cpu_cores=64, extract_slots=2))
    vit = plan.models[0]
    row = next(line for line in lines if line.startswith("vit-b "))
    extract, test = extract_seconds(vit, True), stage_cpu_seconds(vit)
    cells = row.split()
    assert float(cells[3]) == pytest.approx(test / extract, rel=0.05)
    assert float(cells[4]) == pytest.approx(100 * extract / 2, rel=0.01)
    assert float(cells[5]) == pytest.approx(100 * test / 64, rel=0.01)
    assert any("measured constants" in line for line in lines)
    cpu_only = balance_lines(plan, Pools(gpus=0, cpu_cores=2, extract_slots=2))
    assert "no GPU" in cpu_only[1]


def test_sweep_plan_with_a_cluster_prints_the_balance(tmp_path, capsys, monkeypatch):
    config = tmp_path / "sweep.yaml"
    config.write_text(
        f"store: {tmp_path / 'store.zarr'}\n"
        "datasets: {photos: {source: 'sklearn:sample_images'}}\n"
        "models: {vit-b: {source: tiny-vit, dataset: photos}}\n"
    )
    facts = {"vit-b": FACTS["vit-b"]}  # sizing a model is the driver's business, not this test's
    monkeypatch.setattr(runner, "sized_plan",
                        lambda config, **_: (build_plan(config, facts), facts, {}))
    assert main(["plan", str(config), "--cluster", str(REPO / "cluster.yaml")]) == 0
    out = capsys.readouterr().out
    assert "balance (predicted from measured constants" in out
    assert "pace of one extraction worker" in out and "store must take" in out
    cells = next(line for line in out.splitlines() if line.startswith("vit-b ")).split()
    assert cells[4] != "?" and float(cells[5]) > 0


def test_cores_per_gpu_is_test_over_extraction_and_names_its_estimates(monkeypatch):
    from sweep.driver import balance

    vit, dino = plan_of().models
    per = cores_per_gpu(vit)
    assert per.cores == pytest.approx(stage_cpu_seconds(vit) / extract_seconds(vit, gpu=True))
    assert per.estimates == () and "estimated" not in per.line()
    assert per.line().startswith(f"vit-b: {per.cores:.1f} CPU cores per GPU (")
    assert cores_per_gpu(dino).cores > per.cores  # T^3 tests against T extraction
    lines = balance_lines(plan_of(), Pools(gpus=2, cpu_cores=64, extract_slots=2))
    assert any(line.startswith("CPU cores per GPU: test CPU-s per input / extraction GPU-s")
               and line.endswith("no estimated constant") for line in lines)
    guess = balance.Constant(4.2e-7, "GPU-s per (layer x token) of extraction", "a guess",
                             estimate=True)
    monkeypatch.setitem(balance.CONSTANTS, "GPU_LAYER_TOKEN_S", guess)
    per = cores_per_gpu(vit)
    assert per.estimates == ("GPU_LAYER_TOKEN_S",)
    assert "estimated: GPU_LAYER_TOKEN_S" in per.line() and "\n" not in per.line()
    lines = balance_lines(plan_of(), Pools(gpus=2, cpu_cores=64, extract_slots=2),
                          constants=True)
    assert any(line.endswith("estimated constants: GPU_LAYER_TOKEN_S") for line in lines)
    assert "GPU_LAYER_TOKEN_S = 4.2e-07 GPU-s per (layer x token) of extraction (ESTIMATE)" \
        in "\n".join(lines)


def test_rollout_on_the_extraction_device_moves_its_cost_from_the_test_to_the_gpu():
    test, device = plan_of().models[1], plan_of(rollout_device="extraction").models[1]
    moved = stage_cpu_seconds(test) - stage_cpu_seconds(device)
    assert moved > 0.3 * stage_cpu_seconds(test)  # products + kappa: a large part at T = 261
    assert extract_seconds(device, gpu=True) > extract_seconds(test, gpu=True)
    assert extract_seconds(device, gpu=False) - extract_seconds(test, gpu=False) == \
        pytest.approx(moved, rel=1e-9)  # on CPU workers the same work moves stages
    assert cores_per_gpu(device).cores < cores_per_gpu(test).cores
    assert cores_per_gpu(device).estimates == ()


def test_a_workers_pace_is_its_device_or_its_cores_whichever_is_slower():
    vit, dino = plan_of().models
    one = worker_pace(vit, cores=1)
    assert 1 / one.inputs_s == pytest.approx(one.device_s + one.host_s)
    eight = worker_pace(vit, cores=8)
    assert eight.batches == 4  # shard_size 32, batch_size 8
    # the pipeline's pace, and per task one batch's host work that nothing overlaps
    assert eight.steady_s == pytest.approx(max(eight.device_s, eight.host_s / 8))
    assert 1 / eight.inputs_s == pytest.approx(eight.steady_s + eight.host_s / (8 * 4))
    assert eight.store_bytes_s == pytest.approx(eight.inputs_s * vit.input_bytes)
    assert eight.estimates == ("GPU_FORWARD_LAYER_TOKEN_S",)
    many = worker_pace(dino, cores=10**6)  # cores enough: the device sets the pace
    assert many.limit == "device" and 1 / many.inputs_s == pytest.approx(many.device_s,
                                                                         rel=1e-5)
    longer = worker_pace(plan_of(shard_size=320).models[0], cores=8)  # 40 batches a task
    assert eight.inputs_s < longer.inputs_s < 1 / eight.steady_s
    assert worker_pace(vit, cores=1, gpu=False).device_s > one.device_s


def test_pace_lines_name_the_worker_the_limit_and_the_store_bandwidth():
    plan = plan_of(attention="drop")
    lines = pace_lines(plan, Pools(gpus=2, cpu_cores=64, extract_slots=2), cores=8)
    assert lines[0].startswith("pace of one GPU worker of 8 thread(s)")
    row = next(line for line in lines if line.startswith("vit-b "))
    assert float(row.split()[1]) == pytest.approx(worker_pace(plan.models[0], 8).inputs_s,
                                                  rel=1e-2)
    assert row.endswith("B/s") and "drop and sample write them too" in lines[-1]
    assert "estimated: GPU_FORWARD_LAYER_TOKEN_S" in lines[-1]


def test_a_task_of_few_batches_is_warned_of_with_the_shard_size_that_amortises_it():
    plan = plan_of(shard_size=32, batch_size=64)  # GPU-sized batches in the default shards
    lines = pace_lines(plan, Pools(gpus=1, cpu_cores=16, extract_slots=1), cores=8)
    warnings = [line for line in lines if line.startswith("WARNING: ")]
    assert len(warnings) == 2 and warnings[0].startswith(
        "WARNING: vit-b: 1 batch(es) per extraction task (shard_size 32, batch_size 64)")
    assert "shard_size >= 256 amortises them" in warnings[0]
    kept = worker_pace(plan.models[0], 8).kept
    assert 0 < kept < 1 and f"about {kept:.0%} of the pipeline's pace" in warnings[0]
    pools = Pools(gpus=1, cpu_cores=16, extract_slots=1)
    fine = pace_lines(plan_of(shard_size=256, batch_size=64), pools, cores=8)
    assert not any(line.startswith("WARNING") for line in fine)  # one shard of 2 batches:
    # a dataset smaller than the shard size has nothing to amortise it with
    assert sum(line.startswith("WARNING") for line in pace_lines(
        plan_of(shard_size=64, batch_size=16), pools, cores=8)) == 0  # 4 batches a task
    one_core = pace_lines(plan, Pools(gpus=1, cpu_cores=16, extract_slots=1), cores=1)
    assert not any(line.startswith("WARNING") for line in one_core)  # no pipeline to starve


def test_an_extraction_workers_cores_come_from_the_cluster_file():
    cfg = load_cluster_config(REPO / "cluster.yaml")
    assert extraction_cores(cfg.model_copy(update={"kind": "slurm"})) == 8
    assert extraction_cores(cfg, cpu_count=16, devices=[0]) == 2  # local.gpu_threads
    assert extraction_cores(cfg, cpu_count=2, devices=[]) == 1
    assert extraction_cores(cfg.model_copy(update={"kind": "address"})) is None

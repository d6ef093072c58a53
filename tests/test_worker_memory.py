"""Memory per worker process (issue 42, item 2): what each pool of a cluster file gives a worker
process, what its tasks need from the measured figures, and the warning `sweep plan --cluster`
prints when a pool gives less."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from storage.store import READ_BLOCK_BYTES
from sweep.cli.entry import main
from sweep.clusters.config import load_cluster_config
from sweep.clusters.memory import (
    MEMORY,
    MIB,
    extraction_bytes,
    memory_data,
    memory_lines,
    peak_of_a_test_task,
    pool_memory,
    weight_bytes,
)
from sweep.config.load import parse_config
from sweep.driver import runner
from sweep.driver.plan import ModelFacts, build_plan

REPO = Path(__file__).resolve().parents[1]
IDS = tuple(f"i{i}" for i in range(64))
CONFIG = {
    "store": "/tmp/never-written.zarr",
    "datasets": {"photos": {"source": "sklearn:sample_images"}},
    "models": {"vit-b": {"source": "tiny-vit", "dataset": "photos"},
               "dino-518": {"source": "tiny-vit", "dataset": "photos"}},
}
FACTS = {"vit-b": ModelFacts.from_counts(IDS, 12, (197,) * 64),
         "dino-518": ModelFacts.from_counts(IDS, 12, (1370,) * 64)}


def models(**changes):
    return build_plan(parse_config({**CONFIG, **changes}), FACTS).models


def slurm(cpu_memory: str):
    cfg = load_cluster_config(REPO / "cluster.yaml")
    cpu = cfg.slurm.cpu.model_copy(update={"memory": cpu_memory})
    return cfg.model_copy(update={"kind": "slurm",
                                  "slurm": cfg.slurm.model_copy(update={"cpu": cpu})})


def test_every_figure_says_how_it_was_measured():
    for name, figure in MEMORY.items():
        assert figure.value > 0 and figure.unit and figure.measured, name
    assert [name for name, f in MEMORY.items() if f.estimate] == ["EXTRACT_COPIES",
                                                                   "BLOCK_PARAMS"]


def test_a_test_task_holds_one_read_block_and_float64_stacks_at_t_max():
    vit, dino = models()
    stacks = MEMORY["TEST_STACKS"].value
    per_input = 12 * 197**2 * 4  # float32, one stored head
    assert READ_BLOCK_BYTES // per_input == 36  # a shard of 32 is read as one block
    assert peak_of_a_test_task(vit) == int(32 * per_input + stacks * 12 * 197**2 * 8)
    big = 12 * 1370**2 * 4
    assert big > READ_BLOCK_BYTES  # one input is read alone
    assert peak_of_a_test_task(dino) == int(big + stacks * 12 * 1370**2 * 8)
    each = replace(models(shard_size=4)[0], n_heads=12)  # heads: each; the heads are tested
    assert READ_BLOCK_BYTES // (12 * per_input) == 3  # one at a time, read three inputs a block
    assert peak_of_a_test_task(each) == int(3 * 12 * per_input + stacks * 12 * 197**2 * 8)


def test_an_extraction_needs_its_imports_batch_and_weights_where_the_width_is_known():
    vit = models()[0]
    imports = MEMORY["EXTRACT_IMPORTS"].value * MIB
    batch = MEMORY["EXTRACT_COPIES"].value * vit.batch_size * 12 * 197**2 * 4
    assert weight_bytes(vit) is None and extraction_bytes(vit) == int(imports + batch)
    vit_b = replace(vit, width=768)
    assert weight_bytes(vit_b) == 12 * 12 * 768**2 * 4  # 85M parameters (ViT-B/16: 86.6M)
    assert weight_bytes(replace(vit_b, dtype="bfloat16")) == 12 * 12 * 768**2 * 2
    assert extraction_bytes(vit_b) == int(imports + batch + weight_bytes(vit_b))
    (line,) = [line for line in memory_lines(slurm("32GB"), [vit_b]) if "extraction:" in line]
    assert "324 MiB of weights (width 768, float32)" in line and "(estimate)" in line


def test_each_kind_gives_its_pools_memory_per_worker_process():
    cfg = load_cluster_config(REPO / "cluster.yaml")
    given = {p.name: (p.given, p.tests, p.extracts) for p in pool_memory(slurm("32GB"))}
    assert given == {"gpu": (64_000_000_000, 0, True), "cpu": (2_000_000_000, 1, False)}
    kube = {p.name: p.given for p in pool_memory(cfg.model_copy(update={"kind": "kubernetes"}))}
    assert kube == {"gpu": 32 * 2**30, "cpu": 4 * 2**30}
    local = cfg.model_copy(update={"local": cfg.local.model_copy(update={"memory_limit": "3GB"})})
    (pool,) = pool_memory(local, cpu_count=4, devices=[])
    assert (pool.given, pool.tests, pool.extracts) == (3_000_000_000, 1, True)
    assert pool_memory(cfg.model_copy(update={"kind": "address"})) is None


def test_a_pool_that_gives_less_than_a_test_task_needs_is_warned():
    plan = models()
    need = int(MEMORY["TEST_WORKER"].value * MIB) + peak_of_a_test_task(plan[1])
    assert 0.8e9 < need < 1.3e9  # DINOv2 at 518 px, 12 layers: about 1 GB
    short = memory_lines(slurm(f"{16 * (need - MIB)}B"), plan)
    warnings = [line for line in short if line.startswith("WARNING: pool cpu")]
    assert len(warnings) == 1 and "dino-518" in warnings[0] and "1 MiB less" in warnings[0]
    enough = memory_lines(slurm(f"{16 * need}B"), plan)
    assert not any(line.startswith("WARNING") for line in enough)
    assert any("tests: needs" in line and "dino-518" in line and "T = 1370" in line
               for line in enough)
    data = memory_data(slurm(f"{16 * (need - MIB)}B"), plan)
    assert data["cpu"]["needs"]["tests"] == {"bytes": need, "model": "dino-518",
                                            "estimate": False, "short": True}
    assert set(data["gpu"]["needs"]) == {"extraction"}  # the GPU pool runs no test


def test_an_existing_cluster_is_told_what_to_give_its_workers():
    cfg = load_cluster_config(REPO / "cluster.yaml").model_copy(update={"kind": "address"})
    lines = memory_lines(cfg, models())
    assert any("--memory-limit at least" in line for line in lines)
    assert not any(line.startswith("WARNING") for line in lines)
    assert memory_data(cfg, models())["test workers"]["needs"]["tests"]["model"] == "dino-518"


def test_verbose_lines_name_each_figure_and_its_source():
    cfg = load_cluster_config(REPO / "cluster.yaml")
    lines = "\n".join(memory_lines(cfg, models(), figures=True))
    for name, figure in MEMORY.items():
        assert f"{name} = {figure.value:g} {figure.unit}" in lines
        assert figure.measured in lines
    assert "EXTRACT_COPIES = 3 host copies" in lines and "(ESTIMATE)" in lines
    assert "(ESTIMATE)" not in "\n".join(memory_lines(cfg, models()))


def test_sweep_plan_with_a_cluster_shows_memory_per_worker_process(tmp_path, capsys,
                                                                   monkeypatch):
    config = tmp_path / "sweep.yaml"
    config.write_text(
        f"store: {tmp_path / 'store.zarr'}\n"
        "datasets: {photos: {source: 'sklearn:sample_images'}}\n"
        "models: {dino-518: {source: tiny-vit, dataset: photos}}\n"
    )
    facts = {"dino-518": FACTS["dino-518"]}
    monkeypatch.setattr(runner, "sized_plan",
                        lambda config, **_: (build_plan(config, facts), facts, {}))
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text((REPO / "cluster.yaml").read_text()
                       .replace("kind: local ", "kind: slurm ")
                       .replace("memory: 32GB ", "memory: 8GB  "))  # 500 MB per process
    assert main(["plan", str(config), "--cluster", str(cluster)]) == 0
    out = capsys.readouterr().out
    assert "memory per worker process" in out
    assert "pool cpu: 477 MiB given (slurm.cpu.memory 8GB / 16 process(es))" in out
    assert "WARNING: pool cpu gives a worker process 477 MiB" in out
    assert main(["plan", str(config), "--cluster", str(cluster), "--format", "json"]) == 0
    memory = json.loads(capsys.readouterr().out)["cluster"]["memory"]
    assert memory["cpu"]["given_bytes"] == 500_000_000
    assert memory["cpu"]["needs"]["tests"]["short"] is True


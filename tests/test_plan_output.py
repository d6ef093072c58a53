"""`sweep plan` one can read: the table and what cannot run by default, the resolved config and
every detail with --verbose, the same data as JSON with --format json."""

from __future__ import annotations

import json

from sweep.cli.entry import main
from sweep.config.load import parse_config
from sweep.driver import runner
from sweep.driver.balance import (
    CORES_PER_GPU_MEANING,
    Pools,
    balance_lines,
    fixed_seconds,
    predictions,
)
from sweep.driver.plan import ModelFacts, build_plan

FACTS = {
    "vit": ModelFacts.from_counts(tuple(f"img{i}" for i in range(10)), 2, (17,) * 10),
    "a-model-with-a-name-longer-than-the-column": ModelFacts.from_counts(
        tuple(f"img{i}" for i in range(10)), 2, (17,) * 10),
}


def write_config(tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text(
        f"store: {tmp_path / 'store.zarr'}\nshard_size: 4\n"
        "datasets: {photos: {source: 'sklearn:sample_images'}}\n"
        "models:\n  vit: {source: tiny-vit, dataset: photos}\n"
        "  a-model-with-a-name-longer-than-the-column: {source: tiny-vit, dataset: photos}\n"
        "baseline: {sizes: [2, 8], trials: 2500, seed: 7, chunk_trials: 1000}\n")
    return path


def planned(tmp_path, monkeypatch, capsys, *flags):
    monkeypatch.setattr(runner, "sized_plan",
                        lambda config, **_: (build_plan(config, FACTS), FACTS, {}))
    assert main(["plan", str(write_config(tmp_path)), *flags]) == 0
    return capsys.readouterr().out


def test_by_default_the_table_without_the_resolved_config(tmp_path, monkeypatch, capsys):
    out = planned(tmp_path, monkeypatch, capsys)
    assert "resolved config" not in out and "split: null" not in out
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("model "))
    rows = [line.split() for line in lines[header + 1:header + 4]]
    assert [row[0] for row in rows] == ["vit", "a-model-with-a-name-longer-than-the-column",
                                        "baseline"]
    assert rows[1][:8] == ["a-model-with-a-name-longer-than-the-column", "photos", "10", "3",
                           "2", "1", "17", "6"]  # a long name keeps its row's columns
    assert "attention: every model keeps all of it (peak = the total above)" in lines
    assert len(lines) <= 14  # and the estimated wall time (sweep.driver.balance)
    assert lines[-1].startswith("estimated wall time on the local default")


def test_verbose_adds_the_resolved_config_and_every_models_peak(tmp_path, monkeypatch, capsys):
    out = planned(tmp_path, monkeypatch, capsys, "--verbose")
    assert out.startswith("resolved config:\n") and "split: null" in out
    assert "attention (peak bytes the policy lets the store hold" in out
    assert sum(line.startswith("  vit ") for line in out.splitlines()) == 1


def test_json_holds_the_tables_data(tmp_path, monkeypatch, capsys):
    text = planned(tmp_path, monkeypatch, capsys)
    data = json.loads(planned(tmp_path, monkeypatch, capsys, "--format", "json"))
    assert data["config"]["shard_size"] == 4 and data["store_state"] == "new"
    vit = data["rows"][0]
    assert (vit["name"], vit["inputs"], vit["shards"], vit["layers"], vit["t_max"],
            vit["tasks"]) == ("vit", 10, 3, 2, 17, 6)
    assert data["total"]["tasks"] == sum(row["tasks"] for row in data["rows"])
    assert f"total: {data['total']['tasks']} tasks (0 done)" in text


def test_fixed_costs_and_cores_per_gpu_are_explained(monkeypatch):
    from sweep.driver import balance

    monkeypatch.setitem(balance.CONSTANTS, "WORKER_START_S",
                        balance.Constant(4.0, "s", "test"))
    monkeypatch.setitem(balance.CONSTANTS, "MODEL_LOAD_S", balance.Constant(3.0, "s", "test"))
    plan = build_plan(parse_config({
        "store": "/tmp/never-written.zarr",
        "datasets": {"photos": {"source": "sklearn:sample_images"}},
        "models": {name: {"source": "tiny-vit", "dataset": "photos"} for name in FACTS}}),
        FACTS)
    pools = Pools(gpus=1, cpu_cores=8, extract_slots=2)
    assert fixed_seconds(plan, pools) == 4.0 + 3.0 * 2 / 2
    lines = balance_lines(plan, pools, constants=False)
    assert any(line.startswith(CORES_PER_GPU_MEANING) for line in lines)
    assert any(line.startswith("fixed: 7 s = worker start 4 s + 2 model loads x 3 s / 2 "
                               "extraction worker(s)") for line in lines)
    assert not any(line.startswith("  WORKER_START_S") for line in lines)
    numbers = predictions(plan, pools)
    assert numbers["fixed_s"] == 7.0
    vit = numbers["models"]["vit"]
    assert vit["cpu_cores_per_gpu"] == vit["test_cpu_s_per_input"] / vit["extract_s_per_input"]

"""`sweep plan`'s prices: the training runs a sweep starts first with their measured cost, and
the estimated wall time on the local default or a cluster (`sweep.driver.balance`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sweep.cli.entry import main
from sweep.config.load import parse_config
from sweep.driver import runner
from sweep.driver.balance import (
    TRAINING_COSTS,
    Pools,
    TrainingCost,
    null_seconds,
    pending_shares,
    training_runs,
    wall_estimate,
)
from sweep.driver.plan import ModelFacts, build_plan, prepare_key
from workers.models.registry import PRESETS, TRAINED_FAMILIES
from workers.models.trained.vit.options import OBJECTIVES

REPO = Path(__file__).resolve().parents[1]
DIGITS = 1797
CONFIG = {
    "store": "/tmp/never-written.zarr",
    "datasets": {"digits": {"kind": "image", "source": "sklearn:digits"},
                 "wine": {"kind": "tabular", "source": "sklearn:wine"}},
    "models": {"vit": {"source": "vit-digits", "dataset": "digits", "seeds": [0, 1],
                       "checkpoints": [0, 5, "best"], "control": "random-init"},
               "ft": {"source": "ft-transformer", "dataset": "wine",
                      "options": {"max_epochs": 20}}},
    "matched_nulls": None,
}


def plan_of(config=CONFIG):
    config = parse_config(config)
    facts = {name: ModelFacts.from_counts(tuple(f"i{i}" for i in range(40)), 4,
                                          (17 if name.startswith("vit") else 14,) * 40)
             for name in config.models}
    return build_plan(config, facts)


def rows_of(plan) -> dict[str, int]:
    return {m.name: DIGITS if m.name.startswith("vit") else 178 for m in plan.models}


def test_every_recipe_the_project_trains_has_a_measured_cost():
    trained = {name for name, spec in PRESETS.items() if spec.family in TRAINED_FAMILIES}
    assert trained <= set(TRAINING_COSTS)
    assert {f"vit-digits objective={o}" for o in OBJECTIVES if o != "supervised"} <= set(
        TRAINING_COSTS)
    for name, cost in TRAINING_COSTS.items():
        assert cost.seconds > 0 and cost.measured.startswith("plan_costs.py training"), name
        assert (cost.epochs is None) != (cost.typical is None), name  # one rule for epochs


def test_each_objective_of_the_digits_vit_is_priced_by_its_own_measured_line():
    config = {**CONFIG, "models": {
        name: {"source": "vit-digits", "dataset": "digits", "options": {"objective": objective}}
        for name, objective in (("vit-s", "supervised"), ("vit-d", "dino"),
                                ("vit-t", "distilled"))}}
    plan = plan_of(config)
    runs = {run.models[0]: run for run in training_runs(plan, rows_of(plan))}
    assert {name: run.recipe for name, run in runs.items()} == {
        "vit-s": "vit-digits", "vit-d": "vit-digits objective=dino",
        "vit-t": "vit-digits objective=distilled"}
    for run in runs.values():
        cost = TRAINING_COSTS[run.recipe].seconds
        assert run.cpu_s == pytest.approx(cost * DIGITS * run.tokens * 40)
        assert "differ from the measured recipe" not in run.line()
    assert runs["vit-d"].cpu_s > 4 * runs["vit-s"].cpu_s  # DINO's views: the costlier recipe


def test_checkpoints_share_their_models_run_and_controls_train_nothing():
    plan = plan_of()
    runs = training_runs(plan, rows_of(plan))
    assert [run.models for run in runs] == [
        ("vit@seed0", "vit@seed0@epoch0", "vit@seed0@epoch5"),
        ("vit@seed1", "vit@seed1@epoch0", "vit@seed1@epoch5"), ("ft",)]
    vit, ft = runs[0], runs[2]
    assert (vit.rows, vit.tokens, vit.epochs) == (DIGITS, 17, 40)  # every epoch runs
    assert vit.cpu_s == pytest.approx(TRAINING_COSTS["vit-digits"].seconds * DIGITS * 17 * 40)
    assert ft.epochs == 20  # the measured median, capped by the model's max_epochs
    assert "early stopping" in ft.line() and "of its checkpoints" in vit.line()


def test_a_run_the_store_already_holds_is_not_priced_again():
    plan = plan_of()
    done = frozenset(prepare_key(name) for name in ("vit@seed0", "vit@seed0@epoch0",
                                                    "vit@seed0@epoch5", "ft"))
    assert [run.models[0] for run in training_runs(plan, rows_of(plan), done)] == ["vit@seed1"]


def test_a_recipe_without_a_measured_cost_says_how_to_measure_it(monkeypatch):
    monkeypatch.delitem(TRAINING_COSTS, "vit-digits")
    plan = plan_of()
    runs = training_runs(plan, rows_of(plan))
    assert runs[0].cpu_s is None
    assert "benchmarks/plan_costs.py training vit-digits TABLE" in runs[0].line()
    estimate = wall_estimate(plan, Pools(gpus=0, cpu_cores=2, extract_slots=2), runs)
    assert estimate.unpriced == ("vit-digits",)


def test_other_training_options_make_the_figure_a_rougher_estimate(monkeypatch):
    monkeypatch.setitem(TRAINING_COSTS, "vit-digits", TrainingCost(1e-5, "x", epochs="epochs"))
    config = {**CONFIG, "models": {"vit": {"source": "vit-digits", "dataset": "digits",
                                           "options": {"depth": 2, "epochs": 4}}}}
    plan = plan_of(config)
    (run,) = training_runs(plan, rows_of(plan))
    assert run.cpu_s == pytest.approx(1e-5 * DIGITS * 17 * 4)
    assert "differ from the measured recipe" in run.line()


def test_without_a_gpu_the_wall_time_is_the_work_over_the_workers_or_the_longest_run():
    plan = plan_of()
    runs = training_runs(plan, rows_of(plan))
    two = wall_estimate(plan, Pools(gpus=0, cpu_cores=2, extract_slots=2), runs)
    many = wall_estimate(plan, Pools(gpus=0, cpu_cores=1000, extract_slots=1000), runs)
    total = two.training_s + two.extract_s + two.test_s + two.nulls_s
    assert two.wall_s == pytest.approx(two.fixed_s + total / 2)
    assert many.wall_s == pytest.approx(many.fixed_s + many.longest_training_s)  # one thread


def test_with_gpus_training_and_extraction_share_the_gpu_workers_tests_the_cpus():
    plan = plan_of()
    runs = training_runs(plan, rows_of(plan))
    e = wall_estimate(plan, Pools(gpus=2, cpu_cores=8, extract_slots=2), runs)
    assert e.gpu and e.wall_s == pytest.approx(e.fixed_s + max(
        (e.training_s + e.extract_s) / 2, e.longest_training_s, (e.test_s + e.nulls_s) / 8))


def test_a_finished_store_costs_nothing_more():
    plan = plan_of({**CONFIG, "matched_nulls": {"trials": 1000}})
    done = frozenset(task.key for task in plan.tasks)
    assert set(pending_shares(plan, done).values()) == {0.0}
    assert null_seconds(plan, pending_shares(plan, frozenset())) > 0
    e = wall_estimate(plan, Pools(gpus=0, cpu_cores=2, extract_slots=2),
                      training_runs(plan, rows_of(plan), done), done)
    assert e.wall_s == 0


def test_sweep_plan_prints_the_runs_and_the_wall_time(tmp_path, capsys, monkeypatch):
    config = tmp_path / "sweep.yaml"
    config.write_text(json.dumps({**CONFIG, "store": str(tmp_path / "s.zarr")}))
    plan = plan_of({**CONFIG, "store": str(tmp_path / "s.zarr")})

    class Table:  # the measured datasets' tables: rows are what pricing reads
        def __init__(self, rows):
            self.table = type("T", (), {"target": [0] * rows})()

    datasets = {m.name: Table(DIGITS if m.name.startswith("vit") else 178) for m in plan.models}
    monkeypatch.setattr(runner, "sized_plan", lambda config, **_: (plan, {}, datasets))
    assert main(["plan", str(config)]) == 0
    out = capsys.readouterr().out
    assert "training first: 3 run(s)" in out
    assert "estimated wall time on the local default (" in out
    assert main(["plan", str(config), "--format", "json"]) == 0
    pricing = json.loads(capsys.readouterr().out)["pricing"]
    assert [run["models"][0] for run in pricing["training"]] == ["vit@seed0", "vit@seed1", "ft"]
    assert pricing["estimate"]["wall_s"] > pricing["estimate"]["longest_training_s"] > 0
    assert pricing["cluster"] is None
    assert main(["plan", str(config), "--cluster", str(REPO / "cluster.yaml")]) == 0
    assert "estimated wall time with --cluster (local): about" in capsys.readouterr().out

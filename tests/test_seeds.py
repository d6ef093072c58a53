"""Seed replicates: `seeds: [...]` on a trained model expands into `<name>@seed<k>` models (each
with its own control), each trained with its own seed; the report's across-seed table against
hand counts and a t-table value."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from storage.errors import InputError
from storage.query import open_results
from sweep.config.load import parse_config
from sweep.config.seeds import seed_groups
from sweep.driver.plan import ModelFacts, build_plan
from sweep.report.seeds import t_interval
from sweep.report.tables import build_report, render_json, render_markdown
from tests.store_fixtures import OK, FixtureModel, write_store

CONFIG = {
    "store": "/tmp/never-written.zarr",
    "datasets": {"wine": {"source": "sklearn:wine"},
                 "photos": {"source": "sklearn:sample_images"}},
    "models": {
        "ft": {"source": "ft-transformer", "dataset": "wine", "seeds": [0, 1, 2],
               "control": "random-init", "options": {"n_blocks": 2}},
        "vit": {"source": "tiny-vit", "dataset": "photos"},
    },
}


def config_with(**models):
    return parse_config({**CONFIG, "models": {**CONFIG["models"], **models}})


def test_seeds_expand_in_place_into_replicates_each_followed_by_its_control():
    config = parse_config(CONFIG)
    assert list(config.models) == [
        "ft@seed0", "ft@seed0@random-init", "ft@seed1", "ft@seed1@random-init",
        "ft@seed2", "ft@seed2@random-init", "vit"]
    assert config.models["ft@seed1"].options == {"n_blocks": 2, "seed": 1}
    assert config.models["ft@seed1@random-init"].options == {
        "n_blocks": 2, "seed": 1, "random_init": True}
    assert all(entry.seeds is None for entry in config.models.values())


def test_each_replicate_trains_with_its_own_seed_and_its_control_starts_from_it():
    config = parse_config(CONFIG)
    facts = {name: ModelFacts.from_counts(("a", "b"), 1, (14, 14)) for name in config.models}
    plans = {plan.name: plan for plan in build_plan(config, facts).models}
    for seed in (0, 1, 2):
        trained, control = plans[f"ft@seed{seed}"], plans[f"ft@seed{seed}@random-init"]
        assert (trained.spec.seed, control.spec.seed) == (seed, seed)
        assert control.spec.random_init and not trained.spec.random_init
    fingerprints = {plans[f"ft@seed{seed}"].fingerprint for seed in (0, 1, 2)}
    assert len(fingerprints) == 3
    prepares = [t.model for t in build_plan(config, facts).tasks if t.key.startswith("prepare-")]
    assert prepares == ["ft@seed0", "ft@seed1", "ft@seed2"]  # one training per seed


@pytest.mark.parametrize(
    ("models", "message"),
    [
        ({"vit": {"source": "tiny-vit", "dataset": "photos", "seeds": [0, 1]}},
         "models.vit.seeds: only a model the project trains"),
        ({"ft": {"source": "ft-transformer", "dataset": "wine", "seeds": [0, 1],
                 "options": {"seed": 3}}},
         "models.ft.options.seed: give either `seed` or `seeds`"),
        ({"ft": {"source": "ft-transformer", "dataset": "wine", "seeds": [1, 1]}},
         "models.ft.seeds: Value error, seeds repeat a value: [1, 1]"),
        ({"ft": {"source": "ft-transformer", "dataset": "wine", "seeds": []}},
         "models.ft.seeds: Value error, give at least one seed"),
        ({"ft@seed0": {"source": "ft-transformer", "dataset": "wine"}},
         "models.ft@seed0: invalid name"),
    ],
)
def test_bad_seed_entries_are_one_line_errors_naming_the_key(models, message):
    with pytest.raises(InputError) as caught:
        config_with(**models)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_seed_groups_find_the_replicates_but_not_their_controls():
    names = ["a@seed0", "a@seed0@random-init", "a@seed2", "b", "a@seedx"]
    assert seed_groups(names) == {"a": [(0, "a@seed0"), (2, "a@seed2")]}


def test_t_interval_against_the_t_table():
    # mean 0.3, sd 0.1, k = 3: half-width t(0.975, 2) * 0.1 / sqrt(3), t(0.975, 2) = 4.303
    mean, low, high = t_interval([0.2, 0.3, 0.4])
    assert mean == pytest.approx(0.3)
    assert (high - mean) == pytest.approx(4.303 * 0.1 / math.sqrt(3), abs=1e-4)
    assert (mean - low) == pytest.approx(high - mean)
    assert math.isnan(t_interval([0.5])[1]) and t_interval([0.5])[0] == 0.5
    assert t_interval([0.1, math.nan, 0.3])[0] == pytest.approx(0.2)  # no verdict: left out


def model_holding(k: int, n: int = 10) -> FixtureModel:
    """One layer, one token set: the first k of n inputs hold."""
    margin = np.full((n, 1, 1), 0.1)
    margin[:k] = 0.0
    return FixtureModel(margin=margin, status=np.full(margin.shape, OK, dtype=np.int8),
                        token_sets=("all",))


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """Seeds 0, 1, 2 hold on 2, 4, 6 of 10 inputs; their controls on 1, 1, 4 of 10."""
    models = {}
    for seed, (k, control) in enumerate([(2, 1), (4, 1), (6, 4)]):
        models[f"ft@seed{seed}"] = model_holding(k)
        models[f"ft@seed{seed}@random-init"] = model_holding(control)
    path = write_store(tmp_path_factory.mktemp("seeds") / "sweep.zarr", models)
    return build_report(open_results(path), store=str(path))


def test_the_report_gives_each_seed_the_mean_and_the_difference_across_seeds(report):
    (row,) = report.seeds.to_dict("records")
    assert (row["model"], row["token_set"], row["n_seeds"], row["seeds"]) == \
        ("ft", "all", 3, [0, 1, 2])
    assert row["rates"] == pytest.approx([0.2, 0.4, 0.6])
    assert row["rate_mean"] == pytest.approx(0.4)
    half = 4.303 * 0.2 / math.sqrt(3)  # sd of 0.2, 0.4, 0.6 is 0.2: 0.4 - half < 0
    assert (row["ci_low"], row["ci_high"]) == pytest.approx((0.0, 0.4 + half), abs=1e-4)
    assert row["control_rates"] == pytest.approx([0.1, 0.1, 0.4])
    assert row["differences"] == pytest.approx([0.1, 0.3, 0.2])
    assert row["difference_mean"] == pytest.approx(0.2)
    d_half = 4.303 * 0.1 / math.sqrt(3)
    assert (row["difference_ci_low"], row["difference_ci_high"]) == pytest.approx(
        (0.2 - d_half, 0.2 + d_half), abs=1e-4)


def test_the_seed_table_in_json_and_markdown(report):
    (record,) = json.loads(render_json(report))["seeds"]
    assert record["rates"] == pytest.approx([0.2, 0.4, 0.6]) and record["model"] == "ft"
    text = render_markdown(report)
    assert "## Seeds: the rate across training seeds" in text
    assert "| ft | all | 0, 1, 2 | 20.0%, 40.0%, 60.0% | 40.0% [" in text
    assert "| +10.0 pp, +30.0 pp, +20.0 pp | +20.0 pp [" in text


def test_a_sweep_trains_and_stores_each_seed_with_its_own_control(tmp_path):
    from sweep.config.load import load_config
    from sweep.driver.runner import InProcessExecutor, run_sweep

    (tmp_path / "sweep.yaml").write_text(
        "store: s.zarr\nshard_size: 16\nbaseline: null\nmatched_nulls: null\n"
        "datasets:\n  wine: {source: 'sklearn:wine', limit: 8}\n"
        "models:\n  ft: {source: ft-transformer, dataset: wine, seeds: [0, 1], "
        "control: random-init, options: {max_epochs: 2, n_blocks: 2, d_block: 8}}\n")
    config = load_config(tmp_path / "sweep.yaml")
    run_sweep(config, InProcessExecutor(), progress=False)
    tree = open_results(tmp_path / "s.zarr")
    assert list(tree.children) == ["ft@seed0", "ft@seed0@random-init", "ft@seed1",
                                   "ft@seed1@random-init"]
    records = [tree[f"ft@seed{seed}"].attrs["training"] for seed in (0, 1)]
    assert [r["hyperparameters"]["seed"] for r in records] == [0, 1]
    assert records[0]["history"] != records[1]["history"]  # two trainings, two draws
    ids = [tuple(tree[name]["input"].values) for name in tree.children]
    assert ids[0] == ids[1] and ids[2] == ids[3] and ids[0] != ids[2]  # each seed's test rows
    (row, _) = build_report(tree).seeds.to_dict("records")
    assert (row["model"], row["seeds"]) == ("ft", [0, 1])

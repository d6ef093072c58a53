"""Random-init controls in the config, the plan and the report: expansion into `<name>@random-init`
models, their specs and fingerprints, and the trained-vs-control table against hand counts and
Newcombe's (1998) published intervals."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest

from storage.errors import InputError
from storage.query import open_results
from storage.query.statistics import wilson_interval
from sweep.cli.entry import main
from sweep.config.load import parse_config
from sweep.driver.plan import ModelFacts, build_plan
from sweep.report.controls import newcombe_interval
from sweep.report.tables import build_report, render_json, render_markdown
from tests.store_fixtures import EMPTY, OK, FixtureModel, write_store
from workers.models.registry import resolve_model

CONFIG = {
    "store": "/tmp/never-written.zarr",
    "datasets": {"photos": {"source": "sklearn:sample_images"},
                 "wine": {"source": "sklearn:wine"}},
    "models": {
        "vit": {"source": "tiny-vit", "dataset": "photos", "batch_size": 3,
                "control": "random-init"},
        "ft": {"source": "ft-transformer", "dataset": "wine", "options": {"seed": 5},
               "control": "random-init"},
        "plain": {"source": "tiny-deit", "dataset": "photos"},
    },
}


def config_with(**models):
    return parse_config({**CONFIG, "models": {**CONFIG["models"], **models}})


def test_a_control_entry_adds_a_model_right_after_its_own_with_the_same_settings():
    config = parse_config(CONFIG)
    assert list(config.models) == ["vit", "vit@random-init", "ft", "ft@random-init", "plain"]
    control = config.models["vit@random-init"]
    assert (control.source, control.dataset, control.batch_size) == ("tiny-vit", "photos", 3)
    assert control.control is None
    assert config.models["ft@random-init"].options == {"seed": 5, "random_init": True}


def test_the_control_spec_is_the_model_spec_with_random_init():
    config = parse_config(CONFIG)
    facts = {name: ModelFacts.from_counts(("a", "b"), 2, (17, 17)) for name in config.models}
    plans = {plan.name: plan for plan in build_plan(config, facts).models}
    for name in ("vit", "ft"):
        trained, control = plans[name], plans[f"{name}@random-init"]
        assert control.spec.random_init and not trained.spec.random_init
        assert control.spec == trained.spec.__class__(**{**trained.spec.__dict__,
                                                        "random_init": True})
        assert control.dataset == trained.dataset
        assert control.fingerprint != trained.fingerprint
    assert plans["ft@random-init"].spec.seed == 5


@pytest.mark.parametrize(
    ("models", "message"),
    [
        ({"vit": {"source": "tiny-vit", "dataset": "photos", "control": "random"}},
         "models.vit.control: Input should be 'random-init'"),
        ({"vit@random-init": {"source": "tiny-vit", "dataset": "photos"}},
         "models.vit@random-init: invalid name"),
        ({"vit": {"source": "tiny-vit", "dataset": "photos", "options": {"random_init": True}}},
         "models.vit.options.random_init: not an option; write `control: random-init`"),
    ],
)
def test_bad_control_entries_are_one_line_errors_naming_the_key(models, message):
    with pytest.raises(InputError) as caught:
        config_with(**models)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_random_init_option_must_be_a_boolean():
    assert resolve_model("tiny-vit", random_init=True).random_init
    with pytest.raises(InputError, match=r"random_init='yes' must be true or false"):
        resolve_model("tiny-vit", random_init="yes")


# --- the report's table -------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("counts", "published"),
    [  # Newcombe (1998), Statistics in Medicine 17:873, Table II, method 10
        ((56, 70, 48, 80), (0.0524, 0.3339)),
        ((9, 10, 3, 10), (0.1705, 0.8090)),
        ((6, 7, 2, 7), (0.0582, 0.8062)),
        ((5, 56, 0, 29), (-0.0381, 0.1926)),
    ],
)
def test_newcombe_interval_reproduces_the_published_examples(counts, published):
    a, m, b, n = counts
    low, high = newcombe_interval(a / m, wilson_interval(a, m), b / n, wilson_interval(b, n))
    assert (round(low, 4), round(high, 4)) == published


def model_with(holding_per_layer: list[int], n_inputs: int, token_sets=("all",)) -> FixtureModel:
    """Layer l holds on its first holding_per_layer[l] inputs, in every token set."""
    layers = len(holding_per_layer)
    margin = np.full((n_inputs, layers, len(token_sets)), 0.1)
    for layer, k in enumerate(holding_per_layer):
        margin[:k, layer, :] = 0.0
    return FixtureModel(margin=margin, status=np.full(margin.shape, OK, dtype=np.int8),
                        token_sets=token_sets)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """m: 56 of 70 input-layer pairs hold (35 inputs x 2 layers: 30 + 26); its control 48 of 80
    (40 x 2: 20 + 28); on `content` the control lost a row at (input 0, layer 0): 47 of 79.
    solo has no control; orphan@random-init has no model."""
    trained = model_with([30, 26], 35, ("all", "content"))
    control = model_with([20, 28], 40, ("all", "content"))
    status = control.status.copy()
    status[0, 0, 1] = EMPTY
    control = FixtureModel(margin=control.margin, status=status, token_sets=control.token_sets)
    models = {"m": trained, "m@random-init": control, "solo": model_with([1], 2),
              "orphan@random-init": model_with([1], 2)}
    return write_store(tmp_path_factory.mktemp("controls") / "sweep.zarr", models)


@pytest.fixture(scope="module")
def report(store):
    return build_report(open_results(store), store=str(store))


def test_controls_table_against_hand_counts(report):
    table = report.controls
    assert table[["model", "control", "token_set"]].values.tolist() == [
        ["m", "m@random-init", "all"], ["m", "m@random-init", "content"]]
    every, content = table.to_dict("records")
    assert (every["holding"], every["cells"]) == (56, 70)
    assert (every["control_holding"], every["control_cells"]) == (48, 80)
    assert every["rate"] == pytest.approx(0.8) and every["control_rate"] == pytest.approx(0.6)
    assert every["difference"] == pytest.approx(0.2)
    assert (round(every["ci_low"], 4), round(every["ci_high"], 4)) == (0.0524, 0.3339)
    assert (content["control_holding"], content["control_cells"]) == (47, 79)
    assert content["difference"] == pytest.approx(0.8 - 47 / 79)


def test_controls_in_json_and_markdown(report):
    document = json.loads(render_json(report))
    record = document["controls"][0]
    assert {"model", "control", "token_set", "rate", "control_rate", "difference", "ci_low",
            "ci_high"} <= set(record)
    assert (record["model"], record["control"], record["token_set"]) == \
        ("m", "m@random-init", "all")
    assert {s["model"] for s in document["summary"]} >= {"m@random-init", "orphan@random-init"}
    text = render_markdown(report)
    assert "## Controls: trained model against its random initialisation" in text
    assert "| m | m@random-init | all (A) | 56/70 | 80.0% | 48/80 | 60.0% | +20.0 pp " \
        "[+5.2 pp, +33.4 pp] |" in text


def test_cli_writes_the_controls_table_as_csv(store, capsys):
    assert main(["report", str(store), "--format", "csv", "--table", "controls"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["model"], r["token_set"]) for r in rows] == [("m", "all"), ("m", "content")]
    assert float(rows[0]["difference"]) == pytest.approx(0.2)


def test_a_store_without_controls_says_so(tmp_path):
    path = write_store(tmp_path / "plain.zarr", {"solo": model_with([1], 2)})
    report = build_report(open_results(path))
    assert report.controls.empty
    assert "(no model with a control in this store)" in render_markdown(report)


def test_the_default_sweep_controls_minilm_and_every_seed_of_the_ft_models():
    from sweep.config.load import default_config_path, load_config

    models = load_config(default_config_path()).models
    fts = [f"{table}@seed{seed}" for table in ("ft-cancer", "ft-wine") for seed in (0, 1, 2)]
    for name in ("minilm-l6", *fts):
        assert models[f"{name}@random-init"].options.get("random_init") is True
    for name in fts:
        assert models[name].options == {"seed": int(name[-1])}  # the paper's recipe: defaults

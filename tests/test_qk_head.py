"""`qk-head`: the qk null at each model's own head dimension, known at plan time from the spec
alone, resolved per model to `qk-d<head_dim>` in the plan, the store and the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import zarr

from storage.errors import InputError
from storage.query import open_results
from sweep.config.load import load_config, parse_config
from sweep.driver.plan import build_plan
from sweep.driver.runner import InProcessExecutor, gather_facts, run_sweep
from sweep.report.tables import build_report, render_json
from workers.inputs import open_dataset
from workers.models.registry import resolve_model
from workers.models.token_layout import token_layout
from workers.nulls.baseline import chunk_span
from workers.nulls.matched import matched_holding, size_histograms
from workers.nulls.registry import get_null, parse_nulls, resolve_nulls

# Head width = hidden size / heads of each preset's config: the tiny presets 32 / 4, MiniLM
# 384 / 12; FT-Transformer d_block / 8 heads (the library's 128 at 2 blocks, 192 at 3).
HEAD_DIM = {"tiny-roberta": 8, "tiny-distilbert": 8, "tiny-dinov2-reg": 8, "tiny-vit": 8,
            "tiny-deit-distilled": 8, "minilm-l6": 32, "ft": 16}
DATASET = {"tiny-roberta": "topics", "tiny-distilbert": "topics", "minilm-l6": "topics",
           "tiny-dinov2-reg": "photos", "tiny-vit": "photos", "tiny-deit-distilled": "photos"}
FT = "{source: ft-transformer, dataset: wine, options: {max_epochs: 2, n_blocks: 2}}"


def write_config(folder: Path, models: dict[str, str], matched: str) -> Path:
    lines = [
        "store: sweep.zarr", "shard_size: 4", "retries: 0", "cache_dir: cache",
        f"matched_nulls: {matched}",
        "datasets:",
        "  photos: {source: 'sklearn:sample_images', limit: 3}",
        "  topics: {source: 'pydoc:topics', limit: 4}",
        "  wine: {source: 'sklearn:wine', limit: 5}",
        "models:",
        *(f"  {name}: {entry}" for name, entry in models.items()),
    ]
    path = folder / "sweep.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_qk_head_resolves_to_the_head_dimension_with_its_beta_and_without_repeats():
    names = parse_nulls("uniform, qk-head, qk-head-b2, qk-d32")
    assert resolve_nulls(names, 32, "m") == ("uniform", "qk-d32", "qk-d32-b2")
    assert resolve_nulls(names, 8, "m") == ("uniform", "qk-d8", "qk-d8-b2", "qk-d32")
    assert resolve_nulls(("uniform",), None, "m") == ("uniform",)
    with pytest.raises(InputError, match="model 'm': null 'qk-head' needs the model's head"):
        resolve_nulls(names, None, "m")


def test_qk_head_is_per_model_only():
    with pytest.raises(InputError, match="is per model"):
        get_null("qk-head")
    with pytest.raises(ValueError, match="baseline.nulls.*'qk-head' takes a model's head dim"):
        parse_config({"store": "/tmp/s.zarr",
                      "baseline": {"sizes": [2], "trials": 10, "nulls": ["qk-head"]}})


def test_head_dim_is_planned_per_family_from_the_spec_and_names_the_null_tasks(tmp_path):
    models = {name: f"{{source: {name}, dataset: {dataset}}}" for name, dataset in DATASET.items()}
    config = load_config(write_config(
        tmp_path, {**models, "ft": FT},
        "{nulls: [uniform, qk-head], trials: 1000, chunk_trials: 1000}"))
    facts = {name: gather_facts(config, name) for name in config.models}
    assert {name: f.head_dim for name, f in facts.items()} == HEAD_DIM
    keys = {t.key for t in build_plan(config, facts).tasks if t.stage == "nulls"}
    assert keys == {f"nulls-{name}-{null}-c00000"
                    for name, d in HEAD_DIM.items() for null in ("uniform", f"qk-d{d}")}
    # the paper's FT-Transformer (3 blocks, d_block 192, 8 heads): 24
    wine = open_dataset(config.datasets["wine"].to_spec())
    assert token_layout(resolve_model("ft-transformer"), wine).head_dim == 24


def _null_records(store: Path) -> dict[tuple[str, str, str], dict]:
    document = json.loads(render_json(build_report(open_results(store), store=str(store))))
    return {(r["model"], r["token_set"], r["null"]): r for r in document["nulls"]}


def _assert_qk_head_counts(store: Path, model: str, null: str) -> None:
    """The stored qk-head counts are the size-matched counts of `null` (qk-d<head_dim>)."""
    results = zarr.open_group(str(store / model / "results"), mode="r")
    histograms = size_histograms(results["n_kept"][:][:, :, 0], results["status"][:][:, :, 0])
    records = _null_records(store)
    for token_set, histogram in zip(("all", "content"), histograms, strict=True):
        expected = matched_holding(histogram, 1000, chunk_span(1000, 1000, 0), model=model,
                                   token_set=token_set, null=null, seed=0)
        record = records[(model, token_set, null)]
        assert (record["trials"], record["holding"], record["disagreements"]) == expected


def test_a_sweep_with_qk_head_runs_and_reports_the_resolved_null(tmp_path):
    config = load_config(write_config(
        tmp_path, {"text": "{source: tiny-roberta, dataset: topics}",
                   "vit": "{source: tiny-vit, dataset: photos}"},
        "{nulls: [uniform, qk-head], trials: 1000, chunk_trials: 1000}"))
    assert run_sweep(config, InProcessExecutor(), progress=False).exit_code == 0
    store = Path(config.store)
    assert {key[2] for key in _null_records(store)} == {"uniform", "qk-d8"}
    assert zarr.open_group(str(store / "vit"), mode="r").attrs["head_dim"] == 8
    _assert_qk_head_counts(store, "text", "qk-d8")


def test_a_store_planned_before_head_dim_opens_and_gains_qk_head_nulls(tmp_path):
    models = {"text": "{source: tiny-roberta, dataset: topics}"}
    config = load_config(write_config(tmp_path, models, "null"))
    assert run_sweep(config, InProcessExecutor(), progress=False).exit_code == 0
    store = Path(config.store)
    group = zarr.open_group(str(store / "text"), mode="r+")
    del group.attrs["head_dim"]  # as a store planned before head_dim was recorded
    assert build_report(open_results(store), store=str(store)).nulls.empty  # opens, no nulls
    config = load_config(write_config(
        tmp_path, models, "{nulls: [uniform, qk-head], trials: 1000, chunk_trials: 1000}"))
    summary = run_sweep(config, InProcessExecutor(), progress=False)
    assert summary.exit_code == 0
    assert all(key.startswith("nulls-text-") for key in summary.completed)
    assert zarr.open_group(str(store / "text"), mode="r").attrs["head_dim"] == 8
    _assert_qk_head_counts(store, "text", "qk-d8")

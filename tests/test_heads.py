"""Per-head analysis: option `heads` (`mean`, the default: one head-averaged map per layer;
`each`: every head kept) fills the store's `head` dimension, each head's (layer, T, T) stack is
tested on its own, and the report counts input-layer-head cells; stores from before the head
dimension are read, and resumed, as one `mean` head."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr

from storage import markers
from storage.errors import InputError
from storage.integrity import checksums
from storage.layout import (
    COMPACT_STAGE,
    LEGACY_ATTENTION_DIMS,
    LEGACY_RESULT_DIMS,
    RESULT_VARS,
    RESULTS_GROUP,
)
from storage.markers import marker_name
from storage.query import holding_rates, open_results
from sweep.cli.entry import main
from sweep.config.load import load_config, parse_config
from sweep.driver.runner import InProcessExecutor, run_sweep
from sweep.report.tables import build_report, render_json, render_markdown
from tests.store_fixtures import hand_store
from workers.exact.equality import check, restrict
from workers.exact.token_kinds import keep_mask, special_mask
from workers.inputs import DatasetSpec, open_dataset
from workers.models.extraction import load_extractor
from workers.models.registry import resolve_model
from workers.models.token_layout import token_layout
from workers.tasks.shards import shard_chunks

TOKEN_SETS = ("all", "content")
SWEEP = """\
store: sweep.zarr
shard_size: 2
token_sets: [all, content]
matched_nulls: null
datasets:
  photos: {source: 'sklearn:sample_images', limit: 3}
models:
"""


def sweep(folder: Path, models: dict[str, str]) -> list[str]:
    """Run a sweep of `models` (name -> YAML entry) in-process into folder/sweep.zarr; the keys
    of the tasks it ran."""
    path = folder / "sweep.yaml"
    path.write_text(SWEEP + "".join(f"  {name}: {entry}\n" for name, entry in models.items()))
    summary = run_sweep(load_config(path), InProcessExecutor(), progress=False)
    assert summary.exit_code == 0 and not summary.failed
    return sorted(summary.completed)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """tiny-vit (2 layers, 4 heads) head-averaged and with every head, on 3 pictures."""
    folder = tmp_path_factory.mktemp("heads")
    sweep(folder, {
        "avg": "{source: tiny-vit, dataset: photos}",
        "each": "{source: tiny-vit, dataset: photos, options: {heads: each}}",
    })
    return folder / "sweep.zarr"


def test_heads_each_stores_every_head_of_every_layer(store):
    each = zarr.open_group(str(store / "each"), mode="r")
    n_heads = token_layout(resolve_model("tiny-vit", heads="each")).n_heads
    assert n_heads == 4 and each.attrs["n_heads"] == 4
    assert each["head"][:].tolist() == ["0", "1", "2", "3"]
    assert each["attention"].shape == (3, 2, 4, 17, 17)  # (input, layer, head, query, key)
    assert each["attention"].chunks == (1, 2, 4, 17, 17)  # one input per chunk
    for var in RESULT_VARS:
        assert each[RESULTS_GROUP][var].shape == (3, 2, 4, 2)  # (input, layer, head, token_set)
        assert each[RESULTS_GROUP][var].shards == (3, 2, 4, 2)  # finished: one object
        # (storage.compaction; one chunk per shard of 2 while it was tested)
    rows = each["attention"][...].astype(np.float64).sum(-1)
    np.testing.assert_allclose(rows, 1.0, atol=1e-5)  # each head's rows are stochastic


def test_the_mean_over_stored_heads_is_the_head_averaged_attention(store):
    heads = zarr.open_group(str(store / "each"), mode="r")["attention"][...]
    averaged = zarr.open_group(str(store / "avg"), mode="r")["attention"][...]
    assert averaged.shape == (3, 2, 1, 17, 17)  # the default: one head
    np.testing.assert_allclose(heads.mean(axis=2, keepdims=True), averaged, rtol=0, atol=1e-7)
    assert not np.allclose(heads[:, :, :1], heads[:, :, 1:2], atol=1e-3)  # heads differ


def test_each_heads_verdicts_are_check_on_that_heads_matrices(store):
    group = zarr.open_group(str(store / "each"), mode="r")
    results = group[RESULTS_GROUP]
    for i in range(3):
        t = int(group["n_tokens"][i])
        kinds = group["token_kind"][i, :t]
        for h in range(4):
            for s, token_set in enumerate(TOKEN_SETS):
                keep = keep_mask(kinds, token_set)
                for layer in range(2):
                    r = restrict(group["attention"][i, layer, h, :t, :t].astype(np.float64), keep)
                    expected = check(r.matrix, tol=1e-12, special=special_mask(kinds)[r.kept])
                    cell = (i, layer, h, s)
                    for name in ("kappa", "kappa_factor", "margin", "holds",
                                 "holds_by_characterisation", "slack"):
                        assert results[name][cell] == getattr(expected, name)[0], (name, cell)


def test_the_default_keeps_one_mean_head_with_the_extractors_values(store):
    group = zarr.open_group(str(store / "avg"), mode="r")
    assert group["head"][:].tolist() == ["mean"] and group.attrs["n_heads"] == 1
    assert "heads" not in group.attrs["model_spec"]  # the default spec, its fingerprint as before
    dataset = open_dataset(DatasetSpec(kind="image", source="sklearn:sample_images", limit=3))
    outs = load_extractor(resolve_model("tiny-vit"), device="cpu").extract(
        dataset.load(range(3)), dataset.ids)
    for i, out in enumerate(outs):
        assert out.attention.shape == (2, 17, 17)  # (layer, query, key): heads averaged
        np.testing.assert_array_equal(group["attention"][i, :, 0], out.attention)


def test_rates_count_input_layer_head_cells_and_the_report_adds_a_per_head_table(store):
    tree = open_results(store)
    assert tree["each"]["head"].values.tolist() == ["0", "1", "2", "3"]
    summary = holding_rates(tree, by=("model", "token_set"))
    cells = summary.set_index(["model", "token_set"])["cells"]
    assert cells[("avg", "all")] == 3 * 2 and cells[("each", "all")] == 3 * 2 * 4
    inputs = summary.set_index(["model", "token_set"])["inputs"]
    assert inputs[("avg", "all")] == inputs[("each", "all")] == 3
    by_head = holding_rates(tree, by=("model", "head", "token_set"))
    assert by_head.loc[by_head["model"] == "each", "head"].unique().tolist() == ["0", "1", "2",
                                                                                  "3"]
    report = build_report(tree, str(store))
    assert set(report.heads["model"]) == {"each"}
    assert report.heads["cells"].tolist() == [3 * 2] * 8  # per head and token set
    assert "input-layer-head cells" in render_markdown(report)
    assert len(json.loads(render_json(report))["heads"]) == 8


def test_a_head_averaged_store_reports_as_before(tmp_path):
    report = build_report(open_results(hand_store(tmp_path / "s.zarr")))
    assert report.heads is None
    assert "heads" not in json.loads(render_json(report))
    assert "input-layer-head" not in render_markdown(report)


def test_a_store_from_before_the_head_dimension_is_reported_as_one_mean_head(tmp_path):
    current = hand_store(tmp_path / "current.zarr")
    legacy = tmp_path / "legacy.zarr"
    shutil.copytree(current, legacy)
    _to_legacy(legacy)
    assert zarr.open_array(str(legacy / "alpha/results/kappa")).metadata.dimension_names == \
        LEGACY_RESULT_DIMS
    tree = open_results(legacy)
    assert tree["alpha"]["head"].values.tolist() == ["mean"]
    assert tree["alpha"]["kappa"].dims == ("input", "layer", "head", "token_set")
    before = json.loads(render_json(build_report(open_results(current))))
    after = json.loads(render_json(build_report(tree)))
    assert {**after, "store": ""} == {**before, "store": ""}


def test_a_store_from_before_the_head_dimension_resumes_in_its_own_layout(tmp_path):
    models = {"avg": "{source: tiny-vit, dataset: photos}"}
    sweep(tmp_path, models)
    store = tmp_path / "sweep.zarr"
    done = {var: zarr.open_array(str(store / "avg/results" / var))[...][:, :, 0]
            for var in RESULT_VARS}
    attention = zarr.open_array(str(store / "avg/attention"))[...][:, :, 0]
    _to_legacy(store, keep_shards=1)  # shard 1 (input 2) lost: its chunks read as fill values
    assert np.isnan(zarr.open_array(str(store / "avg/results/kappa"))[2]).all()
    assert sweep(tmp_path, models) == ["extract-avg-00001", "test-avg-00001"]
    group = zarr.open_group(str(store / "avg"), mode="r")
    assert group["attention"].metadata.dimension_names == LEGACY_ATTENTION_DIMS
    np.testing.assert_array_equal(group["attention"][...], attention)
    for var, values in done.items():
        array = group[RESULTS_GROUP][var]
        assert array.metadata.dimension_names == LEGACY_RESULT_DIMS
        np.testing.assert_array_equal(array[...], values, err_msg=var)


def test_heads_is_checked_at_config_load_naming_the_model_and_the_values(tmp_path):
    data = {"store": str(tmp_path / "s.zarr"),
            "datasets": {"photos": {"source": "sklearn:sample_images"}},
            "models": {"vit": {"source": "tiny-vit", "dataset": "photos",
                               "options": {"heads": "all"}}}}
    with pytest.raises(InputError) as caught:
        parse_config(data)
    assert str(caught.value) == ("models.vit: model 'tiny-vit': option heads='all' must be one "
                                 "of ['mean', 'each']")
    data["models"]["vit"]["source"] = "hf:some/hub-model"  # checked before the hub is asked
    with pytest.raises(InputError, match="^models.vit: model 'hf:some/hub-model': option heads"):
        parse_config(data)


@pytest.mark.parametrize("source", ["tiny-roberta", "tiny-vit", "ft-transformer"])
def test_every_family_accepts_heads_and_its_layout_knows_the_head_count(source):
    spec = resolve_model(source, heads="each")
    assert spec.heads == "each" and spec.to_dict()["heads"] == "each"
    assert "heads" not in resolve_model(source).to_dict()
    dataset = open_dataset(DatasetSpec(kind="tabular", source="sklearn:wine", limit=4)) \
        if source == "ft-transformer" else None
    assert token_layout(spec, dataset).n_heads == {"tiny-roberta": 4, "tiny-vit": 4,
                                                   "ft-transformer": 8}[source]


def test_changing_heads_on_an_existing_store_is_refused(store, tmp_path):
    config = store.parent / "sweep.yaml"
    text = config.read_text().replace("{source: tiny-vit, dataset: photos}\n",
                                      "{source: tiny-vit, dataset: photos, options: {heads: "
                                      "each}}\n", 1)
    changed = tmp_path / "sweep.yaml"
    changed.write_text(text.replace("store: sweep.zarr", f"store: {store}"))
    with pytest.raises(InputError, match=r"models\.avg\.model\.heads") as caught:
        run_sweep(load_config(changed), InProcessExecutor(), progress=False)
    assert "\n" not in str(caught.value)


def _to_legacy(store: Path, keep_shards: int | None = None) -> None:
    """Rewrite every model group of `store` as a store from before the head dimension: no
    `head` array or `n_heads` attr, attention (input, layer, query, key) and results (input,
    layer, token_set) holding the same values. With `keep_shards`, the shards from there on lose
    their data and markers (as if the run stopped there), and the kept shards' markers vouch for
    their chunks in the old layout."""
    root = zarr.open_group(str(store), mode="r+", use_consolidated=False)  # as sweep writes
    for name in root.attrs["models"]:
        group = root[name]
        size, n = group.attrs["shard_size"], group.attrs["n_inputs"]
        stop = None if keep_shards is None else keep_shards * size
        del group["head"]
        del group.attrs["n_heads"]
        _squeeze(group, "attention", LEGACY_ATTENTION_DIMS, stop)
        for var in RESULT_VARS:  # one chunk per shard, as results were before compaction
            _squeeze(group[RESULTS_GROUP], var, LEGACY_RESULT_DIMS, stop, rows=size)
        markers.clear(store, name, COMPACT_STAGE)  # stores then were never compacted
        if keep_shards is None:
            continue
        for shard in range(group.attrs["n_shards"]):
            start, end = shard * size, min(shard * size + size, n)
            for stage, owner, names in (
                    ("extract", group, ("attention", "n_tokens", "token_kind", "input_digest")),
                    ("test", group[RESULTS_GROUP], tuple(RESULT_VARS))):
                if shard >= keep_shards:
                    markers.clear(store, name, marker_name(stage, shard))
                    continue
                files = shard_chunks(owner, names, shard, start, end)
                markers.mark_done(store, name, marker_name(stage, shard), checksums(store, files))


def _squeeze(group: zarr.Group, name: str, dims: tuple[str, ...], stop: int | None,
             rows: int | None = None) -> None:
    old = group[name]
    values = old[...][:, :, 0]
    chunks = (rows or old.chunks[0],) + old.chunks[1:2] + old.chunks[3:]
    fill, attributes = old.fill_value, dict(old.attrs)
    del group[name]
    new = group.create_array(name, shape=values.shape, chunks=chunks, dtype=values.dtype,
                             fill_value=fill, dimension_names=dims, attributes=attributes)
    new[:stop] = values[:stop]


def test_sweep_extract_keeps_every_head_with_heads_each(tmp_path):
    out = tmp_path / "vit.npz"
    assert main(["extract", "tiny-vit", "sklearn:sample_images", "--limit", "1", "--heads",
                 "each", "--out", str(out)]) == 0
    assert np.load(out)["attention_0"].shape == (2, 4, 17, 17)  # (layer, head, query, key)


def test_sweep_plan_shows_the_heads_each_model_keeps(tmp_path, capsys):
    config = tmp_path / "sweep.yaml"
    config.write_text(SWEEP + "  avg: {source: tiny-vit, dataset: photos}\n"
                      "  each: {source: tiny-vit, dataset: photos, options: {heads: each}}\n")
    assert main(["plan", str(config)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line.split() for line in lines if line.startswith("model "))
    table = lines[lines.index(next(line for line in lines if line.startswith("model "))):]
    rows = {}
    for line in table:  # the table's own rows (the attention section below names them again)
        if line.split()[:1] in (["avg"], ["each"]):
            rows.setdefault(line.split()[0], line.split())
    column = header.index("heads")
    assert rows["avg"][column] == "1" and rows["each"][column] == "4"


def test_the_per_head_finding_is_paired_over_inputs_under_the_bootstrap(store):
    """Per head and head mean are measured on the same inputs: under `--ci bootstrap` (the
    default) their difference gets the paired bootstrap interval over those inputs, labelled so;
    under `--ci wilson`, Newcombe's from the two Wilson intervals."""
    from storage.query.bootstrap import paired_difference_interval
    from sweep.report.intervals import Bootstrap, per_input_counts

    tree = open_results(store)
    how = Bootstrap(resamples=500, seed=3)
    report = build_report(tree, str(store), ci="bootstrap", bootstrap=how)
    heads = report.findings[report.findings["kind"] == "per_head_vs_head_mean"]
    assert heads["model"].tolist() == ["each", "each"]
    assert set(heads["ci_method"]) == {"bootstrap"}
    counts = per_input_counts(tree, report.tol)
    for record in heads.to_dict("records"):
        each, mean = counts[("each", record["token_set"])], counts[("avg", record["token_set"])]
        assert each[0].tolist() == mean[0].tolist()  # the same inputs, in the same order
        expected = paired_difference_interval(each[1], each[2], mean[1], mean[2], 500,
                                              how.rng("heads", "each", record["token_set"]))
        assert (record["ci_low"], record["ci_high"]) == pytest.approx(expected, nan_ok=True)
    wilson = build_report(tree, str(store), ci="wilson").findings
    assert set(wilson.loc[wilson["kind"] == "per_head_vs_head_mean", "ci_method"]) == {
        "newcombe"}

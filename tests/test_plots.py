"""The figures carry the comparison: per model and token set, the model beside its random-init
control and (depth) the bands of its size-matched nulls; margins as ECDFs in small multiples."""

from __future__ import annotations

import math

import numpy as np
import pytest

from storage.layout import ResultStatus
from storage.query import open_results
from storage.store import create_root, ensure_matched_nulls
from sweep.driver.plan import NullTask
from sweep.report.plots import depth_figure, margin_figure, panels, weights_label
from sweep.report.tables import build_report
from tests.store_fixtures import FixtureModel, write_store
from workers.nulls.baseline import chunk_span
from workers.tasks.nulls import run_null

TOKEN_SETS = ("all", "content")


def model_with(holding_per_layer: list[int], n_inputs: int) -> FixtureModel:
    """Layer l holds on its first holding_per_layer[l] inputs, on every token set."""
    margin = np.full((n_inputs, len(holding_per_layer), len(TOKEN_SETS)), 0.1)
    for layer, k in enumerate(holding_per_layer):
        margin[:k, layer, :] = 0.0
    return FixtureModel(margin=margin, status=np.full(margin.shape, ResultStatus.OK, np.int8),
                        token_sets=TOKEN_SETS, n_tokens=np.full(n_inputs, 4), t_max=4)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """m (3 layers: 6, 3, 1 of 8 hold), its control (2, 4, 8 of 8), solo (no control); m's
    size-matched nulls uniform and softmax-b4, computed by the real task body."""
    path = write_store(tmp_path_factory.mktemp("plots") / "s.zarr", {
        "m": model_with([6, 3, 1], 8), "m@random-init": model_with([2, 4, 8], 8),
        "solo": model_with([1, 1, 1], 2)})
    nulls = ("uniform", "softmax-b4")
    ensure_matched_nulls(create_root(path), "m", nulls=nulls, token_sets=TOKEN_SETS, trials=1000,
                         seed=0, chunk_trials=1000, n_chunks=1, tol=1e-12)
    for index, null in enumerate(nulls):
        run_null(NullTask(f"nulls-m-{null}-c00000", str(path), "m", null, index, 0,
                          chunk_span(1000, 1000, 0), TOKEN_SETS, 0, 1e-12))
    return open_results(path)


def by_title(figure) -> dict[str, object]:
    return {ax.get_title().split("\n")[0]: ax for ax in figure.axes if ax.get_visible()}


def test_controls_share_their_models_panels():
    assert panels(["m", "m@random-init", "solo", "orphan@random-init"]) == [
        ("m", "m@random-init"), ("solo", None), ("orphan@random-init", None)]


def test_depth_draws_each_model_with_its_control_and_null_bands(tree):
    report = build_report(tree)
    axes = by_title(depth_figure(report))
    assert sorted(axes) == sorted(f"{m} · {r}" for m in ("m", "solo") for r in (
        "all (A)", "content (A[C,C], renormalised)"))
    ax = axes["m · all (A)"]
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines["trained model"].get_ydata()) == pytest.approx([6 / 8, 3 / 8, 1 / 8])
    assert list(lines["random-init control"].get_ydata()) == pytest.approx([2 / 8, 4 / 8, 1.0])
    bands = {patch.get_label() for patch in ax.patches}
    assert bands == {"size-matched null: uniform", "size-matched null: softmax-b4"}
    null = report.nulls[(report.nulls["model"] == "m") & (report.nulls["token_set"] == "all")
                        & (report.nulls["null"] == "uniform")].iloc[0]
    band = next(p for p in ax.patches if p.get_label() == "size-matched null: uniform")
    low, high = band.get_path().get_extents(band.get_transform() - ax.transData).intervaly
    assert (low, high) == pytest.approx((null["ci_low"], null["ci_high"]))
    solo = axes["solo · all (A)"]
    assert [line.get_label() for line in solo.get_lines()] == ["trained model"]
    assert not solo.patches


def test_margin_ecdfs_read_the_holding_rate_at_the_tolerance(tree):
    report = build_report(tree)
    axes = by_title(margin_figure(tree, 1e-12))
    assert len(axes) == 4
    ax = axes["m · content (A[C,C], renormalised)"]
    for label, model in (("model", "m"), ("random-init control", "m@random-init")):
        line = next(line for line in ax.get_lines() if line.get_label() == label)
        x, y = line.get_xdata(), line.get_ydata()
        at_tol = y[np.searchsorted(x, math.log10(1e-12), side="right") - 1]
        rate = report.summary[(report.summary["model"] == model)
                              & (report.summary["token_set"] == "content")]["rate"].item()
        assert at_tol == pytest.approx(rate)
    legend = {text.get_text() for legend in ax.figure.legends for text in legend.get_texts()}
    # "model": the fixture's groups record no spec, so what their weights are is unknown
    assert legend == {"model", "random-init control", "tolerance 1e-12"}


def test_a_panel_without_null_bands_says_so(tree):
    axes = by_title(depth_figure(build_report(tree)))
    notes = {title: [t.get_text() for t in ax.texts] for title, ax in axes.items()}
    assert not any("no null bands" in text for text in notes["m · all (A)"])
    assert any(text.startswith("no null bands") for text in notes["solo · all (A)"])


@pytest.mark.parametrize(("spec", "label"), [
    ({"family": "hf", "pretrained": True}, "pretrained model"),
    ({"family": "hf", "pretrained": False}, "random weights (untrained)"),
    ({"family": "ft-transformer", "pretrained": False}, "trained model"),
    ({"family": "hf", "pretrained": True, "random_init": True}, "random-init control"),
    (None, "model"),
])
def test_legends_say_what_the_weights_are(tmp_path, spec, label):
    import xarray as xr

    attrs = {} if spec is None else {"fingerprint_inputs": {"model": spec}}
    tree = xr.DataTree.from_dict({"/x": xr.Dataset(attrs=attrs)})
    assert weights_label(tree, "x") == label
    figure = depth_figure(build_report(open_results(write_store(
        tmp_path / "s.zarr", {"x": model_with([1, 2], 2)}))), labels={"x": label})
    ax = by_title(figure)["x · all (A)"]
    assert [line.get_label() for line in ax.get_lines()] == [label]

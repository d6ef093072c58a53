"""Size-matched nulls: the sizes drawn, chunking independence, the task, and the lifts reported."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from storage.errors import InputError
from storage.layout import ResultStatus
from storage.query import open_results
from storage.store import create_root, ensure_matched_nulls
from sweep.config.load import parse_config
from sweep.driver.plan import ModelFacts, NullTask, build_plan
from sweep.driver.runner import InProcessExecutor
from sweep.report.nulls import newcombe_interval
from sweep.report.tables import build_report, render_json, render_markdown
from tests.store_fixtures import FixtureModel, write_store
from workers.nulls import matched
from workers.nulls.baseline import chunk_span
from workers.nulls.matched import SizeHistogram, matched_holding, matched_key, size_histograms
from workers.tasks.nulls import run_null

OK, EMPTY, PENDING = ResultStatus.OK, ResultStatus.EMPTY_ROW, ResultStatus.NOT_COMPUTED


def test_histogram_counts_tested_cells_of_two_or_more_tokens():
    # (input, layer, token_set): 3 inputs, 2 layers, token sets (all, content)
    n_kept = np.array([[[5, 4], [5, 4]], [[3, 1], [3, 1]], [[5, 4], [5, 4]]])
    status = np.full(n_kept.shape, OK, dtype=np.int8)
    status[2, 1, :] = EMPTY  # a layer that lost a row: not a tested matrix
    every, content = size_histograms(n_kept, status)
    assert (every.sizes, every.counts) == ((3, 5), (2, 3))
    assert (content.sizes, content.counts) == ((4,), (3,))  # n = 1 left out: no pair
    status[0, 0, 0] = PENDING
    with pytest.raises(InputError, match="1 result cells are not computed yet"):
        size_histograms(n_kept, status)


def test_trials_take_the_sorted_sizes_in_order():
    histogram = SizeHistogram(sizes=(3, 5, 9), counts=(1, 3, 2))  # sorted cells 3 5 5 5 9 9
    assert histogram.trial_sizes(6, 0, 6).tolist() == [3, 5, 5, 5, 9, 9]  # T = N: each once
    assert histogram.trial_sizes(12, 0, 12).tolist() == [3, 3, 5, 5, 5, 5, 5, 5, 9, 9, 9, 9]
    assert histogram.trial_sizes(3, 0, 3).tolist() == [3, 5, 9]  # T < N: cells 0, 2, 4
    assert histogram.trial_sizes(12, 5, 9).tolist() == [5, 5, 5, 9]  # any window of trials
    # every cell gets floor(T/N) or ceil(T/N) trials
    for trials in (1, 7, 1000, 2501):
        sizes = histogram.trial_sizes(trials, 0, trials)
        per_size = {n: int((sizes == n).sum()) for n in histogram.sizes}
        for n, count in zip(histogram.sizes, histogram.counts, strict=True):
            assert math.floor(trials * count / 6) <= per_size[n] <= math.ceil(trials * count / 6)


def test_the_drawn_sizes_are_exactly_the_runs(monkeypatch):
    seen = []
    monkeypatch.setattr(matched, "count_holding",
                        lambda null, rng, n, count, tol: seen.append((n, count)) or (0, 0))
    histogram = SizeHistogram(sizes=(2, 7), counts=(3, 1))
    done = matched_holding(histogram, 2500, chunk_span(2500, 1000, 0), model="m",
                           token_set="all", null="uniform", seed=0)
    # cells 2 2 2 7: trials [0, 1875) take n = 2, [1875, 2500) n = 7
    assert seen == [(2, 1000)] and done == (1000, 0, 0)  # block 0
    seen.clear()
    matched_holding(histogram, 2500, chunk_span(2500, 2000, 0), model="m", token_set="all",
                    null="uniform", seed=0)
    assert seen == [(2, 1000), (2, 875), (7, 125)]  # blocks 0 and 1
    seen.clear()
    matched_holding(histogram, 2500, chunk_span(2500, 1000, 2), model="m", token_set="all",
                    null="uniform", seed=0)
    assert seen == [(7, 500)]


@pytest.mark.parametrize("null", ["uniform", "softmax-b2"])
def test_counts_do_not_depend_on_the_chunking(null):
    histogram = SizeHistogram(sizes=(2, 4, 6), counts=(2, 5, 1))
    trials = 4300

    def total(chunk_trials: int) -> tuple[int, ...]:
        chunks = -(-trials // chunk_trials)
        parts = [matched_holding(histogram, trials, chunk_span(trials, chunk_trials, c),
                                 model="m", token_set="content", null=null, seed=4)
                 for c in range(chunks)]
        return tuple(map(sum, zip(*parts, strict=True)))

    whole = total(5000)
    assert whole[0] == trials
    assert total(1000) == whole == total(2000)


def test_streams_are_per_model_token_set_and_null():
    histogram = SizeHistogram(sizes=(5,), counts=(1,))
    block = [(0, 1000)]

    def holding(**names) -> int:
        return matched_holding(histogram, 1000, block, seed=0,
                               **{"model": "a", "token_set": "all", "null": "uniform", **names})[1]

    counts = [holding(), holding(model="b"), holding(token_set="content"),
              holding(null="softmax-b1")]
    assert len(set(counts)) == 4
    assert holding() == holding()  # deterministic
    assert matched_key("a", "all", "uniform", 3)[-1] == 3


def test_no_tested_cell_draws_nothing():
    empty = SizeHistogram(sizes=(), counts=())
    assert matched_holding(empty, 1000, [(0, 1000)], model="m", token_set="all",
                           null="uniform", seed=0) == (0, 0, 0)


def test_n_two_matched_null_is_a_half():
    histogram = SizeHistogram(sizes=(2,), counts=(7,))
    trials, holding, disagreements = matched_holding(
        histogram, 4000, chunk_span(4000, 4000, 0), model="m", token_set="all",
        null="softmax-b0.5", seed=1)
    low, high = newcombe_interval(holding, trials, 1, 2)[1:]  # loose: not a test of Newcombe
    assert trials == 4000 and disagreements == 0 and abs(holding / trials - 0.5) < 0.03
    assert low < 0 < high


def test_newcombe_matches_the_published_example():
    # Newcombe (1998), Statistics in Medicine 17:873, Table II, method 10 (hybrid score):
    # (a) 56/70 - 48/80: 0.0524 to 0.3339; (b) 9/10 - 3/10: 0.1705 to 0.8090;
    # (e) 5/56 - 0/29: -0.0381 to 0.1926.
    delta, low, high = newcombe_interval(56, 70, 48, 80)
    assert delta == pytest.approx(0.2)
    assert (round(low, 4), round(high, 4)) == (0.0524, 0.3339)
    assert [round(v, 4) for v in newcombe_interval(9, 10, 3, 10)[1:]] == [0.1705, 0.8090]
    assert [round(v, 4) for v in newcombe_interval(5, 56, 0, 29)[1:]] == [-0.0381, 0.1926]
    assert all(math.isnan(v) for v in newcombe_interval(1, 0, 1, 2))


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One model, 4 inputs x 2 layers, token sets (all, content), n_tokens 3, 3, 6, 2; its
    size-matched nulls computed by the real task body."""
    margin = np.zeros((4, 2, 2))
    margin[0] = 0.1  # input 0 fails everywhere: 6/8 hold on each token set
    path = write_store(tmp_path_factory.mktemp("matched") / "s.zarr", {
        "m": FixtureModel(margin=margin, status=np.full((4, 2, 2), OK, dtype=np.int8),
                          n_tokens=np.array([3, 3, 6, 2]), t_max=6),
    })
    ensure_matched_nulls(create_root(path), "m", nulls=("uniform", "softmax-b4"),
                         token_sets=("all", "content"), trials=2000, seed=0, chunk_trials=1000,
                         n_chunks=2, tol=1e-12)
    for null_index, null in enumerate(("uniform", "softmax-b4")):
        for chunk in range(2):
            run_null(NullTask(f"nulls-m-{null}-c{chunk:05d}", str(path), "m", null, null_index,
                              chunk, chunk_span(2000, 1000, chunk), ("all", "content"), 0, 1e-12))
    return path


def test_the_task_stores_the_counts_of_the_models_own_sizes(store):
    # content drops token 0 (CLS): n_kept 2, 2, 5, 1 -> the n = 1 input is left out
    sizes = {"all": SizeHistogram((2, 3, 6), (2, 4, 2)), "content": SizeHistogram((2, 5), (4, 2))}
    nulls = open_results(store)["m"]["nulls"].to_dataset()
    for null in ("uniform", "softmax-b4"):
        for token_set, histogram in sizes.items():
            expected = matched_holding(histogram, 2000, chunk_span(2000, 2000, 0), model="m",
                                       token_set=token_set, null=null, seed=0)
            got = nulls.sel(null=null, token_set=token_set)
            assert (int(got["trials"]), int(got["holding"]), int(got["disagreements"])) == \
                expected
            assert int(got["chunks_done"]) == int(got["chunks"]) == 2


def test_report_sets_each_observed_rate_beside_its_nulls(store, capsys):
    report = build_report(open_results(store), store=str(store))
    nulls = report.nulls
    assert len(nulls) == 4
    row = nulls[(nulls["null"] == "uniform") & (nulls["token_set"] == "all")].iloc[0]
    assert (row["observed_holding"], row["observed_cells"]) == (6, 8)
    delta, low, high = newcombe_interval(6, 8, int(row["holding"]), int(row["trials"]))
    assert (row["lift"], row["lift_ci_low"], row["lift_ci_high"]) == (delta, low, high)
    markdown = render_markdown(report)
    headline = markdown.split("## 2.")[0]
    assert "| model | reading | observed | uniform | softmax-b4 |" in headline
    assert f"{100 * row['rate']:.1f}%, lift {100 * delta:+.1f}" in headline
    document = json.loads(render_json(report))
    record = next(r for r in document["nulls"]
                  if (r["null"], r["token_set"]) == ("softmax-b4", "content"))
    assert {"model", "token_set", "null", "trials", "holding", "rate", "ci_low", "ci_high",
            "lift", "lift_ci_low", "lift_ci_high", "observed_rate"} <= set(record)
    assert record["trials"] == 2000 and record["rate"] == record["holding"] / 2000


def test_a_null_task_waits_for_every_test_and_is_blocked_by_any_failure(monkeypatch):
    config = parse_config({
        "store": "/tmp/never-written.zarr", "shard_size": 2,
        "datasets": {"wine": {"source": "sklearn:wine"}},
        "models": {"a": {"source": "ft-transformer", "dataset": "wine"},
                   "b": {"source": "ft-transformer", "dataset": "wine"}},
        "matched_nulls": {"nulls": ["uniform"], "trials": 1000, "chunk_trials": 1000},
    })
    facts = {name: ModelFacts.from_counts(("r0", "r1", "r2"), 1, (4, 4, 4)) for name in "ab"}
    plan = build_plan(config, facts)
    ran = []

    def fake_run(task):
        ran.append(task.key)
        if task.key == "extract-a-00001":
            raise RuntimeError("boom")
        return 0

    monkeypatch.setattr("sweep.driver.runner.run_task", fake_run)
    outcomes, blocked = InProcessExecutor().execute(plan, list(plan.tasks), 0, False)
    # a's shard 1 extraction failed: its test is blocked, and so is a's null (transitively)
    assert blocked == ["test-a-00001", "nulls-a-uniform-c00000"]
    assert outcomes["nulls-b-uniform-c00000"] is None
    assert ran.index("nulls-b-uniform-c00000") > ran.index("test-b-00001")

"""A bounded store (`attention: keep | drop | {sample: N, seed: S}`): the results equal `keep`'s
value for value; only the sample's attention stays, the same inputs at every shard size; the
attention on disk is bounded by the shards in flight; resume after kill -9, damage or a policy
change stays exact; a refused change writes nothing; drop works on a real S3 server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr
from distributed import Client, LocalCluster

import workers.tasks.extract
import workers.tasks.verdicts
from storage import markers
from storage.attention import AttentionPolicy, dropped_key, sampled_inputs, stored_attention
from storage.errors import InputError
from storage.location import locate
from storage.query.status import attention_held
from storage.store import StoreMismatchError
from sweep.cli.entry import main
from sweep.config.load import load_config
from sweep.driver.graph import DaskExecutor
from sweep.driver.runner import InProcessExecutor, run_sweep
from tests.s3_fixtures import OPTIONS

REPO = Path(__file__).parents[1]
N_TOPICS = 9


def write_config(folder: Path, attention: str = "keep", shard_size: int = 2,
                 limit: int = N_TOPICS, store: str = "sweep.zarr", extra: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "sweep.yaml"
    path.write_text(f"""\
store: {store}
shard_size: {shard_size}
attention: {attention}
matched_nulls: null
{extra}
datasets:
  topics: {{source: 'pydoc:topics', limit: {limit}}}
models:
  rob: {{source: tiny-roberta, dataset: topics, batch_size: 3}}
""")
    return path


def run(path: Path, **kwargs) -> None:
    summary = run_sweep(load_config(path), InProcessExecutor(), progress=False, **kwargs)
    assert summary.exit_code == 0, summary.lines()


def results(store: str | Path, options: dict | None = None) -> dict[str, np.ndarray]:
    """Every array of the model but its attention, by name."""
    group = zarr.open_group(locate(str(store), options).zarr_store(read_only=True),
                            mode="r")["rob"]
    return {path: array[:] for path, array in group.members(max_depth=None)
            if isinstance(array, zarr.Array) and path != "attention"}


def assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def with_attention(store: str | Path, options: dict | None = None) -> set[int]:
    """Indices of the inputs whose attention chunk is in the store."""
    keys = locate(str(store), options).listing("rob/attention/c/")
    return {int(key.split("/")[3]) for key in keys}


def store_state(store: Path) -> dict[str, tuple[int, int]]:
    """Every file of the store with its size and mtime."""
    return {str(p.relative_to(store)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in Path(store).rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def keep_store(tmp_path_factory) -> Path:
    """An uninterrupted `keep` run: the reference."""
    path = write_config(tmp_path_factory.mktemp("keep"))
    run(path)
    return path.parent / "sweep.zarr"


def test_drop_results_equal_keep_and_no_attention_stays(tmp_path, keep_store):
    path = write_config(tmp_path, "drop")
    run(path)
    store = tmp_path / "sweep.zarr"
    assert_same(results(store), results(keep_store))
    assert with_attention(keep_store) == set(range(N_TOPICS))
    assert with_attention(store) == set()
    assert [h.held for h in attention_held(store)] == [0]
    with pytest.raises(InputError, match=r"was dropped \(attention: drop\)"):
        stored_attention(store, "rob", str(zarr.open_group(store)["rob/input_id"][4]))


def test_sample_results_equal_keep_and_the_sample_keeps_its_attention(tmp_path, keep_store):
    path = write_config(tmp_path, "{sample: 3, seed: 7}")
    run(path)
    store = tmp_path / "sweep.zarr"
    assert_same(results(store), results(keep_store))
    ids = [str(i) for i in zarr.open_group(store)["rob/input_id"][:]]
    sample = sampled_inputs("rob", ids, 3, 7)
    assert len(sample) == 3
    assert with_attention(store) == sample
    for i in sample:
        np.testing.assert_array_equal(stored_attention(store, "rob", ids[i]),
                                      stored_attention(keep_store, "rob", ids[i]))
    assert [(h.held, h.n_inputs) for h in attention_held(store)] == [(3, N_TOPICS)]


def test_the_sample_is_the_same_inputs_at_two_shard_sizes(tmp_path):
    kept = []
    for size in (2, 5):
        path = write_config(tmp_path / f"s{size}", "{sample: 4, seed: 1}", shard_size=size)
        run(path)
        kept.append(with_attention(path.parent / "sweep.zarr"))
    assert len(kept[0]) == 4
    assert kept[0] == kept[1]


def test_another_seed_draws_another_sample():
    ids = [f"input-{i}" for i in range(200)]
    assert sampled_inputs("m", ids, 20, 0) != sampled_inputs("m", ids, 20, 1)
    assert sampled_inputs("m", ids, 20, 0) == sampled_inputs("m", ids, 20, 0)
    assert sampled_inputs("m", ids, 10, 0) < sampled_inputs("m", ids, 20, 0)


def test_bad_policies_are_refused_in_one_line(tmp_path):
    for bad in ("dropp", "{sample: -1}", "{sample: 2, sede: 1}"):
        with pytest.raises(InputError, match=r"attention: .*choose keep, drop or \{sample"):
            load_config(write_config(tmp_path, bad))
    with pytest.raises(ValueError, match="choose keep, drop"):
        AttentionPolicy.parse(True)


def test_a_per_model_policy_overrides_the_sweep_one(tmp_path):
    path = write_config(tmp_path, "keep")
    path.write_text(path.read_text().replace("batch_size: 3}", "batch_size: 3, attention: drop}"))
    assert str(load_config(path).attention_policy("rob")) == "drop"


def test_keep_then_drop_on_a_finished_store_drops_and_drop_then_keep_needs_reextraction(
        tmp_path, keep_store, capsys):
    path = write_config(tmp_path, "keep")
    run(path)
    store = tmp_path / "sweep.zarr"
    run(write_config(tmp_path, "drop"))
    assert with_attention(store) == set()
    assert_same(results(store), results(keep_store))
    before = store_state(store)
    write_config(tmp_path, "keep")
    with pytest.raises(StoreMismatchError, match=r"models\.rob\.attention: keep needs the "
                       r"attention of 9 inputs that attention: drop deleted; rerun with "
                       r"--reextract-attention"):
        run(path)
    assert main(["run", str(path), "--in-process", "--no-progress"]) == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "--reextract-attention" in error[0]
    assert store_state(store) == before  # a refused change writes nothing
    run(path, reextract=True)
    assert with_attention(store) == set(range(N_TOPICS))
    assert_same(results(store), results(keep_store))
    for i in (0, 8):
        input_id = str(zarr.open_group(store)["rob/input_id"][i])
        np.testing.assert_array_equal(stored_attention(store, "rob", input_id),
                                      stored_attention(keep_store, "rob", input_id))


def test_a_smaller_sample_of_the_same_seed_is_allowed_a_larger_one_refused(tmp_path):
    path = write_config(tmp_path, "{sample: 4, seed: 3}")
    run(path)
    store = tmp_path / "sweep.zarr"
    run(write_config(tmp_path, "{sample: 2, seed: 3}"))
    assert len(with_attention(store)) == 2
    before = store_state(store)
    write_config(tmp_path, "{sample: 4, seed: 3}")
    with pytest.raises(StoreMismatchError, match="needs the attention of 2 inputs"):
        run(path)
    assert store_state(store) == before


def test_damaged_results_of_a_dropped_shard_reextract_and_retest(tmp_path, keep_store, capsys):
    path = write_config(tmp_path, "drop")
    run(path)
    store = tmp_path / "sweep.zarr"
    # a finished model's results are one object per array (storage.compaction): every shard's
    (store / "rob" / "results" / "kappa" / "c.0.0.0.0").write_bytes(b"broken")
    summary = run_sweep(load_config(path), InProcessExecutor(), progress=False)
    shards = range(-(-N_TOPICS // 2))
    assert sorted(summary.completed) == sorted(
        [f"extract-rob-{s:05d}" for s in shards] + [f"test-rob-{s:05d}" for s in shards])
    assert_same(results(store), results(keep_store))
    assert with_attention(store) == set()


def test_a_pending_test_whose_attention_was_dropped_reextracts_first(tmp_path, keep_store):
    path = write_config(tmp_path, "drop")
    run(path)
    store = tmp_path / "sweep.zarr"
    markers.clear(str(store), "rob", "test-00001")  # as if the test had never finished
    summary = run_sweep(load_config(path), InProcessExecutor(), progress=False)
    assert sorted(summary.completed) == ["extract-rob-00001", "test-rob-00001"]
    assert_same(results(store), results(keep_store))


def test_lost_attention_of_an_untested_shard_reextracts(tmp_path, keep_store):
    path = write_config(tmp_path, "keep")
    run(path)
    store = tmp_path / "sweep.zarr"
    markers.clear(str(store), "rob", "test-00003")
    locate(str(store)).delete_prefix("rob/attention/c/6/")  # lost, not dropped
    summary = run_sweep(load_config(path), InProcessExecutor(), progress=False)
    assert sorted(summary.completed) == ["extract-rob-00003", "test-rob-00003"]
    assert_same(results(store), results(keep_store))


def count_attention_at_markers(monkeypatch, store: Path) -> list[int]:
    """The number of attention chunks in the store each time a task writes its done marker."""
    counts: list[int] = []
    original = workers.tasks.verdicts.mark_done

    def counting(*args, **kwargs):
        counts.append(len(list((store / "rob" / "attention").rglob("c/*/*/*/*/*"))))
        return original(*args, **kwargs)

    for module in (workers.tasks.extract, workers.tasks.verdicts):
        monkeypatch.setattr(module, "mark_done", counting)
    return counts


@pytest.mark.parametrize("executor", ["in-process", "dask"])
def test_the_attention_on_disk_is_bounded_by_the_shards_in_flight(tmp_path, monkeypatch,
                                                                   executor):
    limit, shard_size, in_flight = 24, 2, 2
    path = write_config(tmp_path, "drop", shard_size=shard_size, limit=limit)
    counts = count_attention_at_markers(monkeypatch, tmp_path / "sweep.zarr")
    config = load_config(path)
    if executor == "in-process":
        run(path)
        bound = shard_size
    else:
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                          resources={"GPU": 1, "CPU": 1}, dashboard_address=":0") as cluster, \
                Client(cluster) as client:
            summary = run_sweep(config, DaskExecutor(client, in_flight=in_flight),
                                progress=False)
        assert summary.exit_code == 0, summary.lines()
        bound = in_flight * shard_size
    assert len(counts) == 2 * limit // shard_size  # every extraction and test marker counted
    assert 0 < max(counts) <= bound  # attention was there, never more than the shards in flight
    assert with_attention(tmp_path / "sweep.zarr") == set()


def test_kill_9_under_drop_then_resume_is_identical(tmp_path):
    limit = 40
    reference = write_config(tmp_path / "keep", "keep", limit=limit)
    run(reference)
    path = write_config(tmp_path / "drop", "drop", limit=limit)
    store = tmp_path / "drop" / "sweep.zarr"
    process = subprocess.Popen(
        [sys.executable, "-m", "sweep", "run", str(path), "--in-process", "--no-progress"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    marker_dir = store / ".sweep" / "markers" / "rob"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        if len(list(marker_dir.glob("*.done"))) >= 7:  # mid-shard: after an odd marker
            break
        time.sleep(0.01)
    assert process.poll() is None, "the run ended before it could be killed"
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    done = len(list(marker_dir.glob("*.done")))
    assert 0 < done < 2 * limit // 2
    run(path)
    assert_same(results(store), results(tmp_path / "keep" / "sweep.zarr"))
    assert with_attention(store) == set()


def test_plan_prints_the_peak_next_to_keeps_total(tmp_path, capsys):
    path = write_config(tmp_path, "{sample: 3, seed: 0}", limit=6)
    assert main(["plan", str(path)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("  rob "))
    assert "sample 3 (seed 0)" in line and "peak" in line and "keep:" in line


def test_status_says_how_many_inputs_still_have_attention(tmp_path, capsys):
    path = write_config(tmp_path, "{sample: 2, seed: 0}", limit=6)
    run(path)
    capsys.readouterr()
    assert main(["status", str(tmp_path / "sweep.zarr")]) == 0
    out = capsys.readouterr().out
    assert "attention rob: 2 of 6 inputs still have their attention (attention: sample 2 " \
           "(seed 0))" in out
    assert main(["status", str(tmp_path / "sweep.zarr"), "--format", "json"]) == 0
    stages = {(s["scope"], s["stage"]): s for s in json.loads(capsys.readouterr().out)}
    assert stages["rob", "extract"]["attention_held"] == 2
    assert stages["rob", "extract"]["attention_policy"] == "sample 2 (seed 0)"
    assert "attention_held" not in stages["rob", "test"]


@pytest.mark.s3
def test_drop_on_seaweedfs_equals_keep_and_leaves_no_attention(tmp_path, s3_bucket,
                                                               keep_store):
    url = f"s3://{s3_bucket}/bounded.zarr"
    extra = f"storage_options: {{endpoint_url: '{OPTIONS['endpoint_url']}'}}"
    path = write_config(tmp_path, "drop", store=url, extra=extra)
    run(path)
    assert_same(results(url, OPTIONS), results(keep_store))
    assert with_attention(url, OPTIONS) == set()
    keys = locate(url, OPTIONS).listing(".sweep/markers/rob/")
    assert sum(key.endswith(".dropped") for key in keys) == -(-N_TOPICS // 2)
    run(path)  # a rerun finds everything done: nothing re-extracted
    assert with_attention(url, OPTIONS) == set()


def test_a_drop_killed_after_its_record_and_before_its_deletes_is_finished(tmp_path, capsys):
    """`drop_attention` writes its record first, then the marker, then deletes: a kill after
    the record leaves chunks the record already names. The next start finds them by listing
    what is stored, not by reading the record, and deletes them."""
    run(write_config(tmp_path, "keep", limit=6))
    store = tmp_path / "sweep.zarr"
    assert with_attention(store) == set(range(6))
    locate(str(store)).write(dropped_key("rob", 0), b'{"inputs": [0, 1]}\n')  # then killed
    run(write_config(tmp_path, "drop", limit=6))
    assert with_attention(store) == set()
    capsys.readouterr()
    assert main(["status", str(store)]) == 0
    assert "attention rob: 0 of 6 inputs still have their attention" in capsys.readouterr().out


def test_show_on_an_input_whose_attention_was_dropped_names_the_policy(tmp_path, capsys):
    """zarr reads a deleted chunk as zeros: `sweep show` must not print NaN readings of them."""
    run(write_config(tmp_path, "drop", limit=4))
    store = tmp_path / "sweep.zarr"
    input_id = str(zarr.open_group(str(store), mode="r")["rob"]["input_id"][1])
    capsys.readouterr()
    assert main(["show", str(store), "rob", input_id, "--layer", "0"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and f"input {input_id!r} was dropped (attention: drop)" in err[0], err

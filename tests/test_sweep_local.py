"""A real sweep on a real LocalCluster: results equal an in-memory numpy loop and the in-process
runner; failures are retried, marked and retried alone on rerun; refusals name their cause."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr
from distributed import Client, LocalCluster

import workers.tasks.extract
import workers.tasks.verdicts
from storage import markers
from storage.layout import RESULT_VARS, ResultStatus
from storage.lock import StoreLock
from sweep.cli.entry import main
from sweep.config.load import load_config
from sweep.driver.graph import DaskExecutor
from sweep.driver.runner import InProcessExecutor, run_sweep
from tests.store_fixtures import stored_arrays as arrays
from tests.test_radius import brute_radius
from workers.exact.equality import check, restrict, rollout, validate_stochastic
from workers.exact.readings import attaining_kinds
from workers.exact.token_kinds import keep_mask, special_mask
from workers.nulls.baseline import baseline_blocks, holding_in_blocks
from workers.nulls.registry import NULLS

MODELS = {
    "vit": "{source: tiny-deit-distilled, dataset: photos}",
    "ft": "{source: ft-transformer, dataset: wine, options: {max_epochs: 3, n_blocks: 2}}",
    "rob": "{source: tiny-roberta, dataset: topics, batch_size: 3}",
}


def write_config(folder: Path, models=("vit", "ft"), extra: str = "",
                 cache: Path | str = "cache") -> Path:
    lines = [
        "store: sweep.zarr", "shard_size: 4", "retries: 2", f"cache_dir: {cache}", extra,
        "datasets:",
        "  photos: {source: 'sklearn:sample_images', limit: 6}",
        "  wine: {source: 'sklearn:wine', limit: 9}",
        "  topics: {source: 'pydoc:topics', limit: 5}",
        "models:",
        *(f"  {name}: {MODELS[name]}" for name in models),
        "baseline: {sizes: [2, 5], trials: 2500, seed: 3, chunk_trials: 1000}",
        "matched_nulls: {trials: 2000, chunk_trials: 1000}",
    ]
    path = folder / "sweep.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def assert_same_arrays(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key, strict=True)


@pytest.fixture(scope="module")
def client():
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      resources={"GPU": 1, "CPU": 1}, dashboard_address=":0") as cluster:
        with Client(cluster) as dask_client:
            yield dask_client


@pytest.fixture(scope="module")
def swept(tmp_path_factory, client):
    """The same config swept on Dask and in-process, into two stores."""
    out = {}
    cache = tmp_path_factory.mktemp("checkpoints")  # FT-Transformer trains once for both
    for name, executor in (("dask", DaskExecutor(client)), ("local", InProcessExecutor())):
        folder = tmp_path_factory.mktemp(name)
        config = load_config(write_config(folder, cache=cache))
        summary = run_sweep(config, executor, progress=False)
        assert summary.exit_code == 0 and not summary.failed and not summary.skipped
        out[name] = Path(config.store)
    return out


def numpy_loop(store: Path, model: str) -> dict[str, np.ndarray]:
    """The results recomputed input by input, head by head, layer by layer, from the stored
    attention."""
    group = zarr.open_group(str(store / model), mode="r")
    sets = group.attrs["token_sets"]
    n, n_layers, n_heads = group.attrs["n_inputs"], group.attrs["n_layers"], group.attrs["n_heads"]
    out = {name: np.full((n, n_layers, n_heads, len(sets)), var.fill, var.dtype)
           for name, var in RESULT_VARS.items()}
    for i in range(n):
        t = int(group["n_tokens"][i])
        kinds = group["token_kind"][i, :t]
        for h in range(n_heads):
            for s, token_set in enumerate(sets):
                keep = keep_mask(kinds, token_set)
                restricted = []
                for layer in range(n_layers):
                    cell = (i, layer, h, s)
                    r = restrict(group["attention"][i, layer, h, :t, :t].astype(np.float64), keep)
                    result = check(r.matrix, tol=1e-12, special=special_mask(kinds)[r.kept])
                    restricted.append(r.matrix)
                    for name in ("kappa", "kappa_factor", "bound", "margin", "holds",
                                 "holds_by_characterisation", "attaining_pairs",
                                 "attaining_special", "slack", "content_gap"):
                        out[name][cell] = getattr(result, name)[0]
                    pair = result.pair[0]
                    out["pair_i"][cell] = r.kept[pair[0]] if pair[0] >= 0 else -1
                    out["pair_j"][cell] = r.kept[pair[1]] if pair[1] >= 0 else -1
                    out["attaining_kind"][cell] = attaining_kinds(
                        r.matrix[None], kinds[r.kept], result.kappa, result.attaining_special,
                        1e-12)[0]
                    out["radius"][cell] = brute_radius(
                        validate_stochastic(r.matrix)[0], np.arange(r.kept.size),
                        result.kappa[0], result.margin[0], bool(result.holds[0]), 1e-12)
                    out["n_kept"][cell] = keep.sum()
                    out["status"][cell] = ResultStatus.OK
                kappa_r, bound_r = rollout(np.stack(restricted))
                out["rollout_kappa"][i, :, h, s] = kappa_r
                out["rollout_bound"][i, :, h, s] = bound_r
    return out


@pytest.mark.parametrize("model", ["vit", "ft"])
def test_dask_results_equal_a_numpy_loop_over_the_stored_attention(swept, model):
    results = zarr.open_group(str(swept["dask"] / model / "results"), mode="r")
    expected = numpy_loop(swept["dask"], model)
    for name in RESULT_VARS:
        np.testing.assert_array_equal(results[name][:], expected[name], err_msg=name)
    assert (results["status"][:] == ResultStatus.OK).all()


def test_baseline_counts_equal_the_unchunked_count(swept):
    group = zarr.open_group(str(swept["dask"] / "baseline"), mode="r")
    for index, null in enumerate(group["null"][:].tolist()):
        for row, n in enumerate((2, 5)):
            holding, _ = holding_in_blocks(n, 3, baseline_blocks(2500), null=null)
            assert group["holding"][index, row].sum() == holding
            assert group["trials"][index, row].tolist() == [1000, 1000, 500]
            assert group["disagreements"][index, row].sum() == 0


def test_in_process_runner_equals_dask_runner_value_for_value(swept):
    assert_same_arrays(arrays(swept["dask"]), arrays(swept["local"]))


def test_token_kinds_and_padding_in_the_store(swept):
    group = zarr.open_group(str(swept["dask"] / "vit"), mode="r")
    t = int(group["n_tokens"][0])
    assert group["token_kind"][0, :2].tolist() == [1, 4]  # CLS, DIST
    assert (group["token_kind"][0, t:] == -1).all()
    attention = group["attention"][0]  # (layer, head, query, key): one head-averaged head
    np.testing.assert_allclose(attention[:, 0, :t, :t].sum(-1), 1.0, atol=1e-5)


def test_rerun_of_a_complete_store_skips_everything(swept, client):
    config = load_config(swept["dask"].parent / "sweep.yaml")
    before = arrays(swept["dask"])
    summary = run_sweep(config, DaskExecutor(client), progress=False)
    assert summary.completed == [] and summary.exit_code == 0
    assert_same_arrays(before, arrays(swept["dask"]))


def test_a_failing_task_is_retried_marked_failed_and_rerun_alone(tmp_path, monkeypatch):
    config = load_config(write_config(tmp_path, models=("vit",)))
    attempts = []
    real = workers.tasks.verdicts.run_test

    def flaky(task):
        if task.shard == 1:
            attempts.append(task.key)
            raise RuntimeError("injected failure")
        return real(task)

    monkeypatch.setattr(workers.tasks.verdicts, "run_test", flaky)
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                      resources={"GPU": 1, "CPU": 2}, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        summary = run_sweep(config, DaskExecutor(client), progress=False)
        assert attempts == ["test-vit-00001"] * 3  # the first try and retries: 2
        assert sorted(summary.failed) == ["test-vit-00001"]
        text = summary.failed["test-vit-00001"].splitlines()
        assert text[0] == "RuntimeError: injected failure" and text[1].startswith("Traceback")
        assert summary.exit_code == 1 and "extract-vit-00001" in summary.completed
        state = markers.read_state(config.store, "vit", "test-00001")
        assert state.state == "failed" and "injected failure" in state.error
        monkeypatch.setattr(workers.tasks.verdicts, "run_test", real)
        rerun = run_sweep(config, DaskExecutor(client), progress=False)
    # the test, then the size-matched nulls that waited for it (blocked in the first run)
    assert sorted(rerun.completed) == sorted(["test-vit-00001", *null_keys()])
    assert rerun.exit_code == 0
    assert markers.read_state(config.store, "vit", "test-00001").state == "done"


def test_in_process_runner_retries_and_blocks_the_test_of_a_failed_extraction(
        tmp_path, monkeypatch):
    config = load_config(write_config(tmp_path, models=("vit",)))

    def broken(task):
        raise OSError(f"disk gone for {task.key}")

    monkeypatch.setattr(workers.tasks.extract, "run_extract", broken)
    summary = run_sweep(config, InProcessExecutor(), progress=False)
    assert sorted(summary.failed) == ["extract-vit-00000", "extract-vit-00001"]
    assert summary.blocked == ["test-vit-00000", "test-vit-00001", *null_keys()]
    assert summary.exit_code == 1


def null_keys(model: str = "vit") -> list[str]:
    """The size-matched null tasks of a model (2 chunks of every null), in plan order."""
    return [f"nulls-{model}-{null}-c{chunk:05d}" for null in NULLS for chunk in range(2)]


def test_second_concurrent_run_is_refused(tmp_path, capsys):
    path = write_config(tmp_path, models=("vit",))
    with StoreLock(load_config(path).store):
        assert main(["run", str(path), "--in-process"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sweep run: error: store ") and "in use by another sweep run" in err
    assert "\n" not in err


def test_config_change_is_refused_naming_the_key(swept, capsys):
    folder = swept["local"].parent
    cache = load_config(folder / "sweep.yaml").checkpoint_dir
    path = write_config(folder, extra="tol: 1.0e-9", cache=cache)
    assert main(["run", str(path), "--in-process"]) == 2
    err = capsys.readouterr().err
    assert "models.vit.tol: 1e-12 -> 1e-09" in err and "different config" in err
    write_config(folder, cache=cache)  # restore for other tests


def test_adding_a_model_extends_without_recomputing_the_others(tmp_path):
    config = load_config(write_config(tmp_path, models=("vit",)))
    assert run_sweep(config, InProcessExecutor(), progress=False).exit_code == 0
    done = sorted((Path(config.store) / ".sweep" / "markers").rglob("*.done"))
    stamps = {p: p.stat().st_mtime_ns for p in done}
    before = arrays(config.store)
    extended = load_config(write_config(tmp_path, models=("vit", "rob")))
    summary = run_sweep(extended, InProcessExecutor(), progress=False)
    assert summary.exit_code == 0
    assert sorted(summary.completed) == sorted(
        [f"{stage}-rob-{shard:05d}" for stage in ("extract", "test") for shard in (0, 1)]
        + null_keys("rob"))
    assert {p: p.stat().st_mtime_ns for p in done} == stamps
    after = arrays(config.store)
    assert_same_arrays(before, {k: v for k, v in after.items() if not k.startswith("rob/")})
    root = zarr.open_group(str(config.store), mode="r")
    assert root.attrs["models"] == ["vit", "rob"]


def test_status_and_plan_commands_on_a_finished_store(swept, capsys):
    assert main(["status", str(swept["dask"])]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["scope", "stage", "done", "pending", "failed", "total"]
    assert "vit extract 2 0 0 2" in [" ".join(line.split()) for line in lines]
    assert main(["plan", str(swept["dask"].parent / "sweep.yaml")]) == 0
    out = capsys.readouterr().out
    assert "(exists: resumes)" in out
    row = next(line for line in out.splitlines() if line.startswith("vit "))
    # inputs, shards, layers, heads, T_max, tasks, done
    assert row.split()[2:9] == ["6", "2", "2", "1", "18", "4", "4"]


def test_status_lists_a_failed_task_with_its_error(tmp_path, capsys, monkeypatch):
    config = load_config(write_config(tmp_path, models=("vit",)))

    def broken(task):
        raise ValueError("corrupt input 3")

    monkeypatch.setattr(workers.tasks.verdicts, "run_test", broken)
    with pytest.raises(ValueError, match="corrupt input 3") as raised:  # --in-process re-raises
        main(["run", str(tmp_path / "sweep.yaml"), "--in-process", "--no-progress"])
    assert raised.traceback[-1].name == "broken"  # the task's own traceback
    text = markers.read_state(config.store, "vit", "test-00000").error.splitlines()
    assert text[0] == "ValueError: corrupt input 3" and text[1].startswith("Traceback")
    assert any("in broken" in line for line in text)
    capsys.readouterr()
    assert main(["status", str(config.store)]) == 1
    out = capsys.readouterr().out
    assert "failed vit test-00000: ValueError: corrupt input 3" in out

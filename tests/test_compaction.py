"""A finished model's result arrays are a few objects (`storage.compaction`): as many whatever
the shard count, value for value what the per-shard layout holds, rewritten identically after a
kill at any step of compacting or expanding, and checked by `sweep status` (`--verify`) and
`sweep run` like any done task's chunks."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import sweep.driver.compaction
from storage import markers
from storage.compaction.results import is_compacted, result_documents
from storage.layout import RESULT_VARS
from storage.location import LocalLocation, StoreRef, locate
from sweep.cli.entry import main
from sweep.config.load import load_config
from sweep.driver.runner import InProcessExecutor, run_sweep
from sweep.terminal.interrupts import Interrupted
from tests.fault_helpers import LINES, write_text_sweep
from tests.store_fixtures import stored_arrays

RESULTS = "rob/results"


def sweep_into(folder: Path, shard_size: int = 2, lines: list[str] | None = None) -> Path:
    """The tiny text sweep of `tests.fault_helpers` (shards of `shard_size`), run to the end;
    returns its store."""
    path = write_text_sweep(folder, lines)
    path.write_text(path.read_text().replace("shard_size: 2", f"shard_size: {shard_size}"))
    config = load_config(path)
    assert run_sweep(config, InProcessExecutor(), progress=False).exit_code == 0
    return Path(config.store)


def files(store: Path, under: str) -> dict[str, bytes]:
    """Every file under `store/under`, by its path below the store, with its bytes."""
    return {path.relative_to(store).as_posix(): path.read_bytes()
            for path in sorted((store / under).rglob("*")) if path.is_file()}


def marker_names(store: Path) -> list[str]:
    return sorted(p.relative_to(store).as_posix()
                  for p in (store / ".sweep" / "markers").rglob("*.done"))


def assert_same_store(store: Path, reference: Path) -> None:
    """Every array equal (values, dtypes), every object of the results byte for byte, the same
    done markers."""
    expected, found = stored_arrays(reference), stored_arrays(store)
    assert sorted(found) == sorted(expected)
    for name in expected:
        np.testing.assert_array_equal(found[name], expected[name], err_msg=name, strict=True)
    assert files(store, RESULTS) == files(reference, RESULTS)
    assert marker_names(store) == marker_names(reference)


def copy_of(store: Path, tmp_path: Path) -> Path:
    """A copy of the folder of `store` whose config still reads the original's text file (the
    dataset path is part of the fingerprint); returns the copy's store."""
    folder = tmp_path / "copy"
    shutil.copytree(store.parent, folder, symlinks=True)
    path = folder / "sweep.yaml"
    path.write_text(path.read_text().replace("path: lines.txt",
                                             f"path: {store.parent}/lines.txt"))
    return folder / store.name


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """An uninterrupted run's store (5 inputs, 3 shards)."""
    return sweep_into(tmp_path_factory.mktemp("reference"))


# --- (a) a few objects, whatever the shard count ----------------------------------------------

def test_a_finished_models_results_are_two_objects_per_array_whatever_the_shard_count(
        tmp_path):
    six = [*LINES, "one more line for a sixth input to test"]
    counts = {}
    for shard_size in (1, 2, 6):  # 6, 3 and 1 shards
        store = sweep_into(tmp_path / f"s{shard_size}", shard_size, six)
        found = files(store, RESULTS)
        counts[shard_size] = len(found)
        assert all(key.endswith(("/zarr.json", "/c.0.0.0.0")) for key in found), sorted(found)
    assert counts == {size: 1 + 2 * len(RESULT_VARS) for size in (1, 2, 6)}  # the group's
    # document, then per array its metadata and its one shard object


# --- (b) the same values as the per-shard layout ----------------------------------------------

def test_compacted_results_hold_what_the_per_shard_layout_holds(tmp_path, reference,
                                                                monkeypatch):
    monkeypatch.setattr(sweep.driver.compaction, "compact", lambda plan: [])
    per_shard = sweep_into(tmp_path / "per-shard")
    assert not any(is_compacted(doc) for doc in result_documents(str(per_shard), "rob").values())
    docs = result_documents(str(reference), "rob")
    assert sorted(docs) == [f"{RESULTS}/{name}" for name in sorted(RESULT_VARS)]
    assert all(is_compacted(doc) for doc in docs.values())
    expected, found = stored_arrays(per_shard), stored_arrays(reference)
    assert sorted(found) == sorted(expected)
    for name in expected:  # values, dtypes and shapes
        np.testing.assert_array_equal(found[name], expected[name], err_msg=name, strict=True)
    for path, doc in result_documents(str(per_shard), "rob").items():  # what readers see
        kept = ("shape", "data_type", "fill_value", "attributes", "dimension_names")
        assert {key: docs[path][key] for key in kept} == {key: doc[key] for key in kept}
    trees = [xr.open_datatree(store, engine="zarr", chunks={}) for store in (reference,
                                                                            per_shard)]
    xr.testing.assert_identical(trees[0]["rob/results"].to_dataset().compute(),
                                trees[1]["rob/results"].to_dataset().compute())


# --- (c) killed while compacting or expanding, then resumed: the same store --------------------

def kill_at(monkeypatch, method: str, matches, nth: int = 1) -> None:
    """Make the `nth` call of `LocalLocation.<method>` on a key `matches(key)` raise Ctrl-C
    before it acts, as a kill at that moment would leave the store."""
    original = getattr(LocalLocation, method)
    seen = []

    def patched(self, key, *args, **kwargs):
        if matches(key):
            seen.append(key)
            if len(seen) == nth:
                raise KeyboardInterrupt
        return original(self, key, *args, **kwargs)

    monkeypatch.setattr(LocalLocation, method, patched)


KILLS = {  # where a run is killed while compacting: (method, which keys, nth of them)
    "before-first-object": ("write", lambda key: "/results/" in key and "/c." in key, 1),
    "some-arrays-switched": ("write", lambda key: key.startswith(RESULTS)
                             and key.endswith("/zarr.json"), 4),
    "before-marker": ("write", lambda key: key.endswith("compact.done"), 1),
    "deleting-per-shard-chunks": ("delete_prefix", lambda key: key.endswith("/c/"), 3),
}
SWITCHED = {"some-arrays-switched", "before-marker"}  # some compacted documents, no marker


@pytest.mark.parametrize("kill", sorted(KILLS))
def test_a_run_killed_while_compacting_resumes_to_the_same_store(tmp_path, reference,
                                                                 monkeypatch, kill):
    path = write_text_sweep(tmp_path)
    config = load_config(path)
    with monkeypatch.context() as patch:
        kill_at(patch, *KILLS[kill])
        with pytest.raises(Interrupted):
            run_sweep(config, InProcessExecutor(), progress=False)
    store = Path(config.store)
    # readable; documents switched before the marker are of a layout no marker vouches for
    assert main(["status", str(store)]) in ((4,) if kill in SWITCHED else (0, 1))
    summary = run_sweep(config, InProcessExecutor(), progress=False)
    assert summary.exit_code == 0 and summary.completed == []  # every task stays done
    assert_same_store(store, reference)


@pytest.mark.parametrize("nth", [1, 5])
def test_a_run_killed_while_expanding_resumes_to_the_same_store(tmp_path, reference,
                                                                monkeypatch, nth):
    """A compacted model with a test to rerun goes back to per-shard chunks first: killed then
    (after `nth` arrays' per-shard chunks), the next run finishes, retests only that shard and
    compacts again."""
    store = copy_of(reference, tmp_path)
    config = load_config(store.parent / "sweep.yaml")
    markers.clear(str(store), "rob", "test-00001")  # as if its test had to run again
    with monkeypatch.context() as patch:
        kill_at(patch, "write", lambda key: key.startswith(RESULTS) and "/c/" in key, nth)
        with pytest.raises(Interrupted):
            run_sweep(config, InProcessExecutor(), progress=False)
    summary = run_sweep(config, InProcessExecutor(), progress=False)
    assert summary.exit_code == 0 and summary.completed == ["test-rob-00001"]
    assert_same_store(store, reference)


# --- (d) status and --verify on compacted stores -----------------------------------------------

def test_status_and_verify_pass_on_a_compacted_store_and_find_its_damage(tmp_path, reference,
                                                                         capsys):
    store = copy_of(reference, tmp_path)
    for argv in (["status", str(store)], ["status", str(store), "--verify"]):
        assert main(argv) == 0
        out = capsys.readouterr().out
        assert [line.split()[:3] for line in out.splitlines() if " compact " in line] == [
            ["rob", "compact", "1"]]
    margin = store / RESULTS / "margin" / "c.0.0.0.0"
    stat, data = margin.stat(), bytearray(margin.read_bytes())
    data[len(data) // 2] ^= 0xFF
    margin.write_bytes(bytes(data))
    os.utime(margin, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size, same mtime
    assert main(["status", str(store)]) == 0  # a listing cannot see it: --verify does
    capsys.readouterr()
    assert main(["status", str(store), "--verify"]) == 4
    assert "damaged rob compact: rob/results/margin; rerun `sweep run`" in capsys.readouterr().out
    argv = ["run", str(store.parent / "sweep.yaml"), "--in-process", "--no-progress"]
    assert main([*argv, "--verify"]) == 0
    captured = capsys.readouterr()
    assert "damaged compacted results (3 shard(s)); recomputing them" in captured.err
    assert "3 tasks completed, 3 already done" in captured.out  # the tests, not extractions
    assert_same_store(store, reference)
    assert main(["status", str(store), "--verify"]) == 0


def test_a_deleted_compacted_object_and_damaged_metadata_are_found_and_repaired(
        tmp_path, reference, capsys):
    store = copy_of(reference, tmp_path)
    (store / RESULTS / "holds" / "c.0.0.0.0").unlink()
    assert main(["status", str(store)]) == 4
    assert "damaged rob compact: rob/results/holds;" in capsys.readouterr().out
    assert main(["report", str(store)]) == 4
    assert "damaged chunks in rob/results/holds" in capsys.readouterr().err
    argv = ["run", str(store.parent / "sweep.yaml"), "--in-process", "--no-progress"]
    assert main(argv) == 0
    assert_same_store(store, reference)
    document = store / RESULTS / "kappa" / "zarr.json"
    meta = json.loads(document.read_text())
    meta["codecs"][0]["configuration"]["chunk_shape"][0] = 1  # not the layout's chunks
    document.write_text(json.dumps(meta))
    capsys.readouterr()
    assert main(["status", str(store)]) == 4
    assert "damaged rob metadata rob/results/kappa/zarr.json: sharded chunk_shape" in \
        capsys.readouterr().out
    assert main(argv) == 0
    assert_same_store(store, reference)


# --- on an object store ---------------------------------------------------------------------

@pytest.mark.s3
def test_on_s3_a_finished_model_is_few_objects_and_status_reads_it(tmp_path, reference,
                                                                   s3_bucket):
    path = write_text_sweep(tmp_path)
    url = f"s3://{s3_bucket}/compact.zarr"
    path.write_text(path.read_text().replace(
        "store: sweep.zarr", f"store: {url}\nstorage_options: {{endpoint_url: "
                             f"'http://127.0.0.1:{os.environ.get('DOBRUSHIN_S3_PORT', '8333')}'}}"))
    config = load_config(path)
    assert run_sweep(config, InProcessExecutor(), progress=False).exit_code == 0
    ref = StoreRef.of(url, config.storage_options)
    keys = sorted(locate(ref).listing(f"{RESULTS}/"))
    assert len(keys) == 1 + 2 * len(RESULT_VARS) and not any("/c/" in key for key in keys)
    expected, found = stored_arrays(reference), stored_arrays(ref)
    for name in expected:
        np.testing.assert_array_equal(found[name], expected[name], err_msg=name, strict=True)
    option = f"--storage-option=endpoint_url={config.storage_options['endpoint_url']}"
    assert main(["status", url, option, "--verify"]) == 0

"""The store: created from a template once, shard-owned chunks, markers, fingerprints, lock."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import zarr

from storage import markers, recording
from storage import store as store_module
from storage.errors import InputError
from storage.fingerprint import describe_changes, fingerprint
from storage.integrity import written_by
from storage.layout import BASELINE_VARS, FORMAT, MODEL_VARS, RESULT_VARS
from storage.lock import StoreBusyError, StoreLock
from storage.query.status import store_status
from storage.recording import RecordingStore, crc32c_of
from storage.store import (
    StoreMismatchError,
    create_root,
    ensure_baseline,
    ensure_model,
    open_model,
    open_root,
    write_attention,
    write_baseline,
    write_results,
    write_root_attrs,
    write_tokens,
)
from workers.task_specs import TestTask
from workers.tasks.verdicts import evaluate_shard, run_test

IDS = [f"in{i}" for i in range(10)]
INPUTS = {"tol": 1e-12, "model": {"name": "m", "config": {"depth": 2}}}


def make_model(store: Path, fingerprint_inputs=None, name: str = "m") -> zarr.Group:
    root = create_root(store)
    ensure_model(root, name, input_ids=IDS, n_layers=3, t_max=5, shard_size=4,
                 token_sets=("all", "content"), attrs={"source": "tiny", "dataset": "d"},
                 fingerprint_inputs=fingerprint_inputs or INPUTS)
    write_root_attrs(root, {"models": {name: {}}})
    return root


def test_every_layout_array_exists_with_dims_dtype_and_shard_chunks(tmp_path):
    root = make_model(tmp_path / "s.zarr")
    group = open_model(tmp_path / "s.zarr", "m")
    for name, var in MODEL_VARS.items():
        array = group[name]
        assert array.metadata.dimension_names == var.dims
    assert group["attention"].shape == (10, 3, 1, 5, 5)  # (input, layer, head, query, key)
    assert group["attention"].chunks == (1, 3, 1, 5, 5)
    assert group["head"][:].tolist() == ["mean"] and group.attrs["n_heads"] == 1
    assert group["token_kind"].chunks == (4, 5)
    assert group["attention"].dtype == np.float32 and group["token_kind"].dtype == np.int8
    assert [str(i) for i in group["input_id"][:]] == IDS
    for name, var in RESULT_VARS.items():
        array = group["results"][name]
        assert array.metadata.dimension_names == var.dims
        assert array.shape == (10, 3, 1, 2) and array.chunks == (4, 3, 1, 2)
        assert array.dtype == np.dtype(var.dtype)
    attrs = dict(group.attrs)
    assert attrs["n_shards"] == 3 and attrs["token_sets"] == ["all", "content"]
    assert attrs["fingerprint"] == fingerprint(INPUTS)
    assert root.attrs["format"] == FORMAT and root.attrs["models"] == ["m"]
    assert root.attrs["fingerprint"] == {"m": fingerprint(INPUTS)}
    assert "zarr" in root.attrs["versions"]


def test_attention_is_stored_raw_and_everything_else_compressed(tmp_path):
    make_model(tmp_path / "s.zarr")
    group = open_model(tmp_path / "s.zarr", "m", mode="r+")
    assert group["attention"].compressors == ()
    assert group["input_id"].compressors and group["results"]["kappa"].compressors
    attention = np.random.default_rng(0).random((4, 3, 1, 5, 5)).astype(np.float32)
    group["attention"][:4] = attention
    assert np.array_equal(group["attention"][:4], attention)


def _on_two_threads(fn, items):
    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(fn, items))


def test_attention_chunks_written_as_their_bytes_are_the_files_and_checksums_zarr_writes(
        tmp_path):
    """`write_attention` writes each chunk's bytes as its file itself (`raw_chunks`,
    `RecordingStore.file_writer`), on this thread or mapped over a pool; an all-zero chunk,
    which zarr does not store (and deletes where one was), goes through zarr."""
    values = np.random.default_rng(0).random((5, 3, 1, 5, 5)).astype(np.float32)
    values[3] = 0.0
    files, sums = [], []
    for name in ("zarr", "raw", "pool"):
        make_model(tmp_path / f"{name}.zarr")
        group = open_model(tmp_path / f"{name}.zarr", "m", mode="r+")
        assert store_module.raw_chunks(group["attention"])
        group["attention"][:5] = np.ones((5, 3, 1, 5, 5), np.float32)  # chunks to overwrite
        if name == "zarr":
            group["attention"][:5] = values
        else:
            mapper = _on_two_threads if name == "pool" else None
            write_attention(group, 2, values[2:], mapper)
            write_attention(group, 0, values[:2], mapper)
        folder = tmp_path / f"{name}.zarr" / "m" / "attention"
        files.append({str(f.relative_to(folder)): f.read_bytes()
                      for f in sorted(folder.rglob("*")) if f.is_file()})
        sums.append({k: v for k, v in written_by(group).items()
                     if "/attention/c/" in k})
        assert np.array_equal(group["attention"][:5], values)
    assert files[0] == files[1] == files[2] and "c/3/0/0/0/0" not in files[1]
    assert len(files[1]) == 5 and sums[0] == sums[1] == sums[2]


def test_chunks_go_around_zarrs_event_loop_only_into_a_writable_local_folder(tmp_path):
    """A recording store writes chunk files itself only over a local folder zarr may write;
    every other store goes through zarr."""
    local = zarr.storage.LocalStore(tmp_path / "a.zarr")
    assert RecordingStore(local).file_writer() is not None
    read_only = zarr.storage.LocalStore(tmp_path / "a.zarr", read_only=True)
    assert RecordingStore(read_only).file_writer() is None
    assert RecordingStore(zarr.storage.MemoryStore()).file_writer() is None


def test_attention_folders_made_ahead_hold_the_chunks_written_after_and_nothing_else(
        tmp_path, monkeypatch):
    """`make_attention_folders` makes the folders of some inputs' attention chunks (no file),
    so writing those chunks makes no folder; inputs past the array's end are left out, and a
    store with no folders (memory) gets nothing."""
    make_model(tmp_path / "s.zarr")
    group = open_model(tmp_path / "s.zarr", "m", mode="r+")
    n = group["attention"].shape[0]
    store_module.make_attention_folders(group, 1, n + 3)
    chunks = tmp_path / "s.zarr" / "m" / "attention" / "c"
    assert sorted(int(p.name) for p in chunks.iterdir()) == list(range(1, n))
    assert not [p for p in chunks.rglob("*") if p.is_file()]
    made = []
    real_mkdir = os.mkdir

    def mkdir(path, *args, **kwargs):
        real_mkdir(path, *args, **kwargs)  # raises where the folder exists: nothing made
        made.append(path)

    monkeypatch.setattr(os, "mkdir", mkdir)
    values = np.random.default_rng(1).random((2, *group["attention"].shape[1:]))
    write_attention(group, 1, values.astype(np.float32))
    assert made == []
    assert np.array_equal(group["attention"][1:3], values.astype(np.float32))
    write_attention(group, 0, values[:1].astype(np.float32))  # not made ahead: made now
    assert made
    memory = zarr.open_group(RecordingStore(zarr.storage.MemoryStore()), mode="w")
    memory.create_array("attention", shape=(2, 3), chunks=(1, 3), dtype="float32")
    store_module.make_attention_folders(memory, 0, 2)  # nothing to make, no error


def test_folders_are_made_from_the_top_down_each_tried_once(tmp_path, monkeypatch):
    """`make_folders` tries each folder of the keys once, parents first (one mkdir per folder,
    none that fails for a missing parent), and a second call over made folders is no error."""
    (tmp_path / "a.zarr").mkdir()
    store = RecordingStore(zarr.storage.LocalStore(tmp_path / "a.zarr"))
    tries, real_mkdir = [], os.mkdir

    def mkdir(path, *args, **kwargs):
        tries.append(os.path.relpath(path, tmp_path / "a.zarr"))
        real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(recording.os, "mkdir", mkdir)
    keys = [f"m/attention/c/{i}/0/0/0/0" for i in range(3)]
    store.make_folders(keys)
    chains = [f"m/attention/c/{i}" + "/0" * depth for i in range(3) for depth in range(4)]
    assert tries == ["m", "m/attention", "m/attention/c", *chains]
    assert all((tmp_path / "a.zarr" / folder).is_dir() for folder in tries)
    store.make_folders(keys)
    assert not [p for p in (tmp_path / "a.zarr").rglob("*") if p.is_file()]


@pytest.mark.parametrize("failing", ["write", "replace"])
def test_a_chunk_file_write_records_what_it_wrote_and_a_failed_one_leaves_the_old_file(
        tmp_path, monkeypatch, failing):
    store = RecordingStore(zarr.storage.LocalStore(tmp_path / "a.zarr"))
    write = store.file_writer()
    data = np.arange(12, dtype=np.uint8)
    write("x/c/0", data)
    assert (tmp_path / "a.zarr" / "x" / "c" / "0").read_bytes() == data.tobytes()
    assert store.written["x/c/0"] == [12, crc32c_of(data.tobytes())]

    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(recording.os, failing, full)  # the disk full mid-write, or at the rename
    with pytest.raises(OSError, match="No space"):
        write("x/c/0", np.zeros(12, dtype=np.uint8))
    assert [p.name for p in (tmp_path / "a.zarr" / "x" / "c").iterdir()] == ["0"]
    assert (tmp_path / "a.zarr" / "x" / "c" / "0").read_bytes() == data.tobytes()
    assert store.written["x/c/0"] == [12, crc32c_of(data.tobytes())]


@pytest.mark.parametrize("memory", ["zarr", "obstore"])
def test_a_store_that_keeps_its_buffers_gets_copies_of_a_reused_batch_buffer(memory):
    """The extraction reuses one batch buffer; an in-memory store (zarr's, obstore's through
    zarr's ObjectStore, under zarr wrappers) keeps what it is given, so each chunk it gets is a
    copy: the first batch's values survive the second batch written from the same buffer."""
    import obstore.store

    from storage.recording import RecordingStore

    inner = (zarr.storage.MemoryStore() if memory == "zarr"
             else zarr.storage.ObjectStore(obstore.store.MemoryStore()))
    group = zarr.open_group(RecordingStore(inner), mode="w", zarr_format=3)
    group.create_array("attention", shape=(4, 3, 1, 5, 5), chunks=(1, 3, 1, 5, 5),
                       dtype="float32", compressors=None, filters=None,
                       dimension_names=("input", "layer", "head", "query", "key"))
    assert store_module.raw_chunks(group["attention"])
    values = np.random.default_rng(1).random((4, 3, 1, 5, 5)).astype(np.float32)
    buffer = np.empty((2, 3, 1, 5, 5), np.float32)
    for start in (0, 2):
        buffer[...] = values[start:start + 2]
        write_attention(group, start, buffer)
    assert np.array_equal(group["attention"][:], values)


@pytest.mark.parametrize(("block_bytes", "reads"), [(1 << 30, 1), (4 * 3 * 25 * 2, 5)])
def test_stored_attention_reads_a_shard_in_blocks_of_inputs(tmp_path, monkeypatch,
                                                            block_bytes, reads):
    """A test task holds one block of inputs (READ_BLOCK_BYTES), not its shard: here the
    whole shard of 10 in one read, or two inputs (3 layers x 1 head x 5 x 5 float32) per read."""
    make_model(tmp_path / "s.zarr")
    group = open_model(tmp_path / "s.zarr", "m", mode="r+")
    values = np.random.default_rng(2).random((10, 3, 1, 5, 5)).astype(np.float32)
    group["attention"][:] = values
    calls = []
    monkeypatch.setattr(store_module, "READ_BLOCK_BYTES", block_bytes)
    real = store_module.read_attention  # counts the store reads
    monkeypatch.setattr(store_module, "read_attention",
                        lambda *args: calls.append(args[1:]) or real(*args))
    shard = store_module.StoredAttention(group, 0, 10)
    assert shard.shape == (10, 3, 1, 5, 5)
    assert all(np.array_equal(shard[i], values[i]) for i in range(10))
    assert len(calls) == reads
    with pytest.raises(IndexError):
        shard[10]


def test_stored_attention_reads_each_block_into_the_given_buffer(tmp_path, monkeypatch):
    """With a buffer, every block lands in the memory it returns (reused across blocks and
    tasks), with the values a fresh read gives."""
    make_model(tmp_path / "s.zarr")
    group = open_model(tmp_path / "s.zarr", "m", mode="r+")
    values = np.random.default_rng(3).random((10, 3, 1, 5, 5)).astype(np.float32)
    group["attention"][:] = values
    monkeypatch.setattr(store_module, "READ_BLOCK_BYTES", 4 * 3 * 25 * 4)  # 4 inputs a block
    memory = np.full(4 * 3 * 25, np.nan, dtype=np.float32)
    shapes = []

    def buffer(shape):
        shapes.append(shape)
        return memory[: int(np.prod(shape))].reshape(shape)

    shard = store_module.StoredAttention(group, 0, 10, buffer=buffer)
    for i in range(10):
        block = shard[i]
        assert np.shares_memory(block, memory) and np.array_equal(block, values[i])
    assert shapes == [(4, 3, 1, 5, 5), (4, 3, 1, 5, 5), (2, 3, 1, 5, 5)]


def test_stores_with_compressed_attention_still_read(tmp_path):
    """Stores written before attention was stored raw keep their zstd chunks, readable as ever."""
    group = zarr.open_group(tmp_path / "old.zarr", mode="w")
    array = group.create_array("attention", shape=(2, 3, 5, 5), chunks=(1, 3, 5, 5),
                               dtype="float32")
    values = np.random.default_rng(1).random((2, 3, 5, 5)).astype(np.float32)
    array[:] = values
    reopened = zarr.open_group(tmp_path / "old.zarr", mode="r")["attention"]
    assert reopened.compressors and np.array_equal(reopened[:], values)


def test_unwritten_results_read_as_their_fill_values(tmp_path):
    make_model(tmp_path / "s.zarr")
    results = open_model(tmp_path / "s.zarr", "m")["results"]
    assert (results["status"][:] == -1).all() and np.isnan(results["kappa"][:]).all()


def test_same_fingerprint_reopens_and_a_different_one_is_refused_naming_the_key(tmp_path):
    root = make_model(tmp_path / "s.zarr")
    assert not ensure_model(root, "m", input_ids=IDS, n_layers=3, t_max=5, shard_size=4,
                            token_sets=("all", "content"), attrs={}, fingerprint_inputs=INPUTS)
    changed = {**INPUTS, "tol": 1e-9}
    with pytest.raises(StoreMismatchError) as caught:
        ensure_model(root, "m", input_ids=IDS, n_layers=3, t_max=5, shard_size=4,
                     token_sets=("all", "content"), attrs={}, fingerprint_inputs=changed)
    assert "models.m.tol: 1e-12 -> 1e-09" in str(caught.value)
    assert isinstance(caught.value, InputError)


def test_a_group_without_fingerprint_was_unfinished_and_is_rebuilt(tmp_path):
    root = create_root(tmp_path / "s.zarr")
    root.create_group("m").create_array("junk", shape=(1,), dtype="int8")
    assert ensure_model(root, "m", input_ids=IDS, n_layers=3, t_max=5, shard_size=4,
                        token_sets=("all",), attrs={}, fingerprint_inputs=INPUTS)
    assert "junk" not in root["m"]


def test_shard_writes_must_cover_one_whole_shard(tmp_path):
    make_model(tmp_path / "s.zarr")
    group = open_model(tmp_path / "s.zarr", "m", mode="r+")
    write_tokens(group, 8, np.array([3, 4], np.int32), np.zeros((2, 5), np.int8))
    assert list(group["n_tokens"][:]) == [0] * 8 + [3, 4]
    with pytest.raises(ValueError, match="whole shard"):
        write_tokens(group, 2, np.ones(4, np.int32), np.zeros((4, 5), np.int8))
    results = {name: np.zeros((3, 3, 1, 2), var.dtype) for name, var in RESULT_VARS.items()}
    with pytest.raises(ValueError, match="whole shard"):
        write_results(group, 0, results)


def test_write_results_writes_every_variable_of_its_shard_and_no_other(tmp_path):
    """The variables are written together (concurrently); each lands in its own shard's rows
    only, and the arrays come back by name (their chunk paths vouch for the shard)."""
    make_model(tmp_path / "s.zarr")
    group = open_model(tmp_path / "s.zarr", "m", mode="r+")
    rng = np.random.default_rng(5)
    results = {name: (rng.random((4, 3, 1, 2)) * 100).astype(var.dtype)
               for name, var in RESULT_VARS.items()}
    arrays = write_results(group, 4, results)
    assert set(arrays) == set(RESULT_VARS)
    for name, var in RESULT_VARS.items():
        stored = group["results"][name][:]
        assert arrays[name].path == group["results"][name].path
        assert np.array_equal(stored[4:8], results[name]), name
        untouched = np.concatenate([stored[:4], stored[8:]])
        assert np.array_equal(untouched, np.full_like(untouched, var.fill), equal_nan=True), name


def test_a_test_task_whose_result_write_fails_is_not_done_and_reruns_to_the_same_results(
        tmp_path, monkeypatch):
    """One of the concurrent result writes failing (a full disk) fails the task with that error
    and leaves no done marker; the rerun writes every variable, as the shard's evaluation gives."""
    make_model(tmp_path / "s.zarr")
    group = open_model(tmp_path / "s.zarr", "m", mode="r+")
    rng = np.random.default_rng(8)
    attention = rng.random((4, 3, 1, 5, 5)).astype(np.float32)
    attention /= attention.sum(-1, keepdims=True)
    kinds = np.array([[0, 1, 1, 1, 1]] * 4, np.int8)  # CLS, then content
    write_attention(group, 4, attention)
    write_tokens(group, 4, np.full(4, 5, np.int32), kinds)
    task = TestTask("test-m-00001", str(tmp_path / "s.zarr"), "m", 1, 4, 8, ("all", "content"),
                    1e-12)
    real = zarr.AsyncArray.setitem

    async def full_disk(self, selection, value, *args, **kwargs):
        if self.path.endswith("results/margin"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return await real(self, selection, value, *args, **kwargs)

    monkeypatch.setattr(zarr.AsyncArray, "setitem", full_disk)
    with pytest.raises(OSError, match="No space left"):
        run_test(task)
    assert not markers.is_done(tmp_path / "s.zarr", task.scope, task.marker)
    monkeypatch.setattr(zarr.AsyncArray, "setitem", real)
    assert run_test(task) == 4
    assert markers.is_done(tmp_path / "s.zarr", task.scope, task.marker)
    expected = evaluate_shard(attention, np.full(4, 5), kinds, ("all", "content"), 1e-12)
    for name, values in expected.items():
        assert np.array_equal(group["results"][name][4:8], values, equal_nan=True), name


def test_baseline_group_and_cell_writes(tmp_path):
    root = create_root(tmp_path / "s.zarr")
    assert ensure_baseline(root, sizes=(2, 8), trials=2500, seed=0, chunk_trials=1000, n_chunks=3,
                           tol=1e-12, nulls=("uniform", "softmax-b1"))
    write_baseline(tmp_path / "s.zarr", 1, 2, holding=130, trials=500, disagreements=0,
                   null_index=1)
    group = root["baseline"]
    assert group["holding"][:].tolist() == [[[-1, -1, -1], [-1, -1, -1]],
                                            [[-1, -1, -1], [-1, -1, 130]]]
    assert group["n"][:].tolist() == [2, 8]
    assert group["null"][:].tolist() == ["uniform", "softmax-b1"]
    for name, var in BASELINE_VARS.items():
        assert group[name].metadata.dimension_names == var.dims
    with pytest.raises(StoreMismatchError, match=r"baseline.trials: 2500 -> 3000"):
        ensure_baseline(root, sizes=(2, 8), trials=3000, seed=0, chunk_trials=1000, n_chunks=3,
                        tol=1e-12, nulls=("uniform", "softmax-b1"))


def test_a_folder_holding_other_files_is_never_turned_into_a_store(tmp_path):
    (tmp_path / "data.csv").write_text("a,b\n")
    with pytest.raises(InputError, match="not a sweep store"):
        create_root(tmp_path)
    assert not (tmp_path / "zarr.json").exists()


def test_not_a_store_is_a_one_line_input_error(tmp_path):
    with pytest.raises(InputError, match="not a sweep store"):
        open_root(tmp_path / "nothing")
    make_model(tmp_path / "s.zarr")
    with pytest.raises(InputError, match=r"no model 'x'; it holds \['m'\]"):
        open_model(tmp_path / "s.zarr", "x")


def test_markers_done_failed_pending_and_status(tmp_path):
    store = tmp_path / "s.zarr"
    make_model(store)
    markers.mark_failed(store, "m", "extract-00001", "boom: RuntimeError")
    markers.mark_done(store, "m", "extract-00000")
    assert markers.read_state(store, "m", "extract-00000").state == "done"
    assert markers.read_state(store, "m", "extract-00001").error == "boom: RuntimeError"
    assert markers.read_state(store, "m", "test-00000").state == "pending"
    stages = {(s.scope, s.stage): s for s in store_status(store)}
    assert stages["m", "extract"].done == 1 and stages["m", "extract"].failed == {
        "extract-00001": "boom: RuntimeError"}
    assert stages["m", "test"].pending == 3
    markers.mark_done(store, "m", "extract-00001")  # a later success clears the failure
    assert markers.read_state(store, "m", "extract-00001").state == "done"
    leftovers = [p for p in (store / ".sweep" / "markers").rglob("*") if p.name.startswith(".")]
    assert leftovers == []


def test_describe_changes_lists_dotted_keys():
    old = {"a": 1, "b": {"c": [1, 2], "d": "x"}}
    new = {"a": 1, "b": {"c": [1, 3]}, "e": True}
    assert describe_changes(old, new) == [
        "b.c: [1,2] -> [1,3]", "b.d: \"x\" -> (absent)", "e: (absent) -> true"]


HOLD = """
import sys, time
from storage.lock import StoreLock
with StoreLock(sys.argv[1]):
    print("locked", flush=True)
    time.sleep(60)
"""


def test_lock_refuses_a_second_holder_and_is_freed_by_sigkill(tmp_path):
    store = tmp_path / "s.zarr"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(store)], stdout=subprocess.PIPE,
                              env=env, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(StoreBusyError) as caught, StoreLock(store):
            pass
        assert f"store {store} is in use by another sweep run (pid {holder.pid})" in str(
            caught.value)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    deadline = time.monotonic() + 10
    while True:
        try:
            with StoreLock(store):
                break
        except StoreBusyError:
            assert time.monotonic() < deadline
            time.sleep(0.1)


def test_a_run_refused_for_a_bad_model_leaves_no_store_folder(tmp_path, capsys):
    from sweep.cli.entry import main

    (tmp_path / "lines.txt").write_text("one line\n")
    config = tmp_path / "sweep.yaml"
    config.write_text(
        "store: new.zarr\n"
        "datasets:\n  lines: {kind: text, path: lines.txt}\n"
        "models:\n  m: {source: no-such-model, dataset: lines}\n"
    )
    assert main(["run", str(config), "--in-process"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no-such-model" in err[0]
    assert not (tmp_path / "new.zarr").exists()


def test_the_lock_keeps_an_existing_store_folder(tmp_path):
    store = tmp_path / "kept.zarr"
    store.mkdir()
    with StoreLock(store):
        pass
    assert store.is_dir()

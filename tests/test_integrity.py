"""Unit tests of the fault machinery: chunk checksums in done markers, input digests, the YAML
reader, the errno -> fix lines. No model, no sweep: fast."""

from __future__ import annotations

import errno
import hashlib
import os
from types import SimpleNamespace

import google_crc32c
import numpy as np
import pytest
import yaml
import zarr

import storage.integrity
from storage import markers
from storage.errors import InputError
from storage.integrity import (
    SIZE,
    STAT,
    check_chunks,
    checksums,
    chunk_files,
    damaged_chunks,
    scan_store,
    variable_of,
)
from storage.location import StoreRef, locate
from sweep.config.yaml_io import load_yaml, read_text
from sweep.driver.freshness import damaged_tasks
from sweep.terminal.faults import classify, os_error_line
from workers.inputs import DatasetSpec, open_dataset
from workers.inputs.digests import input_digests


@pytest.fixture
def written(tmp_path):
    """A store with one array of 3 chunks, chunk 1 left at the fill value (not written)."""
    root = zarr.open_group(str(tmp_path / "s.zarr"), mode="w", zarr_format=3)
    array = root.create_group("m").create_array("x", shape=(6,), chunks=(2,), dtype="f8",
                                                fill_value=0.0)
    array[:] = np.array([1.0, 2.0, 0.0, 0.0, 5.0, 6.0])
    files = chunk_files(array, [(0,), (1,), (2,)])
    store = tmp_path / "s.zarr"
    markers.mark_done(store, "m", "extract-00000", checksums(store, files))
    return store, files


def test_marker_vouches_for_written_and_skipped_chunks(written):
    store, files = written
    vouched = markers.vouched_chunks(store, "m", "extract-00000")
    assert files == ["m/x/c/0", "m/x/c/1", "m/x/c/2"]
    assert vouched["m/x/c/1"] is None
    assert vouched["m/x/c/0"][0] == (store / "m/x/c/0").stat().st_size
    assert damaged_chunks(store, vouched) == [] and scan_store(store) == {}
    assert markers.is_done(store, "m", "extract-00000")


@pytest.mark.parametrize("damage, quick_finds", [
    (lambda p: p.unlink(), True),
    (lambda p: p.write_bytes(p.read_bytes()[:3]), True),
    (lambda p: p.write_bytes(bytes(len(p.read_bytes()))), False),  # same size: needs the hash
])
def test_deleted_truncated_or_garbage_chunks_are_found(written, damage, quick_finds):
    store, _ = written
    damage(store / "m/x/c/2")
    vouched = markers.vouched_chunks(store, "m", "extract-00000")
    assert damaged_chunks(store, vouched) == ["m/x/c/2"]
    assert (damaged_chunks(store, vouched, depth=SIZE) == ["m/x/c/2"]) == quick_finds
    assert scan_store(store) == {"m/extract-00000.done": ["m/x/c/2"]}
    assert variable_of("m/x/c/2") == "m/x"


def test_a_chunk_appearing_where_none_was_written_is_damage(written):
    store, _ = written
    (store / "m/x/c/1").write_bytes(b"junk")
    assert damaged_chunks(store, markers.vouched_chunks(store, "m", "extract-00000")) == [
        "m/x/c/1"]


def test_old_and_unreadable_markers(tmp_path):
    store = tmp_path
    markers.mark_done(store, "m", "a")  # from before checksums: nothing to verify
    assert markers.vouched_chunks(store, "m", "a") is None
    (store / ".sweep/markers/m/b.done").write_text("{garbage")
    assert damaged_chunks(store, markers.vouched_chunks(store, "m", "b")) != []


def flip_one_byte(path, keep_mtime: bool) -> None:
    """Flip the last byte of `path` in place (same size); its mtime set back if `keep_mtime`."""
    stat = path.stat()
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))
    if keep_mtime:
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def set_mtime(path, shift_ns: int) -> None:
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + shift_ns))


def one_task_plan(store):
    task = SimpleNamespace(store=store, scope="m", marker="extract-00000", key="extract-m-00000")
    return SimpleNamespace(tasks=[task], config=SimpleNamespace(store_ref=StoreRef.of(store))), task


@pytest.fixture
def reads(monkeypatch):
    """The files `storage.integrity` reads to hash, in order."""
    seen = []
    real = storage.integrity.digest_of

    def counting(store, key, like=storage.integrity.CRC32C):
        seen.append(str(locate(store).local_path() / key))
        return real(store, key, like)

    monkeypatch.setattr(storage.integrity, "digest_of", counting)
    return seen


def test_new_markers_hold_size_crc32c_and_mtime(written):
    store, _ = written
    entry = markers.vouched_chunks(store, "m", "extract-00000")["m/x/c/0"]
    path = store / "m/x/c/0"
    assert entry == [path.stat().st_size, f"crc32c:{google_crc32c.value(path.read_bytes()):08x}",
                     path.stat().st_mtime_ns]


def test_old_sha256_markers_still_verify(written):
    store, files = written
    old = {f: None if not (store / f).exists() else
           [(store / f).stat().st_size, hashlib.sha256((store / f).read_bytes()).hexdigest()]
           for f in files}
    markers.mark_done(store, "m", "extract-00000", old)
    vouched = markers.vouched_chunks(store, "m", "extract-00000")
    assert damaged_chunks(store, vouched) == []
    check = check_chunks(store, vouched, depth=STAT)  # no mtime: re-hashed, with sha256
    assert check.damaged == [] and sorted(check.rehashed) == ["m/x/c/0", "m/x/c/2"]
    assert check.rehashed["m/x/c/2"][:2] == old["m/x/c/2"]
    flip_one_byte(store / "m/x/c/2", keep_mtime=True)
    assert damaged_chunks(store, vouched, depth=STAT) == ["m/x/c/2"]


def test_crc32c_finds_a_one_byte_flip_that_keeps_size_and_mtime_only_with_verify(written):
    store, _ = written
    plan, task = one_task_plan(store)
    flip_one_byte(store / "m/x/c/0", keep_mtime=True)
    vouched = markers.vouched_chunks(store, "m", "extract-00000")
    assert damaged_chunks(store, vouched, depth=STAT) == []  # the stat check's documented limit
    assert damaged_chunks(store, vouched) == ["m/x/c/0"]
    assert damaged_tasks(plan) == []
    assert damaged_tasks(plan, verify=True) == [task]


def test_a_same_size_overwrite_with_a_new_mtime_is_rehashed_and_found(written, reads):
    store, _ = written
    path = store / "m/x/c/2"
    path.write_bytes(bytes(path.stat().st_size))
    set_mtime(path, 10**9)  # the write's own mtime may fall in the marker's timestamp tick
    plan, task = one_task_plan(store)
    assert damaged_tasks(plan) == [task]
    assert reads == [str(path)]


def test_a_touched_but_identical_chunk_is_intact_and_its_marker_refreshed(written, reads):
    store, _ = written
    plan, _ = one_task_plan(store)
    assert damaged_tasks(plan) == [] and reads == []  # untouched: a stat each, no read
    set_mtime(store / "m/x/c/0", 10**9)
    assert damaged_tasks(plan) == [] and reads == [str(store / "m/x/c/0")]
    entry = markers.vouched_chunks(store, "m", "extract-00000")["m/x/c/0"]
    assert entry[2] == (store / "m/x/c/0").stat().st_mtime_ns
    assert damaged_tasks(plan) == [] and len(reads) == 1  # refreshed: not read again
    assert damaged_tasks(plan, verify=True) == [] and len(reads) == 3  # --verify reads all


def test_text_digests_follow_the_content_not_the_id(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("one line here\ntwo lines here\n")
    spec = DatasetSpec(kind="text", path=str(path))
    before = input_digests(open_dataset(spec), range(2))
    path.write_text("one line here\ntwo lines changed\n")
    after = input_digests(open_dataset(spec), range(2))
    assert before[0] == after[0] and before[1] != after[1]


def test_image_digests_use_stat_not_the_pixels(tmp_path):
    from PIL import Image

    Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
    spec = DatasetSpec(kind="image", path=str(tmp_path))
    before = input_digests(open_dataset(spec), range(1))
    stat = (tmp_path / "a.png").stat()
    os.utime(tmp_path / "a.png", ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
    assert input_digests(open_dataset(spec), range(1)) != before


def test_bundled_photo_digests_follow_the_bytes_not_the_installation(tmp_path):
    """The driver's venv and a worker image hold scikit-learn's photos with other mtimes."""
    dataset = open_dataset(DatasetSpec(kind="image", source="sklearn:sample_images", limit=3))
    before = input_digests(dataset, range(3))
    copies = [tmp_path / f.name for f in dataset.files]
    for original, copy in zip(dataset.files, copies, strict=True):
        copy.write_bytes(original.read_bytes())
        os.utime(copy, ns=(0, original.stat().st_mtime_ns + 10**9))
    dataset.files = copies
    assert input_digests(dataset, range(3)) == before
    copies[0].write_bytes(copies[0].read_bytes()[:-1] + b"\x00")  # china.jpg, and its tile
    after = input_digests(dataset, range(3))
    assert after[0] != before[0] and after[1] == before[1] and after[2] != before[2]


def test_tabular_digests_fold_in_the_table_for_models_trained_on_it():
    dataset = open_dataset(DatasetSpec(kind="tabular", source="sklearn:wine", limit=3))
    rows = input_digests(dataset, range(3))
    assert len(set(rows)) == 3
    assert input_digests(dataset, range(3), whole_table=True) != rows


def test_yaml_reader_refuses_duplicate_keys_with_lines(tmp_path):
    with pytest.raises(yaml.YAMLError) as raised:
        load_yaml("a: 1\nb:\n  c: 2\n  c: 3\n")
    assert raised.value.problem_mark.line + 1 == 4
    assert "duplicate key 'c' (first at line 3)" in raised.value.problem
    assert load_yaml("a: {b: 1}\nc: [1, 2]\n") == {"a": {"b": 1}, "c": [1, 2]}
    path = tmp_path / "x.yaml"
    path.write_bytes(b"a: 1\nb: \xff\n")
    with pytest.raises(InputError, match=r"x.yaml: line 2: not UTF-8 \(byte 8"):
        read_text(path)


def test_os_errors_name_the_path_and_the_fix():
    error = OSError(errno.EROFS, os.strerror(errno.EROFS), "/data/s.zarr")
    assert os_error_line(error) == (
        "/data/s.zarr: Read-only file system; the file system is read-only; choose a writable "
        "path")
    assert classify(error)[0] == 3
    assert classify(KeyboardInterrupt())[0] == 130
    assert classify(InputError("x"))[0] == 2
    assert classify(RuntimeError("a bug")) is None

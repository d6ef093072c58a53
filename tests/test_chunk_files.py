"""Chunk files written around the page cache (`storage.recording.write_all`): the same bytes as a
buffered write, whatever the data's length and alignment; direct only for the whole pages of
page-aligned data on a file system that takes it, buffered where the kernel refuses; the
extraction's host buffers put each input's chunk on its own pages."""

from __future__ import annotations

import errno
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import zarr

from storage import recording
from storage.recording import ALIGN, O_DIRECT, RecordingStore, mount_file_system, put_file
from workers.tasks.buffers import ChunkBuffers

LENGTHS = [0, 100, ALIGN, 3 * ALIGN + 7, 1_862_832]  # 1,862,832: a ViT-B input's chunk

MOUNTS = [SimpleNamespace(mountpoint=point, fstype=kind) for point, kind in [
    ("/", "ext4"), ("/proc", "proc"), ("/dev/shm", "tmpfs"), ("/scratch", "nfs4"),
    ("/scratch/local disk", "xfs"), ("/mnt/x", "ext4"), ("/mnt/x", "fuse.sshfs"),
]]  # as psutil.disk_partitions gives them, in mount order: the second /mnt/x hides the first


def aligned_bytes(n: int, offset: int = 0) -> np.ndarray:
    """`n` random bytes starting `offset` bytes past a page."""
    pages = np.zeros(n + 2 * ALIGN, dtype=np.uint8)
    start = -pages.ctypes.data % ALIGN + offset
    out = pages[start:start + n]
    out[:] = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)
    return out


def direct_writes(monkeypatch) -> list[int]:
    """Spy on `os.write` in storage.recording: the bytes of each write made with O_DIRECT set."""
    import fcntl

    seen, real = [], os.write

    def write(fd, data):
        done = real(fd, data)
        if fcntl.fcntl(fd, fcntl.F_GETFL) & O_DIRECT:
            seen.append(done)
        return done

    monkeypatch.setattr(recording.os, "write", write)
    return seen


@pytest.mark.parametrize("offset", [0, 16])
@pytest.mark.parametrize("length", LENGTHS)
def test_a_file_written_direct_holds_the_same_bytes_and_only_whole_aligned_pages_go_direct(
        tmp_path, monkeypatch, length, offset):
    data = aligned_bytes(length, offset)
    seen = direct_writes(monkeypatch)
    put_file(tmp_path / "c" / "0", data, direct=True)
    assert (tmp_path / "c" / "0").read_bytes() == data.tobytes()
    assert [p.name for p in (tmp_path / "c").iterdir()] == ["0"]  # no partial file left
    if not O_DIRECT or not recording.takes_direct(str(tmp_path)):
        assert seen == []
        pytest.skip(f"{tmp_path} is not on {sorted(recording.DIRECT_FILE_SYSTEMS)}: buffered")
    whole = length // ALIGN * ALIGN if offset == 0 else 0
    assert sum(seen) == whole and all(n % ALIGN == 0 for n in seen)


def test_a_buffered_write_sets_no_direct_flag(tmp_path, monkeypatch):
    data = aligned_bytes(3 * ALIGN)
    seen = direct_writes(monkeypatch)
    put_file(tmp_path / "0", data)
    assert seen == [] and (tmp_path / "0").read_bytes() == data.tobytes()


@pytest.mark.parametrize("refused", ["fcntl", "write"])
def test_a_direct_write_the_kernel_refuses_goes_on_buffered(tmp_path, monkeypatch, refused):
    """EINVAL for O_DIRECT on the open file, or for the direct write itself: the file is whole,
    written buffered; any other error is the caller's."""
    import fcntl

    data = aligned_bytes(5 * ALIGN + 3)
    real_fcntl, real_write = fcntl.fcntl, os.write

    def setfl(fd, cmd, *args):
        if refused == "fcntl" and cmd == fcntl.F_SETFL and args[0] & O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_fcntl(fd, cmd, *args)

    def write(fd, view):
        if refused == "write" and real_fcntl(fd, fcntl.F_GETFL) & O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(fd, view)

    monkeypatch.setattr(recording, "O_DIRECT", O_DIRECT or 0o40000)
    monkeypatch.setattr(recording.fcntl, "fcntl", setfl)
    monkeypatch.setattr(recording.os, "write", write)
    put_file(tmp_path / "0", data, direct=True)
    assert (tmp_path / "0").read_bytes() == data.tobytes()

    def full(fd, view):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(recording.os, "write", full)
    with pytest.raises(OSError, match="No space"):
        put_file(tmp_path / "0", data, direct=True)
    assert (tmp_path / "0").read_bytes() == data.tobytes()  # the old file stays


@pytest.mark.parametrize(("path", "kind"), [
    ("/", "ext4"), ("/home/user/runs", "ext4"), ("/proc/self", "proc"),
    ("/dev/shm/x", "tmpfs"), ("/scratch/runs", "nfs4"), ("/scratch/local disk/runs", "xfs"),
    ("/scratch/local diskette", "nfs4"), ("/mnt/x/store.zarr", "fuse.sshfs"),
])
def test_the_file_system_is_the_longest_mount_point_above_the_path_the_last_one_mounted(
        path, kind):
    assert mount_file_system(path, MOUNTS) == kind


def test_only_local_disks_are_written_direct(monkeypatch):
    """ext4 and xfs; not tmpfs, NFS, FUSE or a path no mount lists."""
    def kinds(root):
        return mount_file_system(root, MOUNTS)

    monkeypatch.setattr(recording, "mount_file_system", kinds)
    recording.takes_direct.cache_clear()
    try:
        takes = {root: recording.takes_direct(root)
                 for root in ("/runs", "/scratch/local disk", "/scratch", "/dev/shm", "/mnt/x")}
    finally:
        recording.takes_direct.cache_clear()
    assert takes == {"/runs": bool(O_DIRECT), "/scratch/local disk": bool(O_DIRECT),
                     "/scratch": False, "/dev/shm": False, "/mnt/x": False}


@pytest.mark.parametrize("shape", [(2, 1, 197, 197), (2, 1, 8, 8), (1, 2, 32, 32)])
def test_each_input_of_the_extractions_buffers_starts_on_a_page_and_is_written_as_its_bytes(
        tmp_path, shape):
    """Every row of every host buffer is C-contiguous and starts on a page; the chunk files
    written from a buffer's rows are the rows' bytes, and the values read back are theirs."""
    buffers = ChunkBuffers("m", shape, rows=3, each=False, device=torch.device("cpu"), count=2)
    for host in buffers.host:
        assert host.shape == (3, *shape)
        for row in host:
            assert row.is_contiguous() and row.data_ptr() % ALIGN == 0
    values = np.random.default_rng(0).random((3, *shape)).astype(np.float32)
    buffers.host[1].numpy()[...] = values
    store = RecordingStore(zarr.storage.LocalStore(tmp_path / "s.zarr"))
    write = store.file_writer()
    filled = buffers.filled(1, 3).ready()
    for i, row in enumerate(filled):
        write(f"c/{i}", row.reshape(-1).view(np.uint8))
        assert (tmp_path / "s.zarr" / "c" / str(i)).read_bytes() == values[i].tobytes()

"""Every environment fault and bad input of issue 11: one stderr line, an exit code by cause
(2 input, 3 environment, 4 damaged store), and every folder involved left byte for byte as it
was. OS faults use a tiny or read-only tmpfs mount (root only; skipped with the reason else)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from sweep.cli.entry import main
from tests.fault_helpers import LINES, env, one_stderr_line, tree_digest, write_text_sweep
from tests.store_fixtures import hand_store


@contextmanager
def tmpfs(path: Path, size: str = "1m") -> Iterator[Path]:
    """A fresh tmpfs of `size` at `path` (skips the test where mounting is not allowed)."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, check=False)
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip()}): needs root")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def read_only(path: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)


def fails(capsys, argv: list[str], code: int) -> str:
    """Run the CLI, assert its exit code and a single stderr line; return that line."""
    assert main(argv) == code
    return one_stderr_line(capsys.readouterr().err)


def test_non_utf8_config_is_one_line_exit_2(tmp_path, capsys):
    path = write_text_sweep(tmp_path)
    path.write_bytes(path.read_bytes().replace(b"shard_size", b"shard_\xffsize"))
    before = tree_digest(tmp_path)
    line = fails(capsys, ["run", str(path), "--in-process"], 2)
    assert "sweep.yaml: line 2: not UTF-8" in line and "save the file as UTF-8" in line
    assert tree_digest(tmp_path) == before


def test_duplicate_yaml_keys_are_refused_in_sweep_and_cluster_files(tmp_path, capsys):
    path = write_text_sweep(tmp_path, extra="shard_size: 3\n")
    before = tree_digest(tmp_path)
    line = fails(capsys, ["run", str(path), "--in-process"], 2)
    assert "duplicate key 'shard_size' (first at line 2)" in line and "line 4" in line
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("kind: local\nlocal: {threads: 1}\nkind: slurm\n")
    path = write_text_sweep(tmp_path)
    before = tree_digest(tmp_path)
    line = fails(capsys, ["run", str(path), "--cluster", str(cluster)], 2)
    assert "cluster.yaml line 3" in line and "duplicate key 'kind'" in line
    assert tree_digest(tmp_path) == before


def test_bad_memory_limit_is_refused_at_parse(tmp_path, capsys):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("kind: local\nlocal:\n  memory_limit: lots\n")
    path = write_text_sweep(tmp_path)
    before = tree_digest(tmp_path)
    line = fails(capsys, ["run", str(path), "--cluster", str(cluster)], 2)
    assert "line 3: local.memory_limit: not a size" in line and "4GB" in line
    assert tree_digest(tmp_path) == before


def test_non_utf8_csv_is_one_line_exit_2(tmp_path, capsys):
    (tmp_path / "t.csv").write_bytes(b"a,b,target\n1,2,0\n3,\xe94,1\n")
    (tmp_path / "sweep.yaml").write_text(
        "store: s.zarr\ndatasets:\n  t: {path: t.csv}\n"
        "models:\n  ft: {source: ft-transformer, dataset: t}\n")
    before = tree_digest(tmp_path)
    line = fails(capsys, ["run", str(tmp_path / "sweep.yaml"), "--in-process"], 2)
    assert "t.csv: not UTF-8" in line
    assert tree_digest(tmp_path) == before


def test_text_model_on_a_tabular_dataset_is_refused_before_anything(tmp_path, capsys):
    (tmp_path / "sweep.yaml").write_text(
        "store: s.zarr\ndatasets:\n  wine: {source: 'sklearn:wine', limit: 4}\n"
        "models:\n  rob: {source: tiny-roberta, dataset: wine}\n")
    before = tree_digest(tmp_path)
    line = fails(capsys, ["run", str(tmp_path / "sweep.yaml"), "--in-process"], 2)
    assert "models.rob: 'tiny-roberta' is a text model but dataset 'wine' is tabular" in line
    assert tree_digest(tmp_path) == before


def test_store_path_that_is_a_file_is_refused(tmp_path, capsys):
    path = write_text_sweep(tmp_path)
    (tmp_path / "sweep.zarr").write_text("not a folder")
    before = tree_digest(tmp_path)
    line = fails(capsys, ["run", str(path), "--in-process"], 2)
    assert "sweep.zarr: a file, not a folder" in line
    assert tree_digest(tmp_path) == before


def test_store_on_a_read_only_file_system_is_exit_3(tmp_path, capsys):
    with tmpfs(tmp_path / "ro") as mount:
        read_only(mount)
        path = write_text_sweep(tmp_path)
        path.write_text(path.read_text().replace("store: sweep.zarr", f"store: {mount}/s.zarr"))
        before = tree_digest(mount)
        line = fails(capsys, ["run", str(path), "--in-process"], 3)
        assert f"{mount}/s.zarr" in line and "Read-only file system" in line
        assert "choose a writable path" in line
        assert tree_digest(mount) == before


def test_store_on_a_full_disk_is_exit_3_and_leaves_nothing(tmp_path, capsys):
    with tmpfs(tmp_path / "full", size="64k") as mount:
        (mount / "filler").write_bytes(b"\0" * 40_000)
        path = write_text_sweep(tmp_path)
        path.write_text(path.read_text().replace("store: sweep.zarr", f"store: {mount}/s.zarr"))
        before = tree_digest(mount)
        line = fails(capsys, ["run", str(path), "--in-process", "--no-progress"], 3)
        assert "No space left on device" in line and "the disk is full" in line
        assert tree_digest(mount) == before


def test_plots_onto_a_file_or_a_read_only_folder(tmp_path, capsys):
    store = hand_store(tmp_path / "s.zarr")
    target = tmp_path / "figures.png"
    target.write_text("x")
    before = tree_digest(store), tree_digest(target)
    line = fails(capsys, ["report", str(store), "--plots", str(target)], 2)
    assert "--plots" in line and "a file, not a folder" in line
    with tmpfs(tmp_path / "ro") as mount:
        read_only(mount)
        line = fails(capsys, ["report", str(store), "--plots", str(mount / "figs")], 3)
        assert str(mount) in line and "Read-only file system" in line
        assert list(mount.iterdir()) == []
    assert (tree_digest(store), tree_digest(target)) == before


def test_extract_out_reports_the_path_it_wrote_and_refuses_bad_places(tmp_path, capsys):
    (tmp_path / "lines.txt").write_text("\n".join(LINES[:2]) + "\n")
    argv = ["extract", "tiny-roberta", str(tmp_path / "lines.txt"), "--device", "cpu"]
    assert main([*argv, "--out", str(tmp_path / "out" / "maps")]) == 0
    assert capsys.readouterr().err.startswith(f"{tmp_path / 'out' / 'maps.npz'}: 2 inputs")
    assert (tmp_path / "out" / "maps.npz").is_file()
    before = tree_digest(tmp_path)
    line = fails(capsys, [*argv, "--out", str(tmp_path / "lines.txt" / "x.npz")], 2)
    assert "lines.txt: a file, not a folder" in line
    assert tree_digest(tmp_path) == before
    with tmpfs(tmp_path / "ro") as mount:
        read_only(mount)
        line = fails(capsys, [*argv, "--out", str(mount / "x.npz")], 3)
        assert str(mount) in line and "Read-only file system" in line
        assert list(mount.iterdir()) == []


def test_corrupt_root_metadata_is_one_line_exit_4_for_status_and_run(tmp_path, capsys):
    path = write_text_sweep(tmp_path)
    store = tmp_path / "sweep.zarr"
    store.mkdir()
    (store / "zarr.json").write_text('{"zarr_format": 3, "node_type": "gro')
    before = tree_digest(tmp_path)
    line = fails(capsys, ["status", str(store)], 4)
    assert "zarr.json is corrupt" in line and "use a new store" in line
    line = fails(capsys, ["run", str(path), "--in-process"], 4)
    assert "zarr.json is corrupt" in line
    assert tree_digest(tmp_path) == before


def test_half_created_store_is_reported_as_such(tmp_path, capsys):
    from storage.store import create_root

    create_root(tmp_path / "s.zarr")  # killed right after: no config, no groups
    before = tree_digest(tmp_path)
    line = fails(capsys, ["status", str(tmp_path / "s.zarr")], 4)
    assert "half-created" in line and "rerun `sweep run`" in line
    line = fails(capsys, ["report", str(tmp_path / "s.zarr")], 4)
    assert "half-created" in line
    assert tree_digest(tmp_path) == before


def test_truncated_cached_checkpoint_is_named(tmp_path, capsys):
    from workers.inputs import DatasetSpec, open_dataset
    from workers.models.registry import resolve_model
    from workers.models.trained.ft.adapter import checkpoint_path

    spec = resolve_model("ft-transformer")
    table = open_dataset(DatasetSpec(kind="tabular", source="sklearn:wine")).table
    checkpoint = Path(checkpoint_path(spec, table, tmp_path / "cache"))
    checkpoint.parent.mkdir()
    checkpoint.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\"")  # cut short
    checkpoint.with_suffix(".json").write_text('{"d_out": 3}')
    before = tree_digest(tmp_path)
    line = fails(capsys, ["extract", "ft-transformer", "sklearn:wine", "--limit", "2",
                          "--cache-dir", str(tmp_path / "cache"), "--out",
                          str(tmp_path / "x.npz")], 4)
    assert f"cached checkpoint {checkpoint} is truncated or corrupt" in line
    assert "delete it" in line
    assert tree_digest(tmp_path) == before


def test_npy_header_claiming_a_huge_array_is_refused_before_allocating(tmp_path, capsys):
    np.save(tmp_path / "small.npy", np.eye(3))
    header = (tmp_path / "small.npy").read_bytes()
    header = header[:header.index(b"\n") + 1].replace(b"(3, 3)", b"(100000, 100000)")
    (tmp_path / "big.npy").write_bytes(header + b"\0" * (192 - len(header)))
    assert (tmp_path / "big.npy").stat().st_size == 192
    line = fails(capsys, ["check", str(tmp_path / "big.npy")], 2)
    assert "claims shape (100000, 100000) float64 (80,000,000,000 bytes)" in line
    assert re.search(r"but the file holds \d+ bytes of data", line)


def test_missing_cuda_device_is_refused_before_anything(tmp_path, capsys, monkeypatch):
    import sweep.driver.devices

    monkeypatch.setattr(sweep.driver.devices, "cuda_device_count", lambda: 1)
    path = write_text_sweep(tmp_path, extra="device: cuda:7\n")
    before = tree_digest(tmp_path)
    line = fails(capsys, ["run", str(path), "--in-process"], 3)
    assert "models.rob.device: cuda:7 is not on this machine (1 CUDA device)" in line
    assert tree_digest(tmp_path) == before


def test_exit_codes_are_documented():
    text = (Path(__file__).parents[1] / "docs" / "faults.md").read_text()
    for code in ("| 2 |", "| 3 |", "| 4 |", "| 130 |"):
        assert code in text


def test_the_sweep_command_exits_without_finalizing_the_interpreter(tmp_path):
    """`sweep` (the console script and `python -m sweep`) flushes and leaves with `os._exit`:
    obstore's runtime threads may still finish a request the failed command gave up on, and
    one that does so while Python finalizes aborts the process (about 1 run in 20 of `sweep
    status` with wrong credentials ended in SIGABRT or SIGBUS after its one-line message).
    Seen from outside: the exit code and the message, and no atexit handler runs."""
    script = ("import atexit, sys\n"
              "atexit.register(lambda: print('finalized', file=sys.stderr))\n"
              "sys.argv = ['sweep', 'status', 'no-such-store.zarr']\n"
              "from sweep.cli import run_command\n"
              "run_command()\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env(), cwd=tmp_path, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("sweep status: ") and "no-such-store.zarr" in done.stderr
    assert "finalized" not in done.stderr

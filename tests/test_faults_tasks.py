"""Faults a task meets that are the user's input or the machine (issue 22, items 1, 3, 4): the
run ends with the one line and exit code of `sweep.terminal.faults`, as if no task graph existed;
Dask's "Compute Failed" dumps never reach the terminal (the failed marker keeps the traceback). What
the driver can see cheaply (image headers, weights files) is refused before anything is written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import sweep.driver.runner
from storage import markers
from sweep.cli.entry import main
from tests.fault_helpers import env, one_stderr_line, store_arrays, tree_digest, write_text_sweep
from tests.test_faults_env import tmpfs
from tests.test_sweep_local import assert_same_arrays


def image_sweep(folder: Path, n_images: int = 3) -> Path:
    """tiny-dinov2 over `n_images` random 40x40 PNGs in folder/imgs, shards of 2."""
    images = folder / "imgs"
    images.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(n_images):
        pixels = rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(images / f"im{i}.png")
    path = folder / "sweep.yaml"
    path.write_text("store: s.zarr\nshard_size: 2\nretries: 0\nmatched_nulls: null\n"
                    "baseline: null\ndatasets:\n  pics: {path: imgs}\n"
                    "models:\n  d: {source: tiny-dinov2, dataset: pics}\n")
    return path


@pytest.mark.parametrize("content", [b"", b"not an image at all"], ids=["0-byte", "foreign"])
def test_an_image_without_a_readable_header_is_refused_before_anything(tmp_path, capsys,
                                                                         content):
    path = image_sweep(tmp_path)
    (tmp_path / "imgs" / "bad.png").write_bytes(content)
    before = tree_digest(tmp_path)
    assert main(["run", str(path), "--in-process", "--no-progress"]) == 2
    line = one_stderr_line(capsys.readouterr().err)
    assert line.startswith(f"sweep run: error: image {tmp_path}/imgs/bad.png: cannot be read")
    assert line.endswith("remove or replace it")
    assert tree_digest(tmp_path) == before  # no store, no lock file


def test_a_corrupt_image_past_its_header_is_one_line_exit_2_on_dask(tmp_path):
    """The header reads, the pixels do not, in a folder too large for the pixel check before
    the lock (its budget set to 0 here; issue 28): the extraction task fails on a worker. Its
    traceback goes to the failed marker, not the terminal."""
    path = image_sweep(tmp_path)
    good = (tmp_path / "imgs" / "im1.png").read_bytes()
    (tmp_path / "imgs" / "im1.png").write_bytes(good[:len(good) // 2])  # truncated
    done = subprocess.run([sys.executable, "-m", "sweep", "run", str(path), "--no-progress"],
                          cwd=tmp_path, env={**env(), "DOBRUSHIN_PIXEL_CHECK_MIB": "0"},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines[0].startswith("sweep: local cluster, dashboard"), done.stderr
    assert len(lines) == 2 and "Compute Failed" not in done.stderr, done.stderr
    assert lines[1].startswith(f"sweep run: error: image {tmp_path}/imgs/im1.png: cannot be read")
    assert "1 failed" in done.stdout
    state = markers.read_state(tmp_path / "s.zarr", "d", "extract-00000")
    assert state.state == "failed" and "Traceback" in state.error


def test_a_pickled_weights_file_in_an_hf_folder_is_refused_before_anything(tmp_path, capsys):
    import torch
    from transformers import Dinov2Config, Dinov2Model

    model = tmp_path / "model"
    config = Dinov2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                          intermediate_size=64, image_size=28, patch_size=14)
    built = Dinov2Model(config)
    built.save_pretrained(model)  # the config, and weights as safetensors: swapped for a pickle
    (model / "model.safetensors").unlink()
    torch.save(built.state_dict(), model / "pytorch_model.bin")
    path = image_sweep(tmp_path)
    path.write_text(path.read_text().replace("tiny-dinov2", f"'hf:{model}'"))
    before = tree_digest(tmp_path)
    capsys.readouterr()
    assert main(["run", str(path), "--in-process", "--no-progress"]) == 2
    line = one_stderr_line(capsys.readouterr().err)
    assert f"{model} holds no .safetensors weights (it holds pytorch_model.bin" in line
    assert "re-save them as safetensors" in line
    assert tree_digest(tmp_path) == before


def test_a_disk_that_fills_mid_run_is_one_line_exit_3_and_the_rerun_completes(
        tmp_path, capsys, monkeypatch):
    reference = tmp_path / "reference"
    assert main(["run", str(write_text_sweep(reference)), "--in-process", "--no-progress"]) == 0
    with tmpfs(tmp_path / "disk", size="4m") as mount:
        path = write_text_sweep(mount)
        real, filler = sweep.driver.runner.run_task, mount / "filler"

        def fill_after_first(task):
            if not filler.exists() and task.key != "extract-rob-00000":
                with open(filler, "wb") as out:  # every byte left, then the task writes
                    try:
                        while True:
                            out.write(b"\0" * 65536)
                            out.flush()
                    except OSError:
                        pass
            return real(task)

        monkeypatch.setattr(sweep.driver.runner, "run_task", fill_after_first)
        capsys.readouterr()
        assert main(["run", str(path), "--in-process", "--no-progress"]) == 3
        line = one_stderr_line(capsys.readouterr().err)
        assert line.startswith("sweep run: environment fault: ") and "(unknown path)" not in line
        assert f"{mount}/sweep.zarr" in line and "the disk is full" in line
        filler.unlink()
        monkeypatch.setattr(sweep.driver.runner, "run_task", real)
        assert main(["run", str(path), "--in-process", "--no-progress"]) == 0
        assert_same_arrays(store_arrays(reference / "sweep.zarr"),
                           store_arrays(mount / "sweep.zarr"))


def test_a_truncated_cached_checkpoint_ends_a_sweep_run_with_exit_4(tmp_path, capsys):
    from workers.inputs import DatasetSpec, open_dataset
    from workers.models.registry import resolve_model
    from workers.models.trained.ft.adapter import checkpoint_path

    path = tmp_path / "sweep.yaml"
    path.write_text(f"store: s.zarr\nshard_size: 2\nretries: 0\nmatched_nulls: null\n"
                    f"baseline: null\ncache_dir: {tmp_path}/cache\ndatasets:\n"
                    "  wine: {source: 'sklearn:wine', limit: 2}\n"
                    "models:\n  ft: {source: ft-transformer, dataset: wine}\n")
    table = open_dataset(DatasetSpec(kind="tabular", source="sklearn:wine")).table
    checkpoint = Path(checkpoint_path(resolve_model("ft-transformer"), table, tmp_path / "cache"))
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\"")  # cut short
    checkpoint.with_suffix(".json").write_text('{"d_out": 3}')
    assert main(["run", str(path), "--in-process", "--no-progress"]) == 4
    line = one_stderr_line(capsys.readouterr().err)
    assert line.startswith(f"sweep run: damaged store: cached checkpoint {checkpoint} is "
                           "truncated or corrupt")
    assert "delete it and" in line
    assert markers.read_state(tmp_path / "s.zarr", "ft", "prepare").state == "failed"

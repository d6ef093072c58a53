"""The smoke subset (`python -m pytest -m smoke`, about a minute): the install answers, a tiny
sweep runs through the command line, a rerun after a lost task resumes it alone to the same
values, and the report reads the store. The full suite tests each of these in depth."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pytest

from storage.markers import MarkerIndex
from sweep.cli.entry import main
from tests.store_fixtures import stored_arrays

pytestmark = pytest.mark.smoke
REPO = Path(__file__).resolve().parents[1]
CONFIG = """store: tiny.zarr
shard_size: 2
cache_dir: cache
datasets:
  topics: {source: 'pydoc:topics', limit: 4}
  photos: {source: 'sklearn:sample_images', limit: 2}
models:
  text: {source: tiny-roberta, dataset: topics, batch_size: 2, control: random-init}
  image: {source: tiny-vit, dataset: photos}
baseline: {sizes: [2, 4], trials: 1000, seed: 0, chunk_trials: 1000}
matched_nulls: {trials: 1000, chunk_trials: 1000}
"""


def test_the_install_answers():
    assert version("dobrushin-sweep")
    assert shutil.which("sweep") or (Path(sys.executable).parent / "sweep").exists()
    done = subprocess.run([sys.executable, "-m", "sweep", "--help"], capture_output=True,
                          text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0 and "report" in done.stdout


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    folder = tmp_path_factory.mktemp("smoke")
    (folder / "sweep.yaml").write_text(CONFIG)
    assert main(["run", str(folder / "sweep.yaml"), "--in-process", "--no-progress"]) == 0
    return folder


def test_a_tiny_sweep_runs_to_a_finished_store(swept, capsys):
    assert main(["status", str(swept / "tiny.zarr")]) == 0  # 0: everything done
    assert "text@random-init" in capsys.readouterr().out


def test_a_rerun_after_a_lost_task_resumes_it_alone_to_the_same_values(swept, capsys):
    store = swept / "tiny.zarr"
    before = stored_arrays(store)
    MarkerIndex(store).clear("text", "test-00001")  # as if killed before its marker
    assert main(["status", str(store)]) == 1  # 1: pending
    capsys.readouterr()
    assert main(["run", str(swept / "sweep.yaml"), "--in-process", "--no-progress"]) == 0
    # the lost test and the model's 5 size-matched null tasks, which wait for its tests
    assert "6 tasks completed, 29 already done, 0 failed" in capsys.readouterr().out
    after = stored_arrays(store)
    assert sorted(after) == sorted(before)
    for key, values in before.items():
        np.testing.assert_array_equal(after[key], values, err_msg=key, strict=True)


def test_the_report_reads_the_store(swept, capsys, tmp_path):
    assert main(["report", str(swept / "tiny.zarr"), "--format", "json",
                 "--html", str(tmp_path / "r.html")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {r["model"] for r in report["summary"]} == {"text", "text@random-init", "image"}
    assert all(r["cells"] > 0 for r in report["summary"])
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")

"""Faults met during a sweep: Ctrl-C, inputs edited between runs, damaged chunks, refusals.

Each ends with the store identical, value for value, to an uninterrupted run on the final inputs,
or (for refusals) byte for byte as it was. A tiny RoBERTa over a 5-line text file keeps it fast.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zarr

import sweep.driver.preflight
import sweep.driver.runner
from storage.lock import StoreLock
from storage.store import create_root, ensure_model, write_root_attrs
from sweep.cli.entry import main
from sweep.config.load import load_config
from sweep.driver.plan import model_config_inputs
from sweep.driver.runner import InProcessExecutor, run_sweep
from sweep.terminal.interrupts import Interrupted
from tests.fault_helpers import (
    LINES,
    default_sigint,
    env,
    one_stderr_line,
    store_arrays,
    tree_digest,
    write_text_sweep,
)
from tests.test_sweep_local import assert_same_arrays

EDITED = [f"{LINES[0]} edited", *LINES[1:4], "an older last line that will change"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The folder of an uninterrupted run on LINES (its store: sweep.zarr)."""
    folder = tmp_path_factory.mktemp("reference")
    config = load_config(write_text_sweep(folder))
    assert run_sweep(config, InProcessExecutor(), progress=False).exit_code == 0
    return folder


def copy_of(reference: Path, tmp_path: Path) -> Path:
    """A copy of the reference folder whose config still reads the reference's text file (the
    dataset path is part of the fingerprint)."""
    folder = tmp_path / "copy"
    shutil.copytree(reference, folder)
    path = folder / "sweep.yaml"
    path.write_text(path.read_text().replace("path: lines.txt", f"path: {reference}/lines.txt"))
    return folder


@pytest.mark.parametrize("executor", [["--in-process"], []], ids=["in-process", "dask-local"])
def test_ctrl_c_during_run_exits_130_with_a_summary_and_the_lock_released(tmp_path, executor):
    path = write_text_sweep(tmp_path, lines=LINES * 8)  # 20 shards: still running at the signal
    store = tmp_path / "sweep.zarr"
    driver = subprocess.Popen(
        [sys.executable, "-m", "sweep", "run", str(path), *executor, "--no-progress"],
        cwd=tmp_path, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=default_sigint)
    try:
        deadline = time.monotonic() + 240
        while not list((store / ".sweep" / "markers").rglob("*.done")):
            assert driver.poll() is None, driver.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "no task finished in time"
            time.sleep(0.05)
        driver.send_signal(signal.SIGINT)
        out, err = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 130, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("sweep run: interrupted: ") and "of 40 tasks done" in last, err
    assert "unlocked; rerun to resume" in last and "Traceback" not in err
    assert "CancelledError" not in err
    done = int(last.split("interrupted: ")[1].split(" of ")[0])
    assert done == len(list((store / ".sweep" / "markers").rglob("*.done")))  # as a rerun sees
    with StoreLock(store):  # free again
        pass


def test_a_negative_tolerance_in_exponent_form_is_a_value_not_a_flag(tmp_path, capsys):
    np.save(tmp_path / "eye.npy", np.eye(3)[None])
    for words in (["--tol", "-1e-9"], ["--tol=-1e-9"]):
        assert main(["check", str(tmp_path / "eye.npy"), *words]) == 2
        line = one_stderr_line(capsys.readouterr().err)
        assert line.endswith("tolerance -1e-09 must be a finite number in [0, 1) (default "
                             "1e-12): kappa lies in [0, 1]")


def test_ctrl_c_during_plan_exits_130(tmp_path):
    path = write_text_sweep(tmp_path, lines=LINES * 40_000)  # sizing 200,000 lines takes a while
    driver = subprocess.Popen(
        [sys.executable, "-m", "sweep", "plan", str(path)], cwd=tmp_path,
        env={**env(), "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, preexec_fn=default_sigint)
    try:
        for line in driver.stdout:  # one line first, then the sizing
            if line.startswith("sweep plan: "):
                break
        driver.send_signal(signal.SIGINT)
        out, err = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 130, err[-2000:]
    assert one_stderr_line(err) == "sweep plan: interrupted: stopped by Ctrl-C"
    assert "total:" not in out


def test_edited_inputs_recompute_exactly_their_shards_and_match_a_fresh_run(
        tmp_path, reference, monkeypatch, capsys):
    path = write_text_sweep(tmp_path, lines=EDITED)
    config = load_config(path)
    real, calls = sweep.driver.runner.run_task, []

    def killed_after_four(task):
        calls.append(task.key)
        if len(calls) == 5:
            raise KeyboardInterrupt  # Ctrl-C in the middle of the sweep
        return real(task)

    monkeypatch.setattr(sweep.driver.runner, "run_task", killed_after_four)
    with pytest.raises(Interrupted, match="4 of 6 tasks done"):
        run_sweep(config, InProcessExecutor(), progress=False)
    monkeypatch.setattr(sweep.driver.runner, "run_task", real)
    write_text_sweep(tmp_path, lines=[LINES[0], *EDITED[1:]])  # line 1 (shard 0, done) edited
    summary = run_sweep(config, InProcessExecutor(), progress=False)
    assert sorted(summary.completed) == [
        "extract-rob-00000", "extract-rob-00002", "test-rob-00000", "test-rob-00002"]
    assert summary.skipped == ["extract-rob-00001", "test-rob-00001"]
    assert "shard 0: inputs changed since it ran" in capsys.readouterr().err
    write_text_sweep(tmp_path, lines=LINES)  # after a finished run: line 5 (shard 2) edited
    summary = run_sweep(config, InProcessExecutor(), progress=False)
    assert sorted(summary.completed) == ["extract-rob-00002", "test-rob-00002"]
    assert_same_arrays(store_arrays(reference / "sweep.zarr"), store_arrays(config.store))
    assert run_sweep(config, InProcessExecutor(), progress=False).completed == []


def chunk(store: Path, array: str, *coords: int) -> Path:
    return store / array / "c" / "/".join(str(c) for c in coords)


def compacted(store: Path, array: str) -> Path:
    """The one object of a finished model's result array (`storage.compaction`)."""
    return store / array / "c.0.0.0.0"


def test_damaged_chunks_are_found_reported_and_repaired(tmp_path, reference, capsys):
    folder = copy_of(reference, tmp_path)
    store = folder / "sweep.zarr"
    compacted(store, "rob/results/kappa").unlink()  # deleted: every shard's results
    attention = chunk(store, "rob/attention", 2, 0, 0, 0, 0)
    attention.write_bytes(attention.read_bytes()[:10])  # truncated
    n_tokens = chunk(store, "rob/n_tokens", 2)
    rng = np.random.default_rng(0)
    n_tokens.write_bytes(rng.bytes(n_tokens.stat().st_size))  # garbage, same size
    assert main(["status", str(store), "--verify"]) == 4
    out = capsys.readouterr().out
    assert "damaged rob compact: rob/results/kappa; rerun `sweep run`" in out
    assert "damaged rob extract-00001: rob/attention;" in out
    assert "damaged rob extract-00002: rob/n_tokens;" in out
    before = tree_digest(store)
    assert main(["report", str(store)]) == 4
    line = one_stderr_line(capsys.readouterr().err)
    assert "rob/attention" in line and "rob/results/kappa" in line and "rerun `sweep run`" in line
    assert tree_digest(store) == before
    assert main(["run", str(folder / "sweep.yaml"), "--in-process", "--no-progress"]) == 0
    assert "5 tasks completed, 1 already done" in capsys.readouterr().out
    assert_same_arrays(store_arrays(reference / "sweep.zarr"), store_arrays(store))
    margin = compacted(store, "rob/results/holds")
    margin.write_bytes(rng.bytes(margin.stat().st_size))  # garbage only: found when decoding
    assert main(["report", str(store)]) == 4
    line = one_stderr_line(capsys.readouterr().err)
    assert "damaged chunks in rob/results/holds" in line


def test_damage_that_keeps_size_and_mtime_needs_verify(tmp_path, reference, capsys):
    folder = copy_of(reference, tmp_path)
    store = folder / "sweep.zarr"
    attention = chunk(store, "rob/attention", 1, 0, 0, 0, 0)
    stat = attention.stat()
    data = bytearray(attention.read_bytes())
    data[len(data) // 2] ^= 0xFF
    attention.write_bytes(bytes(data))
    os.utime(attention, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # mtime set back on purpose
    config = ["run", str(folder / "sweep.yaml"), "--in-process", "--no-progress"]
    assert main(config) == 0
    assert "0 tasks completed, 6 already done" in capsys.readouterr().out  # a stat: unseen
    assert main([*config, "--verify"]) == 0
    captured = capsys.readouterr()
    assert "extract-rob-00000: 1 damaged chunk(s) (rob/attention/c/1/0/0/0/0" in captured.err
    assert "2 tasks completed, 4 already done" in captured.out
    assert_same_arrays(store_arrays(reference / "sweep.zarr"), store_arrays(store))


def test_refusals_write_nothing(tmp_path, reference, capsys):
    folder = copy_of(reference, tmp_path)
    path = folder / "sweep.yaml"
    (folder / "other.txt").write_text("\n".join(LINES) + "\n")
    path.write_text(path.read_text().replace(f"path: {reference}/lines.txt", "path: other.txt")
                    + "  rob2: {source: tiny-roberta, dataset: lines}\n")
    before = tree_digest(folder)
    assert main(["run", str(path), "--in-process"]) == 2
    line = one_stderr_line(capsys.readouterr().err)
    assert "models.rob.dataset.path" in line and "different config" in line
    assert tree_digest(folder) == before  # no rob2 group, no lock file touched

    data = tmp_path / "data"
    data.mkdir()
    (data / "notes.txt").write_text("mine\n")
    for store in (str(data), '""'):
        config = write_text_sweep(data)
        config.write_text(config.read_text().replace("store: sweep.zarr", f"store: {store}"))
        before = tree_digest(data)
        assert main(["run", str(config), "--in-process"]) == 2
        line = one_stderr_line(capsys.readouterr().err)
        assert "a folder that is not a sweep store" in line
        assert tree_digest(data) == before and not (data / ".sweep").exists()

    foreign = tmp_path / "foreign.zarr"
    zarr.open_group(str(foreign), mode="w").create_array("x", shape=(2,), dtype="i4")
    config = write_text_sweep(tmp_path / "f")
    config.write_text(config.read_text().replace("store: sweep.zarr", f"store: {foreign}"))
    before = tree_digest(foreign)
    assert main(["run", str(config), "--in-process"]) == 2
    assert "a Zarr store that is not a sweep store" in one_stderr_line(capsys.readouterr().err)
    assert tree_digest(foreign) == before


def test_changed_ft_options_are_refused_before_any_training(tmp_path, capsys, monkeypatch):
    import workers.models.trained.ft.training as ft

    def ft_sweep(options: str) -> Path:
        path = tmp_path / "sweep.yaml"
        path.write_text("store: s.zarr\nshard_size: 2\ndatasets:\n"
                        "  wine: {source: 'sklearn:wine', limit: 2}\n"
                        f"models:\n  ft: {{source: ft-transformer, dataset: wine, "
                        f"options: {options}}}\n")
        return path

    first = load_config(ft_sweep("{max_epochs: 3, n_blocks: 2}"))
    root = create_root(first.store)  # a store finished by the first config (sizes made up)
    ensure_model(root, "ft", input_ids=["0", "1"], n_layers=2, t_max=14, shard_size=2,
                 token_sets=first.token_sets, attrs={},
                 fingerprint_inputs=model_config_inputs(first, "ft"))
    write_root_attrs(root, first.resolved())

    def no_training(*args, **kwargs):
        raise AssertionError("trained before the config was accepted")

    monkeypatch.setattr(ft, "train", no_training)
    path = ft_sweep("{max_epochs: 4, n_blocks: 2}")
    before = tree_digest(tmp_path)
    assert main(["run", str(path), "--in-process"]) == 2
    line = one_stderr_line(capsys.readouterr().err)
    assert "models.ft.model.config.max_epochs: 3 -> 4" in line
    assert tree_digest(tmp_path) == before


def test_a_ctrl_c_swallowed_where_it_was_raised_still_stops_the_run(monkeypatch):
    """numba's compiler calls back through ctypes, which swallows the KeyboardInterrupt of a
    Ctrl-C landing there: the handler remembers the signal and the executors stop between
    tasks."""
    import threading

    from sweep.terminal import interrupts

    monkeypatch.setattr(interrupts, "_received", threading.Event())
    interrupts.raise_if_interrupted()  # nothing arrived: no-op
    try:
        interrupts._on_sigint(signal.SIGINT, None)
    except KeyboardInterrupt:
        pass  # swallowed, as a ctypes callback does
    with pytest.raises(KeyboardInterrupt):
        interrupts.raise_if_interrupted()


@pytest.mark.parametrize("setting, change", [
    ("batch_size: 2\n", 'models.rob.batch_size: 8 -> 2'),
    ("device: cpu\n", 'models.rob.device: "auto" -> "cpu"'),
    ("dtype: bfloat16\n", 'models.rob.dtype: "float32" -> "bfloat16"'),
], ids=["batch_size", "device", "dtype"])
def test_a_resume_with_another_batch_size_device_or_dtype_is_refused_by_name(
        tmp_path, reference, capsys, setting, change):
    """Each changes a model's attention in its last float bits (issue 22, item 2)."""
    folder = copy_of(reference, tmp_path)
    path = folder / "sweep.yaml"
    path.write_text(path.read_text().replace("retries: 0\n", "retries: 0\n" + setting))
    before = tree_digest(folder)
    assert main(["run", str(path), "--in-process", "--no-progress"]) == 2
    line = one_stderr_line(capsys.readouterr().err)
    assert change in line and "different config" in line
    assert tree_digest(folder) == before


def test_shards_extracted_on_another_device_kind_are_refused_and_a_new_group_repins(
        tmp_path, reference, capsys):
    """`device: auto` is in the fingerprint as written, so the kind it resolved to is pinned by
    a model's first shard: a resume whose workers resolve it to another kind (here: the store
    says its shards came from a GPU, this machine has none) is refused in one line, exit 3,
    before anything is rewritten; a group created anew pins again."""
    folder = copy_of(reference, tmp_path)
    store = folder / "sweep.zarr"
    pin = store / ".sweep" / "device" / "rob"
    assert pin.read_text() == "cpu\n"  # pinned by the reference run
    pin.write_text("cuda\n")  # as if its shards had been extracted on a GPU
    (store / ".sweep" / "markers" / "rob" / "extract-00001.done").unlink()  # to redo
    kept = {name: (store / "rob" / name).read_bytes() for name in ("zarr.json",)}
    assert main(["run", str(folder / "sweep.yaml"), "--in-process", "--no-progress"]) == 3
    line = one_stderr_line(capsys.readouterr().err)
    assert "model 'rob': its stored shards were extracted on cuda, but device: auto resolves " \
           "to cpu" in line, line
    assert {name: (store / "rob" / name).read_bytes() for name in kept} == kept
    assert pin.read_text() == "cuda\n"
    shutil.rmtree(store / "rob")  # deleting the group re-plans it: its old pin goes with it
    assert main(["run", str(folder / "sweep.yaml"), "--in-process", "--no-progress"]) == 0
    assert pin.read_text() == "cpu\n"
    assert_same_arrays(store_arrays(reference / "sweep.zarr"), store_arrays(store))


def test_plain_status_finds_damage_and_a_deleted_group_in_one_line_each(
        tmp_path, reference, capsys):
    """What `sweep run` would find at start-up, `sweep status` finds without --verify: a deleted,
    a truncated or a resized chunk, and a model group deleted whole (issue 22, items 6 and 7)."""
    folder = copy_of(reference, tmp_path)
    store = folder / "sweep.zarr"
    compacted(store, "rob/results/kappa").unlink()  # deleted
    attention = chunk(store, "rob/attention", 2, 0, 0, 0, 0)
    attention.write_bytes(attention.read_bytes()[:10])  # truncated
    before = tree_digest(store)
    assert main(["status", str(store)]) == 4
    captured = capsys.readouterr()
    damaged = [line for line in captured.out.splitlines() if line.startswith("damaged")]
    assert damaged == [
        "damaged rob extract-00001: rob/attention; rerun `sweep run` to recompute",
        "damaged rob compact: rob/results/kappa; rerun `sweep run` to recompute"]
    assert captured.err == "" and tree_digest(store) == before  # status writes nothing
    shutil.rmtree(store / "rob")  # the whole model group
    assert main(["status", str(store)]) == 4
    captured = capsys.readouterr()
    assert "missing rob: its group is gone from the store; rerun `sweep run`" in captured.out
    assert captured.err == ""  # no KeyError traceback
    assert main(["status", str(store), "--format", "json"]) == 4
    assert '"missing": true' in capsys.readouterr().out


def test_a_text_edited_past_the_stores_token_length_is_refused_in_one_line(
        tmp_path, capsys, monkeypatch):
    """A line edited to need more tokens than its model's group holds (t_max) is refused before
    the lock, exit 2, naming the model, the input, its tokens and t_max and saying what to do;
    its extraction task says the same where the driver did not look; deleting the model's group
    sizes it again (issue 22, item 9)."""
    path = write_text_sweep(tmp_path)
    store = tmp_path / "sweep.zarr"
    assert run_sweep(load_config(path), InProcessExecutor(), progress=False).exit_code == 0
    t_max = zarr.open_group(str(store / "rob"), mode="r").attrs["t_max"]
    longer = " and then it went on and on about nothing in particular" * 2
    write_text_sweep(tmp_path, lines=[LINES[0] + longer, LINES[1], LINES[2] + longer, *LINES[3:]])
    before = tree_digest(store)
    assert main(["run", str(path), "--no-progress"]) == 2
    line = one_stderr_line(capsys.readouterr().err)
    head = "sweep run: error: model 'rob' input 'line-1' (and 1 more input): "
    assert line.startswith(head), line
    tokens = int(line[len(head):].split(" tokens")[0])
    assert tokens > t_max
    fix = (f"more than the {t_max} (t_max) its group in store {store} was sized for when it was "
           f"first planned; restore the input, or sweep into a new store, or delete the group "
           f"'rob' from the store and rerun to size it again")
    assert line.endswith(f"{tokens} tokens, {fix}")
    assert tree_digest(store) == before  # refused before the lock: nothing written

    monkeypatch.setattr(sweep.driver.preflight, "check_tokens_fit", lambda config: None)
    assert main(["run", str(path), "--in-process", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == f"sweep run: error: model 'rob' input 'line-1': " \
                                            f"{tokens} tokens, {fix}"
    monkeypatch.undo()

    shutil.rmtree(store / "rob")
    assert main(["run", str(path), "--in-process", "--no-progress"]) == 0
    group = zarr.open_group(str(store / "rob"), mode="r")
    n_tokens = group["n_tokens"][:]
    assert int(n_tokens[0]) == tokens and group.attrs["t_max"] == n_tokens.max() > t_max


def test_changed_matched_nulls_are_refused_before_a_new_model_group_is_created(tmp_path, capsys):
    """The size-matched nulls' groups are checked with every other group before any is created:
    a refused run writes nothing, not even the group of a model it added."""
    nulls = "matched_nulls: {{nulls: [uniform], trials: {trials}, seed: 0, chunk_trials: 1000}}\n"
    path = write_text_sweep(tmp_path)
    first = path.read_text().replace("matched_nulls: null\n", nulls.format(trials=1000))
    path.write_text(first)
    assert main(["run", str(path), "--in-process", "--no-progress"]) == 0
    capsys.readouterr()
    path.write_text(first.replace("trials: 1000,", "trials: 2000,")
                    + "  new: {source: tiny-roberta, dataset: lines}\n")
    before = tree_digest(tmp_path / "sweep.zarr")
    assert main(["run", str(path), "--in-process", "--no-progress"]) == 2
    line = one_stderr_line(capsys.readouterr().err)
    assert "the size-matched nulls of model 'rob': matched_nulls.trials: 1000 -> 2000" in line
    assert tree_digest(tmp_path / "sweep.zarr") == before
    assert not (tmp_path / "sweep.zarr" / "new").exists()


def test_local_weights_overwritten_in_place_are_refused_by_file(tmp_path, capsys):
    """An `hf:` folder is named by its place: weights rewritten there would be a new model under
    the old spec. A resume re-hashes a touched file (same bytes: goes on) and refuses changed
    bytes in one line, exit 2, before anything is written."""
    import torch

    from workers.models.extraction import load_extractor
    from workers.models.registry import resolve_model

    tiny = load_extractor(resolve_model("tiny-distilbert"), device="cpu")
    weights = tmp_path / "weights"
    tiny.model.save_pretrained(weights, safe_serialization=True)
    tiny.tokenizer.save_pretrained(weights)
    path = write_text_sweep(tmp_path)
    path.write_text(path.read_text().replace("source: tiny-roberta", f"source: 'hf:{weights}'"))
    assert main(["run", str(path), "--in-process", "--no-progress"]) == 0
    store = tmp_path / "sweep.zarr"
    recorded = zarr.open_group(str(store), mode="r")["rob"].attrs["weights_files"]
    assert {"model.safetensors", "config.json"} <= set(recorded)
    os.utime(weights / "model.safetensors")  # touched: same bytes, re-hashed, accepted
    assert main(["run", str(path), "--in-process", "--no-progress"]) == 0
    with torch.no_grad():
        next(tiny.model.parameters()).add_(1e-3)
    tiny.model.save_pretrained(weights, safe_serialization=True)
    capsys.readouterr()
    before = tree_digest(store)
    assert main(["run", str(path), "--in-process", "--no-progress"]) == 2
    line = one_stderr_line(capsys.readouterr().err)
    assert "model 'rob' was extracted with other weights: model.safetensors changed" in line
    assert tree_digest(store) == before


def test_ctrl_c_during_the_start_up_check_counts_what_is_done(tmp_path, reference, monkeypatch):
    """A Ctrl-C while the start-up check runs (a --verify re-hash reads the whole store) ends
    with the same one-line count as one during the tasks: none ran in this run."""
    folder = copy_of(reference, tmp_path)

    def stopped(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(sweep.driver.runner, "pending_tasks", stopped)
    with pytest.raises(Interrupted, match=r"^6 of 6 tasks done \(0 in this run\), 0 pending"):
        run_sweep(load_config(folder / "sweep.yaml"), InProcessExecutor(), progress=False,
                  verify=True)

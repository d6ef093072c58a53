"""Sweeps on a real S3-compatible object store (SeaweedFS, started by `.ci/s3-up.sh`): the store,
its markers, checkpoints and lease all live in the bucket. Results equal the same sweep on a
local path; a killed driver's lease is taken over; a second run is refused naming the holder;
damaged and deleted objects are found and recomputed; reports and xarray read the store; bad
URLs, buckets, endpoints and credentials are one line each, with nothing written."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from storage.lease import LEASES, Lease, StoreBusyError
from storage.location import StoreRef, locate
from sweep.config.load import load_config
from sweep.driver.runner import InProcessExecutor, run_sweep
from tests.s3_fixtures import CREDENTIALS, ENDPOINT, filesystem
from tests.store_fixtures import stored_arrays

pytestmark = pytest.mark.s3
REPO = Path(__file__).parents[1]

CONFIG = """\
store: {store}
storage_options: {options}
shard_size: 2
datasets:
  photos: {{source: 'sklearn:sample_images', limit: 6}}
  wine: {{source: 'sklearn:wine', limit: 6}}
  topics: {{source: 'pydoc:topics', limit: 4}}
models:
  vit: {{source: tiny-deit-distilled, dataset: photos}}
  ft: {{source: ft-transformer, dataset: wine, options: {{max_epochs: 2, n_blocks: 2}}}}
  rob: {{source: tiny-roberta, dataset: topics, batch_size: 2, control: random-init}}
baseline: {{sizes: [2, 5], trials: 2000, seed: 3, chunk_trials: 1000, nulls: [uniform]}}
matched_nulls: {{trials: 1000, chunk_trials: 1000, nulls: [uniform, softmax-b1]}}
"""


def write_config(folder: Path, store: str, options: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "sweep.yaml"
    path.write_text(CONFIG.format(store=store, options=options or {}))
    return path


def assert_same_arrays(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key, strict=True)


def s3_options(**extra) -> dict:
    return {"endpoint_url": ENDPOINT, **extra}


@pytest.fixture(scope="module")
def local_reference(tmp_path_factory):
    """The config swept into a local folder, in-process: what every s3 sweep must equal."""
    folder = tmp_path_factory.mktemp("local")
    config = load_config(write_config(folder, "sweep.zarr"))
    assert run_sweep(config, InProcessExecutor(), progress=False).exit_code == 0
    return stored_arrays(config.store)


def cli(*args: str, cwd: Path, extra_env: dict | None = None, **kwargs):
    env = {**os.environ, **CREDENTIALS, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1",
           **(extra_env or {})}
    return subprocess.run([sys.executable, "-m", "sweep", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, **kwargs)


@pytest.mark.parametrize("backend", ["obstore", "fsspec"])
def test_a_sweep_on_s3_equals_the_same_sweep_on_a_local_path(s3_bucket, tmp_path, backend,
                                                             local_reference):
    store = f"s3://{s3_bucket}/study/{backend}.zarr"
    config = load_config(write_config(tmp_path, store, s3_options(backend=backend)))
    summary = run_sweep(config, InProcessExecutor(), progress=False)
    assert summary.exit_code == 0, summary.lines()
    assert_same_arrays(local_reference, stored_arrays(config.store_ref))
    keys = locate(config.store_ref).listing()
    assert any(key.startswith(".sweep/cache/ft-transformer-") for key in keys)  # checkpoints
    assert any(key.startswith(".sweep/markers/vit/test-") for key in keys)
    assert not Path(tmp_path, "sweep.zarr").exists() and not Path(tmp_path, "s3:").exists()


def test_a_dask_sweep_on_s3_then_status_report_and_xarray_read_it(s3_bucket, tmp_path,
                                                                  local_reference):
    store = f"s3://{s3_bucket}/dask.zarr"
    config = write_config(tmp_path, store, s3_options())
    run = cli("run", str(config), "--no-progress", cwd=tmp_path, timeout=900)
    assert run.returncode == 0, run.stderr
    assert_same_arrays(local_reference, stored_arrays(StoreRef.of(store, s3_options())))

    status = cli("status", store, "--storage-option", f"endpoint_url={ENDPOINT}", cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    report = cli("report", store, "--format", "json", cwd=tmp_path,
                 extra_env={"AWS_ENDPOINT_URL": ENDPOINT})
    assert report.returncode == 0 and '"summary"' in report.stdout, report.stderr

    from storage.query import open_results

    tree = open_results(store, s3_options())
    assert tree["vit"]["holds"].shape[0] == 6
    fs_options = {"key": CREDENTIALS["AWS_ACCESS_KEY_ID"],
                  "secret": CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                  "client_kwargs": {"endpoint_url": ENDPOINT}}
    with warnings.catch_warnings():  # a finished run consolidated the metadata: no listing
        warnings.simplefilter("error")
        plain = xr.open_datatree(store, engine="zarr", storage_options=fs_options)
    np.testing.assert_array_equal(plain["vit/results/holds"].values,
                                  tree["vit"]["holds"].values)


def lease_holder(store: StoreRef) -> str | None:
    keys = [k for k in locate(store).listing(LEASES)]
    return keys[-1] if keys else None


def test_kill_9_of_the_driver_then_rerun_takes_over_the_lease_and_equals_an_uninterrupted_run(
        s3_bucket, tmp_path, local_reference):
    store = f"s3://{s3_bucket}/killed.zarr"
    ref = StoreRef.of(store, s3_options())
    config = write_config(tmp_path, store, s3_options())
    env = {**os.environ, **CREDENTIALS, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1",
           "DOBRUSHIN_LEASE_SECONDS": "4"}
    driver = subprocess.Popen([sys.executable, "-m", "sweep", "run", str(config), "--in-process",
                               "--no-progress"], cwd=tmp_path, env=env, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        location = locate(ref)
        deadline = time.monotonic() + 600
        while not any(k.startswith(".sweep/markers/vit/extract-") for k in location.listing(
                ".sweep/markers/")):  # the run is under way: it holds the lease, wrote a marker
            assert driver.poll() is None, driver.stderr.read().decode()
            assert time.monotonic() < deadline
            time.sleep(0.2)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    assert lease_holder(ref) is not None  # the killed driver's lease is still there
    again = cli("run", str(config), "--in-process", "--no-progress", cwd=tmp_path,
                extra_env={"DOBRUSHIN_LEASE_SECONDS": "4"}, timeout=900)
    # the lease had not expired yet and its holder could not be seen gone: refused, naming the
    # holder; then taken over once expired
    if again.returncode == 2:
        assert "in use by another sweep run" in again.stderr and "pid" in again.stderr
        time.sleep(4.5)
        again = cli("run", str(config), "--in-process", "--no-progress", cwd=tmp_path,
                    extra_env={"DOBRUSHIN_LEASE_SECONDS": "4"}, timeout=900)
    assert again.returncode == 0, again.stderr
    # taken over as expired, or at once, before it expired, as the lease of a process that has
    # exited on this host: which one depends on how soon the rerun reads it, so either passes
    assert "taking over the expired lease" in again.stderr or (
        "taking over the lease of" in again.stderr and "has exited (on this host" in again.stderr)
    assert_same_arrays(local_reference, stored_arrays(ref))


def test_a_second_run_on_a_leased_store_is_refused_naming_the_holder(s3_bucket, tmp_path):
    store = f"s3://{s3_bucket}/busy.zarr"
    ref = StoreRef.of(store, s3_options())
    holder = Lease(locate(ref), ttl=60)
    holder.acquire()
    try:
        config = write_config(tmp_path, store, s3_options())
        second = cli("run", str(config), "--no-progress", cwd=tmp_path)
        assert second.returncode == 2
        line = second.stderr.strip()
        assert "\n" not in line and "in use by another sweep run" in line
        assert f"pid {os.getpid()}" in line
        broken = cli("run", str(config), "--no-progress", "--break-lock", cwd=tmp_path)
        assert broken.returncode == 2 and "fresh" in broken.stderr and "--force" in broken.stderr
        assert not locate(ref).any_key("zarr.json")  # refusals wrote nothing
    finally:
        holder.release()


def test_break_lock_takes_over_a_lease_that_stopped_being_renewed(s3_bucket):
    ref = StoreRef.of(f"s3://{s3_bucket}/stale.zarr", s3_options())
    first = Lease(locate(ref), ttl=8)
    first.acquire()
    first._stop.set()  # the holder stops renewing (a hung or partitioned driver)
    first._thread.join()
    with pytest.raises(StoreBusyError, match="in use"):
        Lease(locate(ref), ttl=8).acquire()
    time.sleep(4.2)  # two renewal intervals (8 / 4 s each) missed, not yet expired
    second = Lease(locate(ref), ttl=8)
    second.acquire(break_lock=True)
    assert not first.renew() and first.lost is not None  # the old holder finds out
    second.release()
    third = Lease(locate(ref), ttl=8)
    third.acquire()  # a released lease is taken at once
    third.release()


def test_racing_runs_take_one_generation_each(s3_bucket):
    ref = StoreRef.of(f"s3://{s3_bucket}/race.zarr", s3_options())
    location = locate(ref)
    assert location.create(f"{LEASES}0000000001.json", b"{}") is not None
    assert location.create(f"{LEASES}0000000001.json", b"{}") is None  # If-None-Match: *


def damage(store: StoreRef, key: str, *, delete: bool) -> None:
    location = locate(store)
    if delete:
        location.delete(key)
    else:
        data = bytearray(location.read(key))
        data[len(data) // 2] ^= 0xFF
        location.write(key, bytes(data))


def test_an_overwritten_and_a_deleted_object_are_found_and_recomputed(s3_bucket, tmp_path,
                                                                      local_reference):
    store = f"s3://{s3_bucket}/damaged.zarr"
    ref = StoreRef.of(store, s3_options())
    config = load_config(write_config(tmp_path, store, s3_options()))
    assert run_sweep(config, InProcessExecutor(), progress=False).exit_code == 0
    keys = locate(ref).listing()
    attention = sorted(k for k in keys if k.startswith("vit/attention/c/"))
    kappa = sorted(k for k in keys if k.startswith("rob/results/kappa/c."))  # compacted
    damage(ref, attention[1], delete=False)  # same size, new bytes
    damage(ref, kappa[0], delete=True)
    status = cli("status", store, "--storage-option", f"endpoint_url={ENDPOINT}", cwd=tmp_path)
    assert status.returncode == 4 and "damaged" in status.stdout  # the listing finds both
    assert "vit/attention" in status.stdout and "rob/results/kappa" in status.stdout
    summary = run_sweep(config, InProcessExecutor(), progress=False)
    assert summary.exit_code == 0 and summary.completed
    assert_same_arrays(local_reference, stored_arrays(ref))


def test_memory_stores_run_in_process(tmp_path, local_reference):
    from storage.location import forget_memory_stores

    config = load_config(write_config(tmp_path, "memory://sweep-test/study.zarr"))
    try:
        assert run_sweep(config, InProcessExecutor(), progress=False).exit_code == 0
        assert_same_arrays(local_reference, stored_arrays(config.store_ref))
    finally:
        forget_memory_stores()


@pytest.mark.parametrize("store, options, code, words", [
    ("s3://no-such-bucket-here/x.zarr", s3_options(), 2, "bucket 'no-such-bucket-here' does "
     "not exist"),
    ("s3://{bucket}/x.zarr", {"endpoint_url": "http://127.0.0.1:9"}, 3, "does not answer"),
    ("ftp://host/x.zarr", {}, 2, "unknown URL scheme 'ftp'"),
    ("s3://{bucket}/x.zarr", s3_options(secret_access_key="x"), 2, "credentials never go in a "
     "config"),
])
def test_store_errors_are_one_line_with_their_exit_code_and_write_nothing(
        s3_bucket, tmp_path, store, options, code, words):
    config = write_config(tmp_path, store.format(bucket=s3_bucket), options)
    result = cli("run", str(config), "--no-progress", cwd=tmp_path, timeout=300)
    assert result.returncode == code, result.stderr
    line = result.stderr.strip()
    assert "\n" not in line and words in line, line
    assert "sweep-test-secret" not in line
    assert not filesystem().find(s3_bucket)  # nothing written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.yaml"]


def test_wrong_credentials_are_one_line_exit_3(s3_bucket, tmp_path):
    config = write_config(tmp_path, f"s3://{s3_bucket}/x.zarr", s3_options())
    result = cli("run", str(config), "--no-progress", cwd=tmp_path,
                 extra_env={"AWS_SECRET_ACCESS_KEY": "not-the-secret"})
    assert result.returncode == 3, result.stderr
    line = result.stderr.strip()
    assert "\n" not in line and "access denied" in line and "not-the-secret" not in line
    assert not filesystem().find(s3_bucket)


@pytest.mark.parametrize("command", ["status", "show", "report"])
@pytest.mark.parametrize("endpoint, secret, words", [
    ("http://127.0.0.1:9", None, "does not answer"),
    (ENDPOINT, "not-the-secret", "access denied"),
], ids=["no-endpoint", "wrong-secret"])
def test_reading_commands_meet_a_bad_endpoint_or_credentials_in_one_line_exit_3(
        s3_bucket, tmp_path, command, endpoint, secret, words):
    args = {"status": [], "show": ["rob", "line-0"], "report": []}[command]
    result = cli(command, f"s3://{s3_bucket}/x.zarr", *args, "--storage-option",
                 f"endpoint_url={endpoint}", cwd=tmp_path, timeout=300,
                 extra_env={"AWS_SECRET_ACCESS_KEY": secret} if secret else None)
    assert result.returncode == 3, result.stderr
    line = result.stderr.strip()
    assert "\n" not in line and words in line and "not-the-secret" not in line, line


def test_a_storage_option_that_is_not_a_scalar_is_one_line_exit_2(tmp_path):
    result = cli("status", "s3://bucket/x.zarr", "--storage-option", "region=[a]",
                 cwd=tmp_path, timeout=120)
    assert result.returncode == 2, result.stderr
    line = result.stderr.strip()
    assert "\n" not in line and "a storage option is a string, a number or true/false" in line


def test_a_missing_optional_package_is_one_line_exit_3(tmp_path):
    config = write_config(tmp_path, "s3://bucket/x.zarr", s3_options())
    blocker = tmp_path / "blocker"
    blocker.mkdir()
    (blocker / "obstore.py").write_text("raise ImportError('obstore is not installed')\n")
    result = cli("run", str(config), "--no-progress", cwd=tmp_path,
                 extra_env={"PYTHONPATH": f"{blocker}{os.pathsep}{REPO}"})
    assert result.returncode == 3, result.stderr
    line = result.stderr.strip()
    assert "\n" not in line and "pip install 'dobrushin-sweep[s3]'" in line

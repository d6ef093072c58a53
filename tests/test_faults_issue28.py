"""Issue 28, items 1-6, through the real CLI: a secret in a URL's userinfo, a config that would
exhaust memory, names that break a store, a lost cause (an `hf:` image folder without
preprocessor_config.json), a dead holder's lease on this host, an image truncated past its
header. Each is one stderr line and exit 2 with every folder and bucket as it was, except the
lease, which is taken over at once. The object-store cases run against the real SeaweedFS
(marked `s3`)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from storage.errors import InputError
from storage.lease import LEASES, LeaseRecord
from storage.location import StoreRef, locate
from sweep.cli.entry import main
from sweep.terminal.faults import classify
from tests.fault_helpers import one_stderr_line, tree_digest, write_text_sweep
from tests.s3_fixtures import CREDENTIALS, ENDPOINT, filesystem
from tests.test_faults_tasks import image_sweep

REPO = Path(__file__).parents[1]
SECRET = CREDENTIALS["AWS_SECRET_ACCESS_KEY"]
KEY = CREDENTIALS["AWS_ACCESS_KEY_ID"]
WITH_SECRET = f"http://{KEY}:{SECRET}@127.0.0.1:{ENDPOINT.rsplit(':', 1)[1]}"
MAX_CONFIG_BYTES, MAX_ITEMS = 1 << 20, 100_000  # sweep.config.yaml_io's bounds, as docs/faults.md
# says


def cli(*args: str, cwd: Path, extra_env: dict | None = None, timeout: int = 300):
    """`python -m sweep ARGS` with the test credentials in the environment (as a user sets
    them)."""
    env = {**os.environ, **CREDENTIALS, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1",
           **(extra_env or {})}
    env.pop("DOBRUSHIN_LEASE_SECONDS", None)
    return subprocess.run([sys.executable, "-m", "sweep", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def empty_sweep(folder: Path, store: str, options: dict | None = None) -> Path:
    """A sweep of no models (it creates its store and runs no task: seconds)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "sweep.yaml"
    path.write_text(f"store: {store}\nstorage_options: {json.dumps(options or {})}\n"
                    f"matched_nulls: null\n")
    return path


def refused(capsys, argv: list[str], *words: str) -> str:
    """`sweep ARGV` in this process: exit 2 and one stderr line holding every word."""
    capsys.readouterr()
    assert main(argv) == 2
    line = one_stderr_line(capsys.readouterr().err)
    assert line.startswith(f"sweep {argv[0]}: error: "), line
    for word in words:
        assert word in line, line
    return line


# --- 1. a secret in a URL's userinfo ---------------------------------------------------------

@pytest.mark.s3
@pytest.mark.parametrize("case", ["endpoint_url", "store-url", "env-endpoint",
                                  "cli-storage-option", "cli-store"])
def test_a_url_carrying_credentials_is_refused_in_one_line_and_nothing_is_written(
        s3_bucket, tmp_path, case):
    store = f"s3://{s3_bucket}/secret.zarr"
    options, extra_env = {"endpoint_url": ENDPOINT}, None
    if case == "endpoint_url":
        options = {"endpoint_url": WITH_SECRET}
    elif case == "store-url":
        store = f"s3://{KEY}:{SECRET}@{s3_bucket}/secret.zarr"
    elif case == "env-endpoint":
        options, extra_env = {}, {"AWS_ENDPOINT_URL": WITH_SECRET}
    config = empty_sweep(tmp_path, store, options)
    if case == "cli-storage-option":
        result = cli("status", store, "--storage-option", f"endpoint_url={WITH_SECRET}",
                     cwd=tmp_path)
    elif case == "cli-store":
        result = cli("status", f"s3://{KEY}:{SECRET}@{s3_bucket}/secret.zarr",
                     "--storage-option", f"endpoint_url={ENDPOINT}", cwd=tmp_path)
    else:
        result = cli("run", str(config), "--in-process", "--no-progress", cwd=tmp_path,
                     extra_env=extra_env)
    assert result.returncode == 2, result.stderr + result.stdout
    line = result.stderr.strip()
    assert "\n" not in line and "carries credentials (user:password@)" in line, line
    assert "***@" in line and "AWS_ACCESS_KEY_ID" in line and SECRET not in line, line
    assert not filesystem().find(s3_bucket)  # nothing written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.yaml"]


def test_a_url_userinfo_is_hidden_wherever_a_text_is_recorded(tmp_path):
    """The redaction behind every message, the root attributes and failed markers: a URL's
    userinfo never survives, whatever reached a text."""
    from storage.location import redact_url

    text = f"could not reach {WITH_SECRET}/bucket (and 'https://u:p@ss@host/x')"
    assert SECRET not in redact_url(text) and "p@ss" not in redact_url(text)
    assert redact_url("user@host pid 4, s3://bucket/a@b") == "user@host pid 4, s3://bucket/a@b"
    code, _, line = classify(OSError(f"cannot load {WITH_SECRET}/x"))
    assert SECRET not in line and "***@127.0.0.1" in line

    import zarr

    from storage import markers
    from storage.store import write_root_attrs

    root = zarr.open_group(str(tmp_path / "s.zarr"), mode="w", zarr_format=3)
    write_root_attrs(root, {"store": "s.zarr", "note": [{"url": WITH_SECRET}]})
    markers.mark_failed(tmp_path / "s.zarr", "m", "extract-00000", f"OSError: {WITH_SECRET}")
    for path in (tmp_path / "s.zarr").rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path


# --- 2. a config that would exhaust memory ---------------------------------------------------

def big_configs(folder: Path) -> dict[str, tuple[Path, str]]:
    """Configs past each bound, with the words of their refusal."""
    folder.mkdir(parents=True, exist_ok=True)
    head = "store: s.zarr\nmatched_nulls: null\n"
    texts = {
        "size": (head + ("# " + "x" * 77 + "\n") * (MAX_CONFIG_BYTES // 80 + 1),
                 "larger than a config may be (1 MiB"),
        "one-list": (head + "token_sets: [" + ", ".join(["all"] * (MAX_ITEMS + 1)) + "]\n",
                     f"token_sets: {MAX_ITEMS + 1:,} items, more than a whole config may hold"),
        "aliases": (head + "z:\n- &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n"  # 10 ** 5 in 6 lines
                    + "".join(f"- &{b} [{', '.join([f'*{a}'] * 10)}]\n"
                              for a, b in zip("abc", "bcd", strict=True))
                    + "datasets:\n  d: {path: x.txt}\nmodels:\n  m: {source: tiny-roberta, "
                    "dataset: d, options: {x: [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]}}\n",
                    "(YAML aliases counted at each use)"),
        "depth": (head + "datasets: " + "[" * 40 + "]" * 40 + "\n", "nested more than 32"),
    }
    out = {}
    for name, (text, words) in texts.items():
        path = folder / f"{name}.yaml"
        path.write_text(text)
        out[name] = (path, words)
    return out


@pytest.mark.parametrize("case", ["size", "one-list", "aliases", "depth"])
def test_a_config_past_its_bounds_is_one_line_exit_2_before_anything(tmp_path, capsys, case):
    path, words = big_configs(tmp_path / "configs")[case]
    before = tree_digest(tmp_path)
    line = refused(capsys, ["plan", str(path)], f"{path.name}", words)
    assert "; a config " in line  # what a config holds, so the fix is plain
    refused(capsys, ["run", str(path), "--in-process", "--no-progress"], words)
    assert tree_digest(tmp_path) == before


def test_a_cluster_file_past_the_size_bound_is_refused(tmp_path, capsys):
    config = write_text_sweep(tmp_path)
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("kind: local\n" + "#" * MAX_CONFIG_BYTES + "\n")
    refused(capsys, ["plan", str(config), "--cluster", str(cluster)],
            f"{cluster}: 1.0 MiB, larger than a config may be")


# --- 3. names that break a store -------------------------------------------------------------

NAMES = {
    "zarr.json": ("models", "zarr.json", "the store uses the name 'zarr.json' itself"),
    "ZARR.JSON": ("models", "ZARR.JSON", "the store uses the name 'zarr.json' itself"),
    "300 characters": ("models", "m" * 300, "300 characters, at most 100"),
    "trailing dot": ("models", "rob.", "it ends with '.'"),
    "dataset zarr.json": ("datasets", "zarr.json", "the store uses the name 'zarr.json'"),
}


@pytest.mark.parametrize("case", list(NAMES))
def test_names_no_backend_takes_are_refused_at_load_in_one_line(tmp_path, capsys, case):
    section, name, words = NAMES[case]
    path = write_text_sweep(tmp_path)
    text = path.read_text()
    text = text.replace("  rob:", f"  '{name}':") if section == "models" else \
        text.replace("lines:", f"'{name}':").replace("dataset: lines", f"dataset: '{name}'")
    path.write_text(text)
    before = tree_digest(tmp_path)
    line = refused(capsys, ["run", str(path), "--in-process", "--no-progress"],
                   f"{section}.{name[:40]}", "invalid name", words, "rename it")
    assert len(line) < 500
    assert tree_digest(tmp_path) == before


def test_model_names_that_differ_only_in_case_are_refused(tmp_path, capsys):
    path = write_text_sweep(tmp_path)
    path.write_text(path.read_text() + "  Rob: {source: tiny-roberta, dataset: lines}\n")
    before = tree_digest(tmp_path)
    refused(capsys, ["run", str(path), "--in-process", "--no-progress"],
            "models.Rob: differs from models.rob only in case")
    assert tree_digest(tmp_path) == before


@pytest.mark.s3
def test_a_model_named_zarr_json_is_refused_before_anything_on_s3(s3_bucket, tmp_path):
    path = write_text_sweep(tmp_path)
    path.write_text(path.read_text().replace("store: sweep.zarr", f"store: s3://{s3_bucket}/n.zarr"
                                             f"\nstorage_options: {{endpoint_url: '{ENDPOINT}'}}")
                    .replace("  rob:", "  zarr.json:"))
    result = cli("run", str(path), "--in-process", "--no-progress", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "models.zarr.json: invalid name" in one_stderr_line(result.stderr)
    assert not filesystem().find(s3_bucket)


# --- 4. a lost cause: an hf: image folder without preprocessor_config.json -------------------

def saved_model(folder: Path, kind: str) -> Path:
    """A tiny randomly initialised transformers model saved as safetensors, alone (no image
    processor, no tokenizer)."""
    if kind == "image":
        from transformers import Dinov2Config as Config
        from transformers import Dinov2Model as Model

        config = Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                        intermediate_size=64, image_size=28, patch_size=14)
    else:
        from transformers import BertConfig as Config
        from transformers import BertModel as Model

        config = Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                        intermediate_size=64, vocab_size=100)
    Model(config).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("kind, missing", [("image", "holds no preprocessor_config.json"),
                                           ("text", "holds no tokenizer files")])
def test_an_hf_folder_without_its_preprocessing_files_names_them_exit_2(tmp_path, capsys,
                                                                         kind, missing):
    model = saved_model(tmp_path / "model", kind)
    path = image_sweep(tmp_path) if kind == "image" else write_text_sweep(tmp_path)
    text = path.read_text()
    path.write_text(text.replace("tiny-dinov2" if kind == "image" else "tiny-roberta",
                                 f"'hf:{model}'"))
    before = tree_digest(tmp_path)
    line = refused(capsys, ["run", str(path), "--in-process", "--no-progress"],
                   f"{model} {missing}", "save_pretrained")
    assert "environment fault" not in line and "(unknown path)" not in line
    assert tree_digest(tmp_path) == before


def test_an_oserror_without_errno_or_path_is_the_libraries_word_on_the_input():
    """The general cause of item 4: an OSError that no system call raised (no errno, no path:
    transformers, PIL) is reported with its own message as bad input; the system's are not."""
    assert classify(OSError("model has no file named preprocessor_config.json")) == \
        (2, "error", "model has no file named preprocessor_config.json")
    code, label, line = classify(OSError(errno.ENOSPC, "No space left on device", "/s.zarr"))
    assert (code, label) == (3, "environment fault") and line.startswith("/s.zarr: No space")
    for system in (ConnectionError("connection reset"), TimeoutError("timed out"),
                   PermissionError("not allowed")):
        assert classify(system)[0] == 3


# --- 5. a dead holder's lease on this host ---------------------------------------------------

HOLD = """
import sys, time
from storage.lease import Lease
from storage.location import locate
Lease(locate(sys.argv[1], {"endpoint_url": sys.argv[2]}), ttl=600).acquire()
print("held", flush=True)
time.sleep(600)
"""


@pytest.mark.s3
def test_a_lease_whose_holder_on_this_host_has_exited_is_taken_over_at_once(s3_bucket,
                                                                           tmp_path):
    store = f"s3://{s3_bucket}/dead.zarr"
    env = {**os.environ, **CREDENTIALS, "PYTHONPATH": str(REPO)}
    holder = subprocess.Popen([sys.executable, "-c", HOLD, store, ENDPOINT], env=env,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
    finally:
        holder.kill()  # SIGKILL: its lease (600 s) stays, fresh, in the bucket
        holder.wait()
    location = locate(StoreRef.of(store, {"endpoint_url": ENDPOINT}))
    [key] = location.listing(LEASES)
    record = LeaseRecord.decode(location.read(key))
    assert record.pid == holder.pid and record.expires > record.renewed + 500

    result = cli("run", str(empty_sweep(tmp_path, store, {"endpoint_url": ENDPOINT})),
                 "--in-process", "--no-progress", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    line = one_stderr_line(result.stderr)
    assert f"taking over the lease of {record.holder} pid {holder.pid}" in line
    assert "that process has exited (on this host" in line
    [taken] = location.listing(LEASES)
    assert taken != key and LeaseRecord.decode(location.read(taken)).released


def test_a_lease_holder_that_lives_or_lives_elsewhere_is_not_taken_for_dead():
    from storage.lease import Lease, holder_has_exited

    me = Lease(locate("memory://lease-alive/x.zarr"), ttl=60)._record()
    assert not holder_has_exited(me)  # this process
    assert holder_has_exited(LeaseRecord(**{**me.__dict__, "started": me.started - 60}))  # reused
    for other in ({"host": "elsewhere"}, {"namespace": "pid:[1]"}, {"started": None}):
        gone = LeaseRecord(**{**me.__dict__, "pid": 2 ** 22 + 1, **other})
        assert not holder_has_exited(gone)  # cannot tell: wait for the lease to expire
    assert holder_has_exited(LeaseRecord(**{**me.__dict__, "pid": 2 ** 22 + 1}))


# --- 6. an image truncated past its header ---------------------------------------------------

def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


def test_a_truncated_image_in_a_small_folder_is_refused_before_anything(tmp_path, capsys):
    path = image_sweep(tmp_path, n_images=5)
    truncate(tmp_path / "imgs" / "im3.png")
    before = tree_digest(tmp_path)
    refused(capsys, ["run", str(path), "--in-process", "--no-progress"],
            f"image {tmp_path}/imgs/im3.png: cannot be read (image file is truncated",
            "remove or replace it")
    assert tree_digest(tmp_path) == before  # no store, no lock file


def test_the_pixel_check_budget_is_read_from_the_environment(tmp_path, capsys, monkeypatch):
    from sweep.driver.preflight import pixel_check_bytes

    assert pixel_check_bytes() == 64 << 20
    monkeypatch.setenv("DOBRUSHIN_PIXEL_CHECK_MIB", "0")
    assert pixel_check_bytes() == 0
    for bad in ("-1", "nan", "inf"):
        monkeypatch.setenv("DOBRUSHIN_PIXEL_CHECK_MIB", bad)
        with pytest.raises(InputError, match="DOBRUSHIN_PIXEL_CHECK_MIB"):
            pixel_check_bytes()
    monkeypatch.setenv("DOBRUSHIN_PIXEL_CHECK_MIB", "lots")
    refused(capsys, ["run", str(image_sweep(tmp_path)), "--in-process", "--no-progress"],
            "DOBRUSHIN_PIXEL_CHECK_MIB='lots'")


def test_a_truncated_image_past_the_budget_leaves_a_resumable_store_that_status_names(
        tmp_path, capsys, monkeypatch):
    path = image_sweep(tmp_path, n_images=5)
    truncate(tmp_path / "imgs" / "im3.png")
    monkeypatch.setenv("DOBRUSHIN_PIXEL_CHECK_MIB", "0")  # a folder past the budget
    capsys.readouterr()
    assert main(["run", str(path), "--in-process", "--no-progress"]) == 2
    assert main(["status", str(tmp_path / "s.zarr")]) == 1
    out = capsys.readouterr().out
    assert f"failed d extract-00001: storage.errors.InputError: image {tmp_path}/imgs/im3.png: " \
           "cannot be read" in out, out
    image_sweep(tmp_path, n_images=5)  # replaced: the rerun resumes and completes
    assert main(["run", str(path), "--in-process", "--no-progress"]) == 0

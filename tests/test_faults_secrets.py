"""Issue 34, items 2, 3 and 12, through the real CLI: a password holding `/`, `#` or `?` in a URL
is caught like any other (one line, exit 2, the secret never echoed, nothing written, on a local
store and on SeaweedFS); a scheme-less scheduler address `key:secret@host:port` is refused
without printing the secret; `sweep plan --cluster` masks the values of secret-looking
environment variables of a cluster file (local, SLURM, Kubernetes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sweep.cli.entry import main
from tests.fault_helpers import one_stderr_line, write_text_sweep
from tests.s3_fixtures import CREDENTIALS, ENDPOINT, filesystem

REPO = Path(__file__).parents[1]
KEY = CREDENTIALS["AWS_ACCESS_KEY_ID"]
PORT = ENDPOINT.rsplit(":", 1)[1]
# secrets holding what ends a URL's authority; each part of one is checked in the output
SECRETS = ["s3cr/et9x", "s3cr#et9x", "s3c?r/et9x", "s3c/r@et9x"]


def leaks(secret: str, text: str) -> bool:
    """Whether `text` shows `secret` or one of its parts around the special character."""
    parts = [secret, *(p for p in secret.replace("@", "/").replace("#", "/").replace("?", "/")
                       .split("/") if len(p) >= 3)]
    return any(part in text for part in parts)


def cli(*args: str, cwd: Path, extra_env: dict | None = None):
    env = {**os.environ, **CREDENTIALS, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1",
           **(extra_env or {})}
    return subprocess.run([sys.executable, "-m", "sweep", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def empty_sweep(folder: Path, store: str, options: dict | None = None) -> Path:
    """A sweep of no models (it creates its store and runs no task)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "sweep.yaml"
    path.write_text(f"store: {json.dumps(store)}\nstorage_options: {json.dumps(options or {})}"
                    f"\nmatched_nulls: null\n")
    return path


def refused_without_the_secret(capsys, argv: list[str], secret: str) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    out, err = capsys.readouterr()
    line = one_stderr_line(err)
    assert line.startswith(f"sweep {argv[0]}: error: ") and "carries credentials" in line, line
    assert not leaks(secret, out + err), out + err
    return line


# --- item 2: `/`, `#`, `?` in a password ------------------------------------------------------

@pytest.mark.parametrize("secret", SECRETS)
@pytest.mark.parametrize("where", ["endpoint_url", "store"])
@pytest.mark.parametrize("command", ["plan", "run"])
def test_a_password_with_url_special_characters_is_refused_on_a_local_store(
        tmp_path, capsys, secret, where, command):
    if where == "endpoint_url":
        config = empty_sweep(tmp_path, "s.zarr",
                             {"endpoint_url": f"http://{KEY}:{secret}@127.0.0.1:{PORT}"})
    else:
        config = empty_sweep(tmp_path, f"file://{KEY}:{secret}@localhost{tmp_path}/s.zarr")
    argv = [command, str(config)] + (["--in-process", "--no-progress"] if command == "run"
                                     else [])
    line = refused_without_the_secret(capsys, argv, secret)
    assert "***@" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.yaml"]  # no store, no lock


@pytest.mark.s3
@pytest.mark.parametrize("case", ["endpoint_url", "store-url", "env-endpoint",
                                  "cli-storage-option", "cli-store"])
def test_a_password_with_a_slash_or_hash_is_refused_on_s3_in_one_line(s3_bucket, tmp_path,
                                                                       case):
    """Before: obstore's Rust client panicked (`PanicException ... InvalidPort`, a 99-line
    traceback, exit 1)."""
    secret = "s3cr/et#9x"
    with_secret = f"http://{KEY}:{secret}@127.0.0.1:{PORT}"
    store, options, extra_env = f"s3://{s3_bucket}/secret.zarr", {"endpoint_url": ENDPOINT}, None
    if case == "endpoint_url":
        options = {"endpoint_url": with_secret}
    elif case == "store-url":
        store = f"s3://{KEY}:{secret}@{s3_bucket}/secret.zarr"
    elif case == "env-endpoint":
        options, extra_env = {}, {"AWS_ENDPOINT_URL": with_secret}
    config = empty_sweep(tmp_path, store, options)
    if case == "cli-storage-option":
        result = cli("status", store, "--storage-option", f"endpoint_url={with_secret}",
                     cwd=tmp_path)
    elif case == "cli-store":
        result = cli("status", f"s3://{KEY}:{secret}@{s3_bucket}/secret.zarr",
                     "--storage-option", f"endpoint_url={ENDPOINT}", cwd=tmp_path)
    else:
        result = cli("run", str(config), "--in-process", "--no-progress", cwd=tmp_path,
                     extra_env=extra_env)
    assert result.returncode == 2, result.stderr[-3000:] + result.stdout
    line = one_stderr_line(result.stderr)
    assert "carries credentials (user:password@)" in line and "***@" in line, line
    assert not leaks(secret, result.stderr + result.stdout), result.stderr
    assert not filesystem().find(s3_bucket)  # nothing written
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.yaml"]


def test_urls_that_only_look_alike_are_left_alone():
    """A path or a port before an `@` later in the URL is no userinfo."""
    from storage.location import has_userinfo, redact_url

    for url in ["s3://bucket/a@b", "http://127.0.0.1:8333/a@b", "runs/a@b.zarr", "C:/x@y",
                "tcp://127.0.0.1:8786", "git@host:x/y"]:
        assert not has_userinfo(url) and redact_url(url) == url, url
    assert redact_url(f"see 'http://{KEY}:a/b#c@host:1/p'") == "see 'http://***@host:1/p'"


# --- item 3: a scheme-less scheduler address --------------------------------------------------

@pytest.mark.parametrize("secret", ["topsecret9", *SECRETS])
@pytest.mark.parametrize("command", ["plan", "run"])
def test_a_scheme_less_scheduler_address_with_a_secret_is_refused_without_it(
        tmp_path, capsys, secret, command):
    config = empty_sweep(tmp_path, "s.zarr")
    cluster = tmp_path / "cluster.yaml"
    address = json.dumps(f"{KEY}:{secret}@127.0.0.1:8786")
    cluster.write_text(f"kind: address\naddress:\n  scheduler: {address}\n")
    line = refused_without_the_secret(capsys, [command, str(config), "--cluster", str(cluster)],
                                      secret)
    assert "address.scheduler" in line and "***@127.0.0.1:8786" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cluster.yaml", "sweep.yaml"]


# --- item 12: credentials in a cluster file's env ---------------------------------------------

SECRET_ENV = {"AWS_SECRET_ACCESS_KEY": "kubesecret1", "HF_TOKEN": "hftoken22",
              "DB_PASSWORD": "pw333333"}


def planned_cluster(capsys, config: Path, cluster: Path) -> str:
    """`sweep plan --cluster` in every form (short, --verbose with the scripts and manifests,
    JSON): no secret in any; the verbose text returned."""
    for flags in ([], ["--format", "json"], ["--verbose"]):
        capsys.readouterr()
        assert main(["plan", str(config), "--cluster", str(cluster), *flags]) == 0
        out, err = capsys.readouterr()
        for value in SECRET_ENV.values():
            assert value not in out + err, (flags, value)
    return out


def test_plan_masks_secret_env_values_of_local_pools_and_slurm_jobs(tmp_path, capsys):
    config = write_text_sweep(tmp_path)
    env = json.dumps({**SECRET_ENV, "CUDA_VISIBLE_DEVICES": "0"})
    cluster = tmp_path / "local.yaml"
    cluster.write_text("local:\n  pools:\n"
                       f"    gpu: {{workers: 1, resources: {{GPU: 1}}, env: {env}}}\n"
                       "    cpu: {workers: 1, resources: {CPU: 1}}\n")
    out = planned_cluster(capsys, config, cluster)
    assert "AWS_SECRET_ACCESS_KEY: '***'" in out and "CUDA_VISIBLE_DEVICES: '0'" in out, out
    slurm = tmp_path / "slurm.yaml"
    slurm.write_text(
        "kind: slurm\nslurm:\n"
        "  gpu: {cores: 1, memory: 1GB, job_script_prologue: "
        f"['export AWS_SECRET_ACCESS_KEY={SECRET_ENV['AWS_SECRET_ACCESS_KEY']}', "
        "'export OMP_PROC_BIND=true'], "
        f"job_extra_directives: ['--export=ALL,HF_TOKEN={SECRET_ENV['HF_TOKEN']}']}}\n"
        f"  cpu: {{cores: 1, memory: 1GB, job_script_prologue: "
        f"['DB_PASSWORD=\"{SECRET_ENV['DB_PASSWORD']}\" ./setup.sh']}}\n")
    out = planned_cluster(capsys, config, slurm)
    assert "export AWS_SECRET_ACCESS_KEY=***" in out and "HF_TOKEN=***" in out, out
    assert "export OMP_PROC_BIND=true" in out and "DB_PASSWORD=*** ./setup.sh" in out, out


@pytest.mark.s3
def test_plan_masks_secret_env_values_of_every_kubernetes_rendering(s3_bucket, tmp_path,
                                                                    capsys):
    """Before: each secret printed 4 times (the cluster file's dump and the scheduler's, the
    GPU and the CPU workers' pods)."""
    config = empty_sweep(tmp_path, f"s3://{s3_bucket}/k.zarr", {"endpoint_url": ENDPOINT})
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(f"kind: kubernetes\nkubernetes:\n  image: sweep:1\n"
                       f"  env: {json.dumps({**SECRET_ENV, 'PLAIN': 'visible1'})}\n"
                       "  credentials_secret: store-keys\n"
                       "  gpu: {workers: 1, gpus: 1}\n  cpu: {workers: 1}\n")
    out = planned_cluster(capsys, config, cluster)
    assert out.count("value: '***'") == 3 * len(SECRET_ENV), out
    assert out.count("value: visible1") == 3 and "store-keys" in out, out


def test_masking_keeps_what_is_no_secret():
    from sweep.clusters.masking import masked, masked_text

    spec = {"env": [{"name": "HF_TOKEN", "value": "x1"}, {"name": "OMP_NUM_THREADS",
                                                          "value": "1"}],
            "envFrom": [{"secretRef": {"name": "store-keys"}}],
            "local": {"env": {"AWS_ACCESS_KEY_ID": "k", "CUDA_VISIBLE_DEVICES": "1"}}}
    assert masked(spec) == {
        "env": [{"name": "HF_TOKEN", "value": "***"}, {"name": "OMP_NUM_THREADS", "value": "1"}],
        "envFrom": [{"secretRef": {"name": "store-keys"}}],
        "local": {"env": {"AWS_ACCESS_KEY_ID": "***", "CUDA_VISIBLE_DEVICES": "1"}}}
    assert masked_text("export A=1 GH_TOKEN='a b' X=http://u:p@h/") == \
        "export A=1 GH_TOKEN=*** X=http://***@h/"

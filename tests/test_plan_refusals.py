"""Issue 34, item 14, through the real CLI: `sweep plan` refuses what `sweep run` refuses, the same
way: the same single stderr line (its command's name aside), the same exit code, nothing on
stdout and nothing written. Cases: a Kubernetes kind with a local store, a blank input line
(reported once, not per model), a hub id that cannot be reached without HF_HUB_OFFLINE (at once,
not after a minute of retries), and a fingerprinted setting changed on an existing store."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sweep.cli.entry import main
from tests.fault_helpers import LINES, one_stderr_line, tree_digest, write_text_sweep
from tests.test_faults_sweep import copy_of, reference  # noqa: F401 - the fixture

REPO = Path(__file__).parents[1]


def refusal(capsys, command: str, config: Path, *args: str) -> tuple[int, str]:
    """`sweep COMMAND CONFIG ARGS` in this process: its exit code and its one stderr line,
    with the command's name taken out; nothing on stdout."""
    capsys.readouterr()
    extra = ["--in-process", "--no-progress"] if command == "run" and "--cluster" not in args \
        else []
    code = main([command, str(config), *args, *extra])
    out, err = capsys.readouterr()
    line = one_stderr_line(err)
    assert line.startswith(f"sweep {command}: "), line
    if command == "plan":
        assert not out.strip(), out
    return code, line.removeprefix(f"sweep {command}: ")


def plan_refuses_as_run_does(capsys, config: Path, *args: str) -> tuple[int, str]:
    """Plan's refusal equals run's; both leave the config's folder as it was."""
    before = tree_digest(config.parent)
    planned = refusal(capsys, "plan", config, *args)
    assert tree_digest(config.parent) == before
    ran = refusal(capsys, "run", config, *args)
    assert tree_digest(config.parent) == before
    assert planned == ran
    return planned


def test_a_kubernetes_kind_with_a_local_store_is_refused_by_plan_in_one_line(tmp_path, capsys):
    config = write_text_sweep(tmp_path)
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("kind: kubernetes\nkubernetes:\n  image: sweep:1\n"
                       "  gpu: {workers: 1, gpus: 1}\n  cpu: {workers: 1}\n")
    code, line = plan_refuses_as_run_does(capsys, config, "--cluster", str(cluster))
    assert code == 2 and "Kubernetes workers share no folder with the driver" in line, line


def test_a_blank_input_line_is_reported_once_exit_2(tmp_path, capsys):
    config = write_text_sweep(tmp_path, lines=[LINES[0], "", LINES[1]])
    config.write_text(config.read_text() + "  rob2: {source: tiny-roberta, dataset: lines}\n")
    code, line = plan_refuses_as_run_does(capsys, config)
    assert code == 2 and line.endswith("lines.txt:2: blank line; every line must hold one "
                                       "input"), line


@pytest.mark.parametrize("setting, change", [
    ("batch_size: 2\n", "models.rob.batch_size: 8 -> 2"),
    ("shard_size: 3\n", "models.rob.shard_size: 2 -> 3"),
], ids=["batch_size", "shard_size"])
def test_a_changed_fingerprinted_setting_on_an_existing_store_is_refused_by_plan(
        tmp_path, reference, capsys, setting, change):  # noqa: F811 - the fixture
    folder = copy_of(reference, tmp_path)
    path = folder / "sweep.yaml"
    text = path.read_text().replace("shard_size: 2\n", "") if "shard" in setting else \
        path.read_text()
    path.write_text(text.replace("retries: 0\n", "retries: 0\n" + setting))
    code, line = plan_refuses_as_run_does(capsys, path)
    assert code == 2 and change in line and "computed with a different config" in line, line


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("source", ["hf:FacebookAI/roberta-base", "roberta-base"])
def test_a_hub_model_without_hf_hub_offline_fails_at_once_when_the_hub_does_not_answer(
        tmp_path, source):
    """The hub is a loopback port nothing answers on (HF_ENDPOINT) and its cache is empty:
    one line, exit 3 (the environment), naming HF_HUB_OFFLINE, instead of a minute of
    huggingface_hub's retry warnings."""
    config = write_text_sweep(tmp_path)
    config.write_text(config.read_text().replace("source: tiny-roberta", f"source: {source}"))
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HOME": str(tmp_path / "hf"),
           "HF_ENDPOINT": f"http://127.0.0.1:{closed_port()}"}
    env.pop("HF_HUB_OFFLINE", None)
    env.pop("TRANSFORMERS_OFFLINE", None)
    lines = {}
    for command in ("plan", "run"):
        args = [command, str(config)] + (["--in-process", "--no-progress"] if command == "run"
                                         else [])
        result = subprocess.run([sys.executable, "-m", "sweep", *args], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=600)
        assert result.returncode == 3, result.stderr[-3000:]
        assert not result.stdout.strip(), result.stdout
        lines[command] = one_stderr_line(result.stderr).removeprefix(f"sweep {command}: ")
        assert "does not answer" in lines[command] and "HF_HUB_OFFLINE=1" in lines[command]
    assert lines["plan"] == lines["run"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lines.txt", "sweep.yaml"]

"""`sweep check` and `sweep baseline` through the command line entry point."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sweep.cli.entry import main
from workers.exact.equality import check

KEYS = {
    "kappa", "kappa_factor", "bound", "margin", "holds", "holds_by_characterisation", "pair",
    "attaining_pairs",
}


def test_check_prints_one_json_record_per_matrix(tmp_path, capsys):
    rng = np.random.default_rng(0)
    a = rng.exponential(size=(3, 6, 6))
    a /= a.sum(axis=2, keepdims=True)
    np.save(tmp_path / "a.npy", a)
    assert main(["check", str(tmp_path / "a.npy"), "--format", "json"]) == 0
    out, err = capsys.readouterr()
    records = [json.loads(line) for line in out.splitlines()]
    assert len(records) == 3 and all(set(r) == KEYS for r in records)
    assert records == check(a).records()
    assert err == ""


def test_check_single_matrix_text_table_and_tolerance(tmp_path, capsys):
    np.save(tmp_path / "eye.npy", np.eye(4, dtype=np.float32))
    assert main(["check", str(tmp_path / "eye.npy"), "--tol", "1e-9"]) == 0  # text: default
    out = capsys.readouterr().out
    assert "1 matrices, 1 tight, 0 disagreements" in out
    assert out.splitlines()[1].split()[-2:] == ["0,1", "6"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (np.ones((2, 3)), "shape (2, 3)"),
        (np.array([[0.5, 0.5], [0.7, 0.7]]), "matrix row 1 sums to 1.4"),
        (np.array([[[1.0, 0.0], [0.0, 1.0]], [[np.nan, 1.0], [0.0, 1.0]]]), "matrix 1 row 0"),
        (np.array([{"a": 1}], dtype=object), "not a readable .npy"),
        (b"not numpy at all", "not a readable .npy"),
        (None, "no such file"),
    ],
)
def test_check_bad_input_exits_2_with_one_stderr_line(tmp_path, capsys, content, message):
    path = tmp_path / "bad.npy"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content is not None:
        np.save(path, content, allow_pickle=True)
    assert main(["check", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.splitlines()) == 1 and message in err and str(path) in err


def test_check_rejects_a_negative_tolerance(tmp_path, capsys):
    np.save(tmp_path / "eye.npy", np.eye(2))
    assert main(["check", str(tmp_path / "eye.npy"), "--tol", "-1"]) == 2
    assert capsys.readouterr().out == ""


def test_baseline_prints_one_record_per_size(capsys):
    assert main(["baseline", "--sizes", "2,5", "--trials", "1500", "--seed", "3",
                 "--format", "json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["n"] for r in records] == [2, 5]
    for r in records:
        assert {"n", "trials", "holding", "rate", "ci_low", "ci_high"} <= set(r)
        assert r["trials"] == 1500 and r["rate"] == r["holding"] / 1500
        assert r["ci_low"] <= r["rate"] <= r["ci_high"]


def test_baseline_text_format(capsys):
    assert main(["baseline", "--sizes", "3", "--trials", "200"]) == 0  # text: the default
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:5] == ["null", "n", "trials", "holding", "rate"]
    assert lines[1].split()[:3] == ["uniform", "3", "200"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--sizes", "2,x"], "--sizes item 'x'"), (["--trials", "0"], "trials >= 1")],
)
def test_baseline_bad_arguments_exit_2(capsys, argv, message):
    assert main(["baseline", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and message in err


def test_baseline_runs_the_named_nulls_in_order(capsys):
    argv = ["baseline", "--sizes", "2,3", "--trials", "1e3", "--null", "softmax-b4,uniform",
            "--null", "softmax-b4", "--format", "json"]
    assert main(argv) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["null"], r["n"]) for r in records] == [
        ("softmax-b4", 2), ("softmax-b4", 3), ("uniform", 2), ("uniform", 3)]
    assert all(r["trials"] == 1000 for r in records)
    assert main(["baseline", "--sizes", "3", "--trials", "1000", "--format", "json"]) == 0
    # the default null: uniform
    (default,) = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert default == records[-1]


@pytest.mark.parametrize(("argv", "message"), [
    (["--null", "gauss"], "unknown null 'gauss'; choose from all, uniform, softmax-b0.5"),
    (["--sizes", "100000000", "--trials", "10"], "size 100000000: testing one"),
])
def test_baseline_bad_null_or_size_exit_2_in_one_line(capsys, argv, message):
    assert main(["baseline", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and message in err

"""`sweep show STORE MODEL INPUT_ID`: one input up close, from the store alone.

The store is hand-built with attention matrices chosen so that the pair attaining κ is known, and
verdicts computed from them by the sweep's own per-input evaluation (`evaluate_input`): layer 0
is tight at every pair, layer 1 fails at the pair (CLS 0, content 1), which is not mutually
self-dominant (A_00 = 0.1 < A_10 = 0.8).
"""

from __future__ import annotations

import io
import itertools
import shutil

import matplotlib.image
import numpy as np
import pytest
import zarr
from matplotlib.figure import Figure
from PIL import Image

from storage.layout import RESULT_VARS, RESULTS_GROUP, ResultStatus
from sweep.cli.entry import main
from sweep.show import view as show
from sweep.show.figure import draw_patches, patch_grid
from sweep.show.view import attaining_pair, read_input, render_table
from tests.store_fixtures import FixtureModel, write_store
from workers.exact.token_kinds import TokenKind
from workers.models.registry import family_module, resolve_model
from workers.models.token_layout import token_layout
from workers.tasks.verdicts import evaluate_input

TIGHT = np.array([[0.7, 0.1, 0.1, 0.1], [0.1, 0.7, 0.1, 0.1], [0.1, 0.1, 0.7, 0.1],
                  [0.1, 0.1, 0.1, 0.7]])
FAILS = np.array([[0.1, 0.8, 0.05, 0.05], [0.8, 0.1, 0.05, 0.05], [0.3, 0.3, 0.2, 0.2],
                  [0.3, 0.3, 0.2, 0.2]])  # κ = 0.7 at (0, 1) only
KINDS = np.array([TokenKind.CLS, TokenKind.CONTENT, TokenKind.CONTENT, TokenKind.CONTENT],
                 dtype=np.int8)
LINES = ["the cat sat on the mat", "a second line"]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    folder = tmp_path_factory.mktemp("show")
    (folder / "lines.txt").write_text("\n".join(LINES) + "\n")
    status = np.zeros((2, 2, 2), dtype=np.int8)
    path = write_store(folder / "sweep.zarr", {"m": FixtureModel(
        margin=np.zeros((2, 2, 2)), status=status, t_max=4)})
    group = zarr.open_group(path / "m", mode="r+")
    group.attrs["dataset_spec"] = {"kind": "text", "path": str(folder / "lines.txt")}
    group["input_id"][...] = np.array(["line-1", "line-2"])
    group["token_kind"][...] = np.stack([KINDS, KINDS])
    attention = np.stack([TIGHT, FAILS])[None, :, None].repeat(2, axis=0)  # (2, 2, 1, 4, 4)
    group["attention"][...] = attention.astype(np.float32)
    for t, token_set in enumerate(("all", "content")):
        for i in range(2):
            out = evaluate_input(attention[i, :, 0].astype(np.float64), KINDS, token_set, 1e-12)
            for var in RESULT_VARS:
                group[RESULTS_GROUP][var][i, :, 0, t] = out[var]
    root = zarr.open_group(path, mode="r+")
    root.attrs["config"] = {"tol": 1e-12}
    return path


def test_the_failing_layer_shows_its_attaining_pair_with_kinds_and_entries(store):
    view = read_input(store, "m", "line-2")
    tight, fails = view.rows
    assert fails.verdict == "not tight" and fails.status == ResultStatus.OK
    assert fails.pair == (0, 1) and fails.pair_computed  # the store keeps no pair there
    assert fails.entries == pytest.approx((0.1, 0.8, 0.1, 0.8), abs=1e-7)
    assert fails.self_dominant is False
    assert fails.kappa == pytest.approx(0.5 * np.abs(FAILS[0] - FAILS[1]).sum(), abs=1e-6)
    assert tight.verdict == "tight" and not tight.pair_computed  # the sweep's own pair
    assert tight.self_dominant is True
    np.testing.assert_array_equal(view.token_kind, KINDS)


def test_the_terminal_table_names_the_input_the_tokens_and_the_pair(store, capsys):
    assert main(["show", str(store), "m", "line-1", "--inputs",
                 str(store.parent / "lines.txt")]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == "m · input line-1 (#0 of 2) · 4 tokens: CLS at 0, 3 content"
    assert lines[1] == "reading: all (A) · tight: margin <= 1e-12"
    assert lines[2] == f"input: text {LINES[0]!r}"
    row = next(line for line in lines if line.startswith("1 "))
    assert "not tight" in row and "0 CLS · 1 content*" in row
    assert row.split()[-2:] == ["no", "1"]  # not self-dominant; one pair attains κ
    assert "* the store keeps a pair only where the bound is tight" in out


def test_layer_and_reading_are_chosen(store):
    view = read_input(store, "m", "line-2", layers=[1], token_set="content")
    assert [row.layer for row in view.rows] == [1]
    content = view.rows[0]
    assert content.pair is None or set(content.pair) <= {1, 2, 3}  # content tokens only
    assert "reading: content (A[C,C], renormalised)" in render_table(view)


@pytest.mark.parametrize(("args", "message"), [
    (["m", "line-9"], "model 'm' has no input 'line-9': its 2 input ids are line-1, line-2"),
    (["m", "line-1", "--layer", "2"], "--layer 2: model 'm' has layers 0..1"),
    (["m", "line-1", "--token-set", "content-pairs"],
     "--token-set 'content-pairs': model 'm' was tested on all, content"),
    (["nope", "line-1"], "no model 'nope'"),
])
def test_bad_arguments_are_one_line_exit_2(store, capsys, args, message):
    assert main(["show", str(store), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and message in err, err


def test_png_draws_the_first_failing_layer(store, tmp_path, capsys):
    out = tmp_path / "figures" / "pair.png"  # its folder is created
    assert main(["show", str(store), "m", "line-2", "--png", str(out)]) == 0
    assert f"wrote {out} (layer 1)" in capsys.readouterr().err
    pixels = matplotlib.image.imread(io.BytesIO(out.read_bytes()))
    assert pixels.shape[0] > 200 and pixels.std() > 0


def test_an_input_whose_dataset_is_gone_says_so_in_one_line(store, tmp_path, capsys):
    moved = tmp_path / "moved.zarr"
    shutil.copytree(store, moved)
    group = zarr.open_group(moved / "m", mode="r+")
    group.attrs["dataset_spec"] = {"kind": "text", "path": str(tmp_path / "gone.txt")}
    assert main(["show", str(moved), "m", "line-1", "--inputs", str(tmp_path / "gone.txt")]) == 0
    assert "input: (not available here: text file" in capsys.readouterr().out


def test_attaining_pair_agrees_with_a_double_loop():
    rng = np.random.default_rng(7)
    for n in (2, 3, 6, 9):
        x = rng.dirichlet(np.ones(n) * 0.3, size=n)
        kappa = {(i, j): 0.5 * np.abs(x[i] - x[j]).sum()
                 for i, j in itertools.combinations(range(n), 2)}
        top = max(kappa.values())
        attaining = [p for p, k in kappa.items() if top - k <= 1e-12]
        gaps = {(i, j): max(x[j, i] - x[i, i], 0) + max(x[i, j] - x[j, j], 0)
                for i, j in attaining}
        i, j, count = attaining_pair(x, 1e-12)
        assert count == len(attaining)
        assert (i, j) in attaining and gaps[(i, j)] == min(gaps.values())


@pytest.mark.s3
def test_a_store_on_s3_shows_the_same(store, s3_bucket, capsys):
    from tests.s3_fixtures import ENDPOINT, filesystem

    filesystem().put(str(store), f"{s3_bucket}/sweep.zarr", recursive=True)
    assert main(["show", str(store), "m", "line-2"]) == 0
    local = capsys.readouterr().out
    assert main(["show", f"s3://{s3_bucket}/sweep.zarr", "m", "line-2",
                 "--storage-option", f"endpoint_url={ENDPOINT}"]) == 0
    assert capsys.readouterr().out == local


def test_the_tested_matrix_is_the_readings_own():
    a = FAILS
    content = np.array([1, 2, 3])
    matrix, kept = show.tested_matrix(a, KINDS, "content")
    np.testing.assert_allclose(matrix, a[1:, 1:] / a[1:, 1:].sum(axis=1, keepdims=True))
    np.testing.assert_array_equal(kept, content)
    matrix, kept = show.tested_matrix(a, KINDS, "content-pairs")
    np.testing.assert_allclose(matrix, a)  # pairs in C, full rows of A
    matrix, kept = show.tested_matrix(a, KINDS, "content-complement")
    s = a[0, 1:] / (1 - a[0, 0])  # one special token: A_CC + A_CS (1 - A_SS)^-1 A_SC
    np.testing.assert_allclose(matrix, a[1:, 1:] + np.outer(a[1:, 0], s))
    np.testing.assert_array_equal(kept, content)


def test_an_image_is_drawn_as_the_model_saw_it_with_the_pairs_patches_outlined():
    spec = resolve_model("tiny-dinov2-reg")  # CLS, 4 registers, then the patches
    image = Image.fromarray(np.random.default_rng(1).integers(0, 255, (90, 120, 3), np.uint8))
    picture, patch = family_module(spec).seen_image(spec, image)
    tokens = token_layout(spec).tokens
    kinds = np.array([TokenKind.CLS] + [TokenKind.REGISTER] * 4
                     + [TokenKind.CONTENT] * (tokens - 5), dtype=np.int8)
    first, rows, columns = patch_grid(kinds, picture, patch)
    assert (first, rows * columns, picture.dtype) == (5, tokens - 5, np.uint8)
    ax = Figure().subplots()
    draw_patches(ax, picture, patch, (first, rows, columns), (0, first + columns + 1))
    (outline,) = ax.patches  # CLS has no patch; token first + columns + 1 is patch (1, 1)
    assert outline.get_xy() == (patch - 0.5, patch - 0.5)
    assert "tokens 0 are special (no patch)" in ax.get_title()
    assert patch_grid(kinds[:-1], picture, patch) is None  # tokens that do not tile it

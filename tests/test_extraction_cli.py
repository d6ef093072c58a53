"""`sweep extract MODEL_SOURCE INPUTS --out FILE.npz`: an object-free npz, one-line errors."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from storage.errors import InputError
from sweep.cli.commands import extract


def run(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    extract.register(parser.add_subparsers())
    args = parser.parse_args(["extract", *argv])
    return args.func(args)


def test_extract_writes_attention_and_kinds_per_input(tmp_path):
    text = tmp_path / "in.txt"
    text.write_text("a first input\nthe second, longer input line\nthird\n")
    out = tmp_path / "out.npz"
    assert run("tiny-distilbert", str(text), "--out", str(out), "--batch-size", "2") == 0
    with np.load(out, allow_pickle=False) as data:
        assert data["ids"].tolist() == ["line-1", "line-2", "line-3"]
        for k in range(3):
            attention, kinds = data[f"attention_{k}"], data[f"token_kind_{k}"]
            assert attention.shape == (2, len(kinds), len(kinds)) and kinds.dtype == np.int8
            np.testing.assert_allclose(attention.sum(-1), 1.0, atol=1e-5)


def test_extract_infers_image_kind_and_honours_limit(tmp_path):
    out = tmp_path / "img.npz"
    assert run("tiny-dinov2-reg", "sklearn:sample_images", "--limit", "2", "--out", str(out)) == 0
    with np.load(out, allow_pickle=False) as data:
        assert data["ids"].tolist() == ["china.jpg", "flower.jpg"]
        assert data["attention_1"].shape == (2, 21, 21)


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (("tiny-vit", "pydoc:topics"), "takes image inputs, not text"),
        (("tiny-vit", "inputs.bin"), "cannot tell the kind"),
        (("no-such-model", "pydoc:topics"), "unknown model 'no-such-model'"),
        (("tiny-roberta", "pydoc:topics", "--batch-size", "0"), "--batch-size 0"),
    ],
)
def test_bad_arguments_are_one_line_input_errors(tmp_path, argv, match):
    with pytest.raises(InputError, match=match) as error:
        run(*argv, "--out", str(tmp_path / "x.npz"))
    assert "\n" not in str(error.value)
    assert not (tmp_path / "x.npz").exists()

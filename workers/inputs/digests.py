"""Per-input content digests: what lets a rerun notice inputs edited under the same ids.

One sha256 hex digest per input, computed the same way by the driver (to decide which shards are
stale) and by the extraction task (to verify what it reads, and to record it in the store's
`input_digest` beside the attention it extracted):

- text: the line's UTF-8 bytes (the lines are in memory once the dataset is open);
- tabular: the row's float64 features and its target; for FT-Transformer also the whole table's
  fingerprint, because its weights are trained on every row (an edited row changes them all);
- digit images (`sklearn:digits`, kind image): as a tabular row (the pixels are the row), with
  the table's fingerprint for a model trained on it (the digits ViT);
- image: the file's (size, mtime_ns) from `os.stat`: the driver never decodes or reads an image
  (issue 9); an edit that keeps both size and nanosecond mtime goes unnoticed (documented in
  docs/faults.md). scikit-learn's bundled photos (`sklearn:sample_images`) by their bytes
  instead: every installation of the package (the driver's venv, a worker image) gives the same
  files other mtimes.
"""

from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from workers.inputs.base import Dataset


def _sha(*parts: bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part)
    return digest.hexdigest()


def _image_file(dataset: Dataset, index: int) -> Path:
    """The file an image input is read from (a folder's file, or a sklearn sample photo)."""
    input_id = dataset.ids[index]
    root = getattr(dataset, "root", None)
    if root is not None:
        return Path(root) / input_id
    name = input_id.partition("#tile-")[0]
    return next(f for f in dataset.files if f.name == name)


@functools.cache
def _file_sha(path: Path, size: int, mtime_ns: int) -> str:
    """The sha256 of a file's bytes (once per path, size and mtime)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _one(dataset: Dataset, index: int, salt: bytes, rows: np.ndarray | None) -> str:
    input_id = dataset.ids[index].encode()
    if dataset.kind == "text":
        return _sha(input_id, dataset.load([index])[0].encode("utf-8"))
    if dataset.kind == "tabular" or rows is not None:
        table = dataset.table
        table_row = int(rows[index])  # the dataset may measure a subset (FT test rows)
        row = np.ascontiguousarray(table.features[table_row], dtype=np.float64).tobytes()
        target = np.ascontiguousarray(table.target[table_row]).tobytes()
        return _sha(input_id, row, target, salt)
    path = _image_file(dataset, index)
    stat = os.stat(path)
    if getattr(dataset, "root", None) is None:  # a photo bundled with scikit-learn
        return _sha(input_id, _file_sha(path, stat.st_size, stat.st_mtime_ns).encode())
    return _sha(input_id, f"{stat.st_size}:{stat.st_mtime_ns}".encode())


def input_digests(dataset: Dataset, indices: Iterable[int], *,
                  whole_table: bool = False) -> tuple[str, ...]:
    """The digests of the inputs at `indices`; `whole_table` folds in the table's fingerprint
    (models trained on the whole table: FT-Transformer, the digits ViT)."""
    salt = b""
    if whole_table and dataset.table is not None:
        salt = dataset.table.fingerprint.encode()
    # input -> table row (tabular rows, and images that are rows of a table: the digits)
    rows = dataset.rows if dataset.table is not None else None
    return tuple(_one(dataset, index, salt, rows) for index in indices)

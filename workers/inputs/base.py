"""The dataset contract: a frozen `DatasetSpec`, the `Dataset` it opens, and kind dispatch."""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from storage.errors import InputError

KINDS = ("image", "text", "tabular")


@dataclass(frozen=True)
class DatasetSpec:
    """Where inputs come from: a `path` (file or folder) or a `source` form, and how many.

    `split`/`column` select a Hugging Face dataset's split and text column; `target` names the
    CSV column holding the label (tabular). `limit` keeps the first N inputs.
    """

    kind: str
    path: str | None = None
    source: str | None = None
    limit: int | None = None
    split: str = "train"
    column: str = "text"
    target: str = "target"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InputError(f"dataset kind {self.kind!r} is unknown: use one of {KINDS}")
        if (self.path is None) == (self.source is None):
            raise InputError("dataset: give exactly one of `path` (file or folder) or `source`")
        if self.limit is not None and (not isinstance(self.limit, int) or self.limit < 1):
            raise InputError(f"dataset limit {self.limit!r}: must be a positive integer or null")

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form."""
        return asdict(self)


@dataclass(frozen=True)
class Table:
    """Every row of a tabular source (not only the first `limit`): what FT-Transformer trains on.

    A categorical feature holds its category codes 0..cardinality-1 (as float64) in `features`.
    """

    features: np.ndarray  # (rows, features) float64
    target: np.ndarray  # (rows,) float64 (regression) or int64 class index (classification)
    task: str  # "classification" | "regression"
    feature_names: tuple[str, ...]
    fingerprint: str  # sha256 of the content: keys the trained checkpoint
    categorical: tuple[int, ...] = ()  # ascending indices of the categorical features
    cardinalities: tuple[int, ...] = ()  # per categorical feature: its categories (codes 0..c-1)

    @property
    def continuous(self) -> tuple[int, ...]:
        """Ascending indices of the continuous (non-categorical) features."""
        categorical = set(self.categorical)
        return tuple(k for k in range(len(self.feature_names)) if k not in categorical)


class Dataset:
    """Inputs of one kind with stable `ids`; `load(indices)` returns PIL RGB images, str or rows."""

    kind: str = ""

    def __init__(self, spec: DatasetSpec, ids: Sequence[str]) -> None:
        self.spec = spec
        self.ids: tuple[str, ...] = tuple(ids[: spec.limit] if spec.limit else ids)
        if not self.ids:
            raise InputError(f"dataset {spec.path or spec.source!r}: holds no inputs")

    def __len__(self) -> int:
        return len(self.ids)

    def load(self, indices: Iterable[int]) -> list:
        """The inputs at `indices` (positions in `ids`), in that order."""
        return [self._load_one(index) for index in self.positions(indices)]

    def positions(self, indices: Iterable[int]) -> Iterator[int]:
        """`indices`, each checked: IndexError for one outside the dataset."""
        for index in indices:
            if not 0 <= index < len(self.ids):
                raise IndexError(f"input {index} out of range: the dataset holds {len(self)}")
            yield index

    def load_pixels(self, indices: Iterable[int]) -> list:
        """Images for an image processor's torchvision backend, the pixels `load` gives: its
        PIL images here; an image folder's as tensors, without the PIL image
        (`workers.inputs.pixels`)."""
        return self.load(indices)

    def _load_one(self, index: int) -> Any:
        raise NotImplementedError

    @property
    def table(self) -> Table | None:
        """The whole table (tabular datasets only)."""
        return None


def infer_kind(inputs: str) -> str | None:
    """The dataset kind an INPUTS string implies (a source form, folder or file suffix), or None."""
    if inputs == "sklearn:sample_images":
        return "image"
    if inputs.startswith("sklearn:"):
        return "tabular"
    if inputs.startswith(("pydoc:", "hf:")):
        return "text"
    path = Path(inputs)
    if path.is_dir():
        return "image"
    return {".csv": "tabular", ".txt": "text"}.get(path.suffix.lower())


KINDS: dict[str, tuple[str, str]] = {
    "image": ("workers.inputs.images", "open_images"),
    "text": ("workers.inputs.text", "open_text"),
    "tabular": ("workers.inputs.tabular", "open_tabular"),
}
"""Dataset kinds: kind -> (module, opener). A new kind is one module with an opener
`(DatasetSpec) -> Dataset` and its line here."""


def open_dataset(spec: DatasetSpec) -> Dataset:
    """Open the dataset `spec` describes; InputError names a missing file or an unknown source."""
    if spec.kind not in KINDS:
        raise InputError(f"dataset kind {spec.kind!r} is unknown: use one of {sorted(KINDS)}")
    module, opener = KINDS[spec.kind]
    return getattr(importlib.import_module(module), opener)(spec)


class TableRows(Dataset):
    """Inputs that are rows of a `table` (which also holds the rows not measured): `row_ids`
    names every table row; `rows` (default: all, in order) picks the rows this dataset's inputs
    are, in that order (then `limit` keeps the first N of them)."""

    def __init__(self, spec: DatasetSpec, row_ids: Sequence[str], table: Table,
                 rows: Sequence[int] | None = None) -> None:
        self.row_ids = tuple(row_ids)
        order = np.arange(len(self.row_ids)) if rows is None else np.asarray(rows, np.int64)
        super().__init__(spec, [self.row_ids[r] for r in order])
        self._rows = order[: len(self.ids)]
        self._table = table

    @property
    def table(self) -> Table:
        return self._table

    @property
    def rows(self) -> np.ndarray:
        """The table row of each input, in input order: (inputs,) int64."""
        return self._rows.copy()

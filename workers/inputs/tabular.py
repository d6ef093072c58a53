"""Tabular datasets: a CSV file with a named target column, or scikit-learn's datasets.

Text columns of a CSV and Adult's categorical columns are categorical features: the table
holds their codes and knows which features they are and how many categories each has.
"""

from __future__ import annotations

import csv
import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from storage.errors import InputError
from workers.inputs.base import Dataset, DatasetSpec, Table, TableRows

BUNDLED = {  # name -> (loader in sklearn.datasets, task); offline
    "breast_cancer": ("load_breast_cancer", "classification"),
    "wine": ("load_wine", "classification"),
    "iris": ("load_iris", "classification"),
    "digits": ("load_digits", "classification"),
    "diabetes": ("load_diabetes", "regression"),
}
FETCHED = ("california_housing", "adult")  # downloaded by scikit-learn: online only
# A numeric CSV target is a class label when integral with at most this many distinct values.
MAX_CLASSES = 20


class TabularDataset(TableRows):
    """Rows of float64 features; `table` holds every row with its target for training.

    `row_ids` names every row of the table; `rows` (default: all, in order) picks the table rows
    this dataset's inputs are, in that order (then `limit` keeps the first N of them).
    """

    kind = "tabular"

    def __init__(self, spec: DatasetSpec, row_ids: Sequence[str], table: Table,
                 rows: Sequence[int] | None = None) -> None:
        if len(row_ids) != len(table.target):
            raise InputError(f"tabular dataset: {len(row_ids)} ids for {len(table.target)} rows")
        super().__init__(spec, row_ids, table, rows)

    def subset(self, rows: Sequence[int]) -> TabularDataset:
        """The same table measured on `rows` only (table rows, in that order; then `limit`)."""
        return TabularDataset(self.spec, self.row_ids, self._table, rows)

    def _load_one(self, index: int) -> np.ndarray:
        return self._table.features[self._rows[index]].copy()  # (features,) float64


def make_table(features: np.ndarray, target: np.ndarray, task: str, names: list[str],
               cardinalities: Mapping[int, int] | None = None) -> Table:
    """A `Table` with its content fingerprint; NaN/inf features or targets are an InputError.

    `cardinalities` maps the index of each categorical feature to its number of categories;
    its values must be the codes 0..cardinality-1.
    """
    features = np.ascontiguousarray(features, dtype=np.float64)
    target_dtype = np.int64 if task == "classification" else np.float64
    target = np.ascontiguousarray(target, dtype=target_dtype)
    bad = np.argwhere(~np.isfinite(features))
    if len(bad):
        row, col = bad[0]
        raise InputError(f"tabular row {row}, feature {names[col]!r}: not a finite number")
    categorical = tuple(sorted((cardinalities or {}).keys()))
    sizes = tuple(int((cardinalities or {})[k]) for k in categorical)
    for k, size in zip(categorical, sizes, strict=True):
        codes = features[:, k]
        if size < 1 or np.any((codes < 0) | (codes >= size) | (codes != np.round(codes))):
            raise InputError(
                f"tabular feature {names[k]!r}: categorical codes must be integers in [0, {size})"
            )
    digest = hashlib.sha256()
    for part in (features.tobytes(), target.tobytes(), task.encode(), "\x00".join(names).encode()):
        digest.update(part)
    if categorical:
        digest.update(repr((categorical, sizes)).encode())
    return Table(features, target, task, tuple(names), digest.hexdigest(), categorical, sizes)


def open_tabular(spec: DatasetSpec) -> Dataset:
    """A CSV file or an sklearn source; InputError names unknown sources or bad rows."""
    if spec.path is not None:
        table, ids = _csv(Path(spec.path).expanduser(), spec.target)
        return TabularDataset(spec, ids, table)
    name = spec.source.removeprefix("sklearn:") if spec.source.startswith("sklearn:") else None
    if name in BUNDLED:
        loader, task = BUNDLED[name]
        import sklearn.datasets

        bunch = getattr(sklearn.datasets, loader)()
        table = make_table(bunch.data, bunch.target, task, [str(n) for n in bunch.feature_names])
    elif name in FETCHED:
        table = _fetched(name)
    else:
        raise InputError(
            f"tabular source {spec.source!r} is unknown: use a .csv path or sklearn:<name> with "
            f"name in {sorted(BUNDLED) + list(FETCHED)}"
        )
    return TabularDataset(spec, [f"{name}-{k}" for k in range(len(table.target))], table)


def _fetched(name: str) -> Table:
    import sklearn.datasets

    try:
        if name == "california_housing":
            bunch = sklearn.datasets.fetch_california_housing()
            return make_table(bunch.data, bunch.target, "regression", list(bunch.feature_names))
        frame = sklearn.datasets.fetch_openml("adult", version=2, as_frame=True).frame
    except OSError as error:  # URLError and friends: offline, or the server is down
        raise InputError(
            f"tabular source 'sklearn:{name}' must be downloaded by scikit-learn and could not be "
            f"({error}); go online once (it is cached) or use a bundled one: {sorted(BUNDLED)}"
        ) from error
    frame = frame.dropna()
    target = frame.pop("class")
    # Categorical columns: their category codes, embedded by FT-Transformer as categories.
    categorical = [k for k, c in enumerate(frame.columns) if frame[c].dtype.name == "category"]
    columns = [
        frame[c].cat.codes.to_numpy() if k in categorical else frame[c].to_numpy()
        for k, c in enumerate(frame.columns)
    ]
    sizes = {k: len(frame[frame.columns[k]].cat.categories) for k in categorical}
    labels = (target.astype(str) == ">50K").to_numpy()
    return make_table(np.stack(columns, axis=1), labels, "classification", list(frame.columns),
                      sizes)


def _csv(path: Path, target: str) -> tuple[Table, list[str]]:
    try:
        return _read_csv(path, target)
    except UnicodeDecodeError as error:
        raise InputError(f"{path}: not UTF-8 (byte {error.start} of a chunk: "
                         f"{error.object[error.start:error.start + 1]!r}); save it as UTF-8"
                         ) from None


def _read_csv(path: Path, target: str) -> tuple[Table, list[str]]:
    """Every data row of a CSV; a column holding any non-number is categorical (sorted labels)."""
    if not path.is_file():
        raise InputError(f"CSV file {str(path)!r}: not found")
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if not header:
            raise InputError(f"{path}: empty file; the first line must name the columns")
        if target not in header:
            raise InputError(f"{path}:1: no target column {target!r}; columns are {header}")
        t = header.index(target)
        cells, lines = [], []  # per data row: its fields, and its line number
        for row in reader:
            if not row:
                continue
            if len(row) != len(header):
                raise InputError(
                    f"{path}:{reader.line_num}: {len(row)} fields, the header has {len(header)}"
                )
            for k, cell in enumerate(row):
                if not cell.strip():
                    raise InputError(f"{path}:{reader.line_num}: column {header[k]!r} is empty "
                                     "(missing values are not supported)")
            cells.append(row)
            lines.append(reader.line_num)
    if not cells:
        raise InputError(f"{path}: no data rows after the header")
    names = [h for k, h in enumerate(header) if k != t]
    columns, sizes = [], {}
    for k in (k for k in range(len(header)) if k != t):
        values = [row[k].strip() for row in cells]
        numbers = _numbers(values)
        if numbers is None:  # text: a categorical feature, codes of its sorted labels
            labels = sorted(set(values))
            sizes[len(columns)] = len(labels)
            numbers = np.searchsorted(np.array(labels), np.array(values)).astype(np.float64)
        elif not np.isfinite(numbers).all():
            line = lines[int(np.argmin(np.isfinite(numbers)))]
            raise InputError(f"{path}:{line}: column {header[k]!r} is not finite")
        columns.append(numbers)
    task, encoded = _encode_target([row[t].strip() for row in cells], path)
    ids = [f"row-{k}" for k in range(len(cells))]
    return make_table(np.stack(columns, axis=1), encoded, task, names, sizes), ids


def _numbers(values: list[str]) -> np.ndarray | None:
    """The values as float64, or None if any of them is not a number."""
    try:
        return np.array([float(v) for v in values], dtype=np.float64)
    except ValueError:
        return None


def _encode_target(labels: list[str], path: Path) -> tuple[str, np.ndarray]:
    """Classification (sorted label index) for text or few integral labels, else regression."""
    try:
        values = np.array([float(v) for v in labels])
    except ValueError:
        classes = sorted(set(labels))
        return "classification", np.array([classes.index(v) for v in labels])
    if not np.isfinite(values).all():
        raise InputError(f"{path}: the target column holds a non-finite value")
    if np.all(values == np.round(values)) and len(np.unique(values)) <= MAX_CLASSES:
        classes = np.unique(values)
        return "classification", np.searchsorted(classes, values)
    return "regression", values

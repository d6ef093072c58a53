"""Tabular datasets: a CSV file with a named target column, or scikit-learn's datasets."""

from __future__ import annotations

import csv
import hashlib
from pathlib import Path

import numpy as np

from workers.errors import InputError
from workers.inputs.base import Dataset, DatasetSpec, Table

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


class TabularDataset(Dataset):
    """Rows of float64 features; `table` holds every row with its target for training."""

    kind = "tabular"

    def __init__(self, spec: DatasetSpec, ids: list[str], table: Table) -> None:
        super().__init__(spec, ids)
        self._table = table

    @property
    def table(self) -> Table:
        return self._table

    def _load_one(self, index: int) -> np.ndarray:
        return self._table.features[index].copy()  # (features,) float64


def make_table(features: np.ndarray, target: np.ndarray, task: str, names: list[str]) -> Table:
    """A `Table` with its content fingerprint; NaN/inf features or targets are an InputError."""
    features = np.ascontiguousarray(features, dtype=np.float64)
    target_dtype = np.int64 if task == "classification" else np.float64
    target = np.ascontiguousarray(target, dtype=target_dtype)
    bad = np.argwhere(~np.isfinite(features))
    if len(bad):
        row, col = bad[0]
        raise InputError(f"tabular row {row}, feature {names[col]!r}: not a finite number")
    digest = hashlib.sha256()
    for part in (features.tobytes(), target.tobytes(), task.encode(), "\x00".join(names).encode()):
        digest.update(part)
    return Table(features, target, task, tuple(names), digest.hexdigest())


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
    # Categorical columns become their category codes: one numeric token per feature.
    columns = [
        frame[c].cat.codes.to_numpy() if frame[c].dtype.name == "category" else frame[c].to_numpy()
        for c in frame.columns
    ]
    labels = (target.astype(str) == ">50K").to_numpy()
    return make_table(np.stack(columns, axis=1), labels, "classification", list(frame.columns))


def _csv(path: Path, target: str) -> tuple[Table, list[str]]:
    try:
        return _read_csv(path, target)
    except UnicodeDecodeError as error:
        raise InputError(f"{path}: not UTF-8 (byte {error.start} of a chunk: "
                         f"{error.object[error.start:error.start + 1]!r}); save it as UTF-8"
                         ) from None


def _read_csv(path: Path, target: str) -> tuple[Table, list[str]]:
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
        names = [h for k, h in enumerate(header) if k != t]
        rows, labels = [], []
        for row in reader:
            line = reader.line_num
            if not row:
                continue
            if len(row) != len(header):
                raise InputError(f"{path}:{line}: {len(row)} fields, the header has {len(header)}")
            values = []
            for k, cell in enumerate(row):
                if k == t:
                    continue
                try:
                    values.append(float(cell))
                except ValueError:
                    raise InputError(
                        f"{path}:{line}: column {header[k]!r} holds {cell!r}, not a number"
                    ) from None
            rows.append(values)
            labels.append(row[t].strip())
    if not rows:
        raise InputError(f"{path}: no data rows after the header")
    features = np.array(rows, dtype=np.float64)
    bad = np.argwhere(~np.isfinite(features))
    if len(bad):
        raise InputError(f"{path}: row {bad[0][0] + 1}, column {names[bad[0][1]]!r} is not finite")
    task, encoded = _encode_target(labels, path)
    ids = [f"row-{k}" for k in range(len(rows))]
    return make_table(features, encoded, task, names), ids


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

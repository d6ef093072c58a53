"""Per-process caches of what tasks open: datasets here, models in `workers.tasks.extract`.

Keyed by the specs' JSON, so a worker opens each dataset (and loads each model) once and no task
closes over data or weights. One lock guards both caches: two threads that miss at once open a
dataset (or load a model) once.
"""

from __future__ import annotations

import threading

from storage.fingerprint import canonical_json
from workers.inputs import Dataset, DatasetSpec, open_dataset

CACHE_LOCK = threading.Lock()
_DATASETS: dict[str, Dataset] = {}


def cached_dataset(spec: DatasetSpec) -> Dataset:
    """The dataset `spec` opens, opened once per process."""
    key = canonical_json(spec.to_dict())
    with CACHE_LOCK:
        if key not in _DATASETS:
            _DATASETS[key] = open_dataset(spec)
        return _DATASETS[key]


def forget_dataset(spec: DatasetSpec) -> None:
    """Drop `spec`'s cached dataset (its files changed): the next `cached_dataset` reopens it."""
    with CACHE_LOCK:
        _DATASETS.pop(canonical_json(spec.to_dict()), None)

"""Reads that see one layout of a store's results, or say that they could not.

A reader lists and opens a store, then reads its chunks, possibly minutes later. A `sweep run`
that compacts a model meanwhile (`storage.compaction.results`) switches each result array's
metadata, writes the compaction marker and deletes the per-shard chunks; one that expands a
model does the reverse. A reader that opened an array before the switch and reads its chunks
after the deletion gets zarr's fill values for them: a model that reads as untested. Every such
deletion comes after its array's metadata document was rewritten, so a reader that finds the
documents and the markers as they were when it began has read one layout or the other
(docs/storage.md); otherwise it reads again (`read_consistently`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TypeVar

from storage.integrity import compact_marker
from storage.layout import RESULT_VARS, RESULTS_GROUP
from storage.lease import StoreBusyError
from storage.location import ObjectInfo, StoreLike, locate

T = TypeVar("T")
ATTEMPTS = 3


def layout_state(store: StoreLike) -> dict[str, ObjectInfo | None]:
    """Size and version of what says where each model's results are: every result array's
    metadata document and every compaction marker (a look-up each, done concurrently on an
    object store; the models from the root's attributes, none if it does not read)."""
    location = locate(store)
    try:
        models = json.loads(location.read("zarr.json") or b"{}")["attributes"]["models"]
    except (ValueError, KeyError, TypeError):
        models = []
    keys = [key for model in models if isinstance(model, str)
            for key in (compact_marker(model), *(f"{model}/{RESULTS_GROUP}/{var}/zarr.json"
                                                  for var in RESULT_VARS))]
    return location.infos(keys)


def read_consistently(store: StoreLike, read: Callable[[], T], *,
                      attempts: int = ATTEMPTS) -> T:
    """`read()` (which reads `store`), again while the store's layout (`layout_state`) changed
    during it: an error raised while it changed is taken for the change's doing and the read
    repeated too. StoreBusyError (one line) after `attempts` reads that each saw it change."""
    for _ in range(attempts):
        before = layout_state(store)
        try:
            out = read()
        except Exception:
            if layout_state(store) == before:
                raise
            continue
        if layout_state(store) == before:
            return out
    raise StoreBusyError(
        f"store {locate(store)}: its results changed layout while they were read, {attempts} "
        f"times (a sweep run compacting or expanding a model); rerun once that run is done")

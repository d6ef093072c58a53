"""The device kind a model's attention was extracted on, pinned in the store by its first shard.

`device: auto` is resolved by each worker (`cuda` where it sees a GPU, else `cpu`), and the two
kinds give attention that differs in its last float bits, so the fingerprint (which holds the
setting, not what it resolved to) cannot tell them apart. The first extraction of a model writes
its resolved kind to `.sweep/device/<model>` with a create-if-absent write; every later one
(another worker, a resume on another machine) must resolve to the same kind or fails with one
line (exit 3). A model group created anew forgets its pin (`forget_device`).
"""

from __future__ import annotations

from storage.errors import EnvironmentFault
from storage.layout import BOOKKEEPING_DIR
from storage.location import StoreLike, locate


def device_key(model: str) -> str:
    """The pin's key relative to the store's root."""
    return f"{BOOKKEEPING_DIR}/device/{model}"


def pinned_device(store: StoreLike, model: str) -> str | None:
    """The kind model `model`'s stored shards were extracted on; None before its first shard."""
    data = locate(store).read(device_key(model))
    return None if data is None else data.decode().strip()


def pin_device(store: StoreLike, model: str, kind: str, setting: str) -> None:
    """Pin `kind` (`cpu`, `cuda`, `mps`) for `model` if nothing is pinned yet; EnvironmentFault
    naming both kinds if its shards were extracted on another (`setting`: the config's value)."""
    location = locate(store)
    if location.create(device_key(model), f"{kind}\n".encode()) is not None:
        return
    pinned = pinned_device(store, model)
    if pinned is not None and pinned != kind:  # None: forgotten since (its group re-planned)
        raise EnvironmentFault(
            f"model {model!r}: its stored shards were extracted on {pinned}, but device: "
            f"{setting} resolves to {kind} on this worker (attention would differ in its last "
            f"bits); run its extraction where {pinned} is available, or sweep into a new store"
        )


def forget_device(store: StoreLike, model: str) -> None:
    """Drop the pin of a model whose group was (re)created: none of its shards exist yet."""
    locate(store).delete(device_key(model))

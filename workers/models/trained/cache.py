"""The checkpoint cache of the models trained here: names, safetensors files, training records.

A cache is a folder or a URL (`storage.location`). A training run of spec S on table T keeps:
`<family>-<digest>.safetensors` (the kept weights, "best"), `<family>-<digest>.json` (its
training record) and `<family>-<digest>.epoch-<k>.safetensors` (the weights after epoch k, for
each epoch the spec keeps). The digest covers what determines training: the spec less its
measurement-only options and its `heads`, the table's content and the torch thread count
training runs on (`workers.models.determinism`). The record is written before the kept weights,
so kept weights that exist have their record.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import torch
from safetensors.torch import load, save

from storage.errors import StoreDamagedError
from storage.location import Location, StoreLike, StoreRef
from workers.inputs import Table
from workers.models.determinism import TORCH_THREADS
from workers.models.registry import ModelSpec

State = dict[str, torch.Tensor]


def checkpoint_key(spec: ModelSpec, table: Table, trained_options: dict[str, Any]) -> str:
    """The kept weights' name in the cache (the record and the epochs share its stem):
    `trained_options` are the spec's options that determine training."""
    trained = {**spec.to_dict(), "config": trained_options}
    trained.pop("heads", None)  # averaged or kept per head, the weights are the same
    key = json.dumps({"spec": trained, "table": table.fingerprint, "torch_threads": TORCH_THREADS},
                     sort_keys=True)
    return f"{spec.family}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.safetensors"


def in_cache(cache: StoreLike, key: str) -> str:
    """Where `key` lives: a path or a URL in `cache`."""
    return f"{str(StoreRef.of(cache)).rstrip('/')}/{key}"


def epoch_key(key: str, epoch: int) -> str:
    """The name of the weights after `epoch` of the training whose kept weights are `key`."""
    return key.removesuffix(".safetensors") + f".epoch-{epoch}.safetensors"


def record_key(key: str) -> str:
    """The name of the training record beside the kept weights `key`."""
    return key.removesuffix(".safetensors") + ".json"


def weights_bytes(state: State, table: Table) -> bytes:
    """Weights as cached: safetensors, with the table's fingerprint."""
    return save({k: v.contiguous() for k, v in state.items()},
                metadata={"table": table.fingerprint})


def read_weights(location: Location, key: str, also: str = "") -> State | None:
    """Cached weights `key`, None when absent; StoreDamagedError when they do not load (`also`:
    what else to delete with them, for the message)."""
    data = location.read(key)
    if data is None:
        return None
    try:
        return load(data)
    except Exception as error:  # noqa: BLE001 - safetensors raises its own error types
        raise StoreDamagedError(f"cached checkpoint {str(location).rstrip('/')}/{key} is "
                                f"truncated or corrupt ({type(error).__name__}); delete it "
                                f"{also}to train it again") from None


def read_record(location: Location, key: str) -> dict[str, Any] | None:
    """The training record beside the kept weights `key`, None when absent; StoreDamagedError
    when it is not JSON."""
    data = location.read(record_key(key))
    if data is None:
        return None
    try:
        return json.loads(data)
    except ValueError:
        raise StoreDamagedError(f"training record {str(location).rstrip('/')}/{record_key(key)} "
                                f"is not JSON; delete it to train again") from None


def write_run(location: Location, key: str, table: Table, best: State,
              record: dict[str, Any]) -> None:
    """A finished training run into the cache (its kept epochs are written as it reaches them:
    `workers.models.trained.run`): its record, then its kept weights."""
    location.write(record_key(key), json.dumps(record, indent=2, sort_keys=True).encode())
    location.write(key, weights_bytes(best, table))

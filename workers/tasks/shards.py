"""What both sides of a shard's tasks share: its chunk files, and the one line for an input
longer than its model's group was sized for."""

from __future__ import annotations

from collections.abc import Mapping

import zarr

from storage.errors import InputError
from storage.integrity import chunk_files


def shard_chunks(owner: zarr.Group | Mapping[str, zarr.Array], names: tuple[str, ...],
                 shard: int, start: int, stop: int) -> list[str]:
    """Chunk files of one shard: per-shard chunks of `names`, one attention chunk per input.
    `owner`: the group holding the arrays, or the arrays already open, by name."""
    files = []
    for name in names:
        array = owner[name]
        if name == "attention":
            coords = [(i,) + (0,) * (array.ndim - 1) for i in range(start, stop)]
        else:
            coords = [(shard,) + (0,) * (array.ndim - 1)]
        files += chunk_files(array, coords)
    return files


def attention_chunks(group: zarr.Group, inputs: tuple[int, ...]) -> dict[int, str]:
    """Input index -> key of its attention chunk (one chunk per input)."""
    array = group["attention"]
    return {i: chunk_files(array, [(i,) + (0,) * (array.ndim - 1)])[0] for i in inputs}


def too_many_tokens(model: str, input_id: str, tokens: int, t_max: int, store: object,
                    more: int = 0) -> InputError:
    """The one line for an input that needs more tokens than its model's group was sized for
    (`t_max`, fixed when the group was created): an input edited since, under the same id.
    `more`: how many other inputs are too long as well."""
    others = f" (and {more} more input{'s' if more > 1 else ''})" if more else ""
    return InputError(
        f"model {model!r} input {input_id!r}{others}: {tokens} tokens, more than the {t_max} "
        f"(t_max) its group in store {store} was sized for when it was first planned; restore "
        f"the input, or sweep into a new store, or delete the group {model!r} from the store "
        f"and rerun to size it again")

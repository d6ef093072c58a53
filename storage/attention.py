"""Which inputs keep their attention in the store, and dropping the rest (`attention:` policy).

A policy is `keep` (every input's attention stays: the default), `drop` (a shard's attention
chunks are deleted once its test results and done marker are written) or `sample` (a fixed,
seeded sample of N inputs per model keeps its attention; the rest is dropped). The sample ranks a
model's inputs by a keyed hash of (seed, model, input id) and keeps the N smallest: the same
inputs on every rerun and every `shard_size`.

What was dropped is recorded beside the shard's extraction marker, in
`.sweep/markers/<model>/extract-<shard>.dropped` (`{"inputs": [input index, ...]}`), written
before the extraction marker stops vouching for those chunks and before they are deleted, so a
run killed at any point leaves a record that covers what is gone. A rerun extraction deletes the
record (its new marker vouches for every chunk again).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from storage.errors import InputError
from storage.integrity import MARKERS, parse_marker
from storage.location import StoreLike, locate
from storage.markers import mark_done, marker_key, marker_name

KEEP, DROP, SAMPLE = "keep", "drop", "sample"
DROPPED = ".dropped"
EXTRACT_STAGE = "extract"


@dataclass(frozen=True)
class AttentionPolicy:
    """`keep`, `drop`, or `sample` of `n` inputs per model drawn with `seed`."""

    mode: str = KEEP
    n: int = 0
    seed: int = 0

    @classmethod
    def parse(cls, value: Any) -> AttentionPolicy:
        """`keep`, `drop`, `{sample: N}` or `{sample: N, seed: S}` (or a policy) as a policy;
        ValueError naming the accepted forms otherwise."""
        if isinstance(value, AttentionPolicy):
            return value
        if value in (KEEP, DROP):
            return cls(value)
        if isinstance(value, Mapping) and set(value) <= {SAMPLE, "seed"} and SAMPLE in value:
            n, seed = value[SAMPLE], value.get("seed", 0)
            if isinstance(n, int) and not isinstance(n, bool) and n >= 0 \
                    and isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0:
                return cls(SAMPLE, n, seed)
        raise ValueError(f"{value!r}: choose keep, drop or {{sample: N, seed: S}} "
                         f"(N, S non-negative integers)")

    def to_json(self) -> str | dict[str, int]:
        """The policy as it is written in a config."""
        return {SAMPLE: self.n, "seed": self.seed} if self.mode == SAMPLE else self.mode

    def __str__(self) -> str:
        return f"sample {self.n} (seed {self.seed})" if self.mode == SAMPLE else self.mode

    def kept(self, model: str, input_ids: Sequence[str]) -> frozenset[int]:
        """Indices of the inputs whose attention this policy keeps."""
        if self.mode == KEEP:
            return frozenset(range(len(input_ids)))
        if self.mode == DROP:
            return frozenset()
        return sampled_inputs(model, input_ids, self.n, self.seed)


def sample_key(seed: int, model: str, input_id: str) -> bytes:
    """The rank of an input in model `model`'s sample with `seed`: a keyed BLAKE2b digest."""
    key = seed.to_bytes(8, "little")
    return hashlib.blake2b(f"{model}\0{input_id}".encode(), key=key, digest_size=16).digest()


def sampled_inputs(model: str, input_ids: Sequence[str], n: int, seed: int) -> frozenset[int]:
    """Indices of the `n` inputs with the smallest `sample_key` (all of them if fewer)."""
    ranked = sorted(range(len(input_ids)), key=lambda i: (sample_key(seed, model,
                                                                     input_ids[i]), i))
    return frozenset(ranked[:n])


def dropped_key(model: str, shard: int) -> str:
    """The key of a shard's record of dropped attention, relative to the store's root."""
    return marker_key(model, marker_name(EXTRACT_STAGE, shard), DROPPED)


def read_dropped(store: StoreLike, model: str, shard: int) -> frozenset[int]:
    """Input indices of the shard whose attention was dropped (empty without a record)."""
    data = locate(store).read(dropped_key(model, shard))
    return frozenset() if data is None else _parse(data, dropped_key(model, shard))


def _parse(data: bytes, key: str) -> frozenset[int]:
    try:
        return frozenset(int(i) for i in json.loads(data.decode())["inputs"])
    except (ValueError, KeyError, TypeError):
        raise InputError(f"{key}: unreadable record of dropped attention; delete it and "
                         f"rerun with --reextract-attention") from None


def dropped_by_shard(store: StoreLike, model: str | None = None
                     ) -> dict[tuple[str, int], frozenset[int]]:
    """Every record of dropped attention of the store (of `model` only, if given): (model,
    shard) -> input indices, from one listing."""
    location = locate(store)
    prefix = MARKERS + (f"{model}/" if model else "")
    keys = [key for key in location.listing(prefix) if key.endswith(DROPPED)]
    out = {}
    for key, data in location.read_many(keys).items():
        if data is None:
            continue
        scope, name = key[len(MARKERS):-len(DROPPED)].rsplit("/", 1)
        out[(scope, int(name.rsplit("-", 1)[1]))] = _parse(data, key)
    return out


def clear_dropped(store: StoreLike, model: str, shard: int) -> None:
    """Forget the shard's dropped attention (its extraction has just rewritten all of it)."""
    locate(store).delete(dropped_key(model, shard))


def drop_attention(store: StoreLike, model: str, shard: int,
                   chunks: Mapping[int, str]) -> None:
    """Delete the attention chunks `chunks` (input index -> chunk key) of a tested shard:
    first record them as dropped, then rewrite the extraction marker without them, then delete
    them. Idempotent: a run killed part-way is finished by calling it again."""
    if not chunks:
        return
    location = locate(store)
    record = dropped_key(model, shard)
    already = read_dropped(location, model, shard)
    inputs = sorted(already | set(chunks))
    if set(inputs) != already:
        location.write(record, json.dumps({"inputs": inputs}).encode() + b"\n")
    name = marker_name(EXTRACT_STAGE, shard)
    key = marker_key(model, name)
    data = location.read(key)
    vouched = None if data is None else parse_marker(data, key)
    if vouched is not None and any(c in vouched for c in chunks.values()):
        mark_done(location, model, name,
                  {k: v for k, v in vouched.items() if k not in set(chunks.values())})
    for chunk in chunks.values():
        location.delete(chunk)


def held_inputs(done_shards: Iterable[tuple[int, int, int]],
                dropped: Mapping[int, frozenset[int]]) -> int:
    """How many inputs still have attention: those of extracted shards (shard, start, stop)
    less those dropped (shard -> input indices)."""
    return sum(stop - start - len(dropped.get(shard, ())) for shard, start, stop in done_shards)


def check_not_dropped(store: StoreLike, model: str, attrs: Mapping[str, Any], index: int,
                      input_id: str) -> None:
    """InputError naming the model's `attention:` policy if input `index` (id `input_id`) had
    its attention dropped (its chunk is gone: zarr would read zeros); `attrs`: the model
    group's attributes."""
    if index in read_dropped(store, model, index // int(attrs["shard_size"])):
        policy = AttentionPolicy.parse(attrs.get("attention", KEEP))
        raise InputError(
            f"store {store}: the attention of model {model!r} input {input_id!r} was dropped "
            f"(attention: {policy}); `sweep extract` recomputes it without a store, or rerun "
            f"the sweep with a policy that keeps it and --reextract-attention")


def stored_attention(store: StoreLike, model: str, input_id: str) -> np.ndarray:
    """One input's stored attention (layer, head, query, key), cropped to its tokens, for
    figures and re-analysis; InputError naming the model's `attention:` policy when it was
    dropped, or when its shard was never extracted."""
    from storage.store import open_model, read_attention

    group = open_model(store, model)
    ids = [str(i) for i in group["input_id"][:]]
    if input_id not in ids:
        raise InputError(f"store {store}: model {model!r} has no input {input_id!r}")
    i = ids.index(input_id)
    check_not_dropped(store, model, group.attrs, i, input_id)
    t = int(group["n_tokens"][i])
    if t == 0:
        raise InputError(f"store {store}: model {model!r} input {input_id!r} is not extracted "
                         f"yet; run `sweep run` first")
    attention = read_attention(group["attention"], i, i + 1)[0]
    return np.ascontiguousarray(attention[..., :t, :t])

"""The GPU pool's bodies: preparation (training) and extraction. Imports torch and the model
families (`workers.models.extraction`); the CPU pool's bodies (`verdicts`, `nulls`) never import
this module.

Models are cached per worker process (keyed by the specs' JSON), so a worker loads each model
once and no task closes over weights.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

import numpy as np

from storage.attention import clear_dropped
from storage.device_pin import pin_device
from storage.errors import ExtractionError, InputError
from storage.fingerprint import canonical_json
from storage.integrity import checksums, written_by
from storage.layout import DEVICE_ROLLOUT
from storage.markers import mark_done
from storage.store import (
    open_model,
    write_attention,
    write_device_rollout,
    write_input_digest,
    write_tokens,
    write_training_record,
)
from workers.exact.device_rollout import restricted_rollout_kappa
from workers.exact.readings import READING_EVALUATORS
from workers.exact.token_kinds import TokenKind, keep_mask
from workers.inputs import Dataset
from workers.inputs.digests import input_digests
from workers.models.extraction import Extractor, load_extractor, model_dataset, prepare_model
from workers.models.registry import trained_here
from workers.tasks.cache import CACHE_LOCK, cached_dataset, forget_dataset
from workers.tasks.shards import shard_chunks, too_many_tokens

if TYPE_CHECKING:
    from workers.task_specs import ExtractTask, PrepareTask

MAX_CACHED_MODELS = 2  # per worker process; the least recently used one is dropped first
# An OrderedDict, not functools.lru_cache: the load runs under CACHE_LOCK, so two threads that
# miss at once load a model once (lru_cache would load it twice), and each model keeps its lock.
_EXTRACTORS: OrderedDict[str, tuple[Extractor, threading.Lock]] = OrderedDict()


def cached_extractor(task: ExtractTask) -> tuple[Extractor, threading.Lock]:
    """The task's extractor, loaded once per process (keyed by model, dataset, device, dtype),
    with the lock that serialises its use: its hooks capture whatever forward pass runs."""
    key = canonical_json([task.spec.to_dict(), task.dataset.to_dict(), task.device, task.dtype,
                          str(task.cache_dir)])
    dataset = cached_dataset(task.dataset)
    with CACHE_LOCK:
        if key not in _EXTRACTORS:
            while len(_EXTRACTORS) >= MAX_CACHED_MODELS:
                _EXTRACTORS.popitem(last=False)
            extractor = load_extractor(task.spec, dataset=dataset, cache_dir=task.cache_dir,
                                       device=task.device, dtype=task.dtype)
            _EXTRACTORS[key] = (extractor, threading.Lock())
        _EXTRACTORS.move_to_end(key)
        return _EXTRACTORS[key]


def fresh_digests(task: ExtractTask) -> tuple[Dataset, tuple[str, ...]]:
    """The task's dataset and its shard's digests, equal to the ones the driver planned with:
    a cached dataset that predates an edit is reopened once; InputError if the inputs changed
    after the driver looked (edited during the run)."""
    whole_table = trained_here(task.spec)
    dataset = model_dataset(task.spec, cached_dataset(task.dataset))
    digests = input_digests(dataset, range(task.start, task.stop), whole_table=whole_table)
    if task.digests and digests != task.digests:
        forget_dataset(task.dataset)
        dataset = model_dataset(task.spec, cached_dataset(task.dataset))
        digests = input_digests(dataset, range(task.start, task.stop), whole_table=whole_table)
        if digests != task.digests:
            first = next(i for i, (a, b) in enumerate(zip(digests, task.digests, strict=True))
                         if a != b)
            raise InputError(
                f"dataset {task.dataset.path or task.dataset.source!r}: input "
                f"{dataset.ids[task.start + first]!r} changed while the sweep ran; rerun"
            )
    return dataset, digests


def run_prepare(task: PrepareTask) -> int:
    """Prepare (train) the model, keep its training record in the store if it returns one, then
    the marker. Holds the process's model lock throughout: torch's global RNG, which seeded
    training and seeded model builds draw from, is shared by every thread of a worker."""
    dataset = cached_dataset(task.dataset)
    with CACHE_LOCK:
        record = prepare_model(task.spec, dataset, task.cache_dir)
    if record is not None:
        write_training_record(task.store, task.model, record)
    mark_done(task.store, task.scope, task.marker)
    return 1


def run_extract(task: ExtractTask) -> int:
    """Extract the shard's inputs, write attention (every head the store keeps: one
    head-averaged map, or each head's), n_tokens, token kinds and input digests, then the marker
    (with the checksums of those chunks)."""
    group = open_model(task.store, task.model, mode="r+")
    n_layers, t_max = group.attrs["n_layers"], group.attrs["t_max"]
    n_heads = group.attrs.get("n_heads", 1)  # 1: head-averaged (or written before heads)
    dataset, digests = fresh_digests(task)
    ids = dataset.ids[task.start:task.stop]
    stored = [str(i) for i in group["input_id"][task.start:task.stop]]
    if stored != list(ids):
        raise InputError(
            f"model {task.model!r} shard {task.shard}: the dataset's input ids differ from the "
            f"store's (the dataset changed); restore it or use a new store"
        )
    extractor, in_use = cached_extractor(task)
    pin_device(task.store, task.model, extractor.device.type, task.device)
    n = task.stop - task.start
    n_tokens = np.zeros(n, dtype=np.int32)  # (input,)
    token_kind = np.full((n, t_max), TokenKind.PAD, dtype=np.int8)  # (input, token)
    token_sets = tuple(group.attrs["token_sets"])
    device_kappa = np.full((n, n_layers, n_heads, len(token_sets)), np.nan)
    for first in range(task.start, task.stop, task.batch_size):
        last = min(first + task.batch_size, task.stop)
        items = dataset.load(range(first, last))
        with in_use:
            outs = extractor.extract(items, ids[first - task.start:last - task.start])
        attention = np.zeros((last - first, n_layers, n_heads, t_max, t_max),
                             np.float32)  # (b, L, H, q, k)
        for offset, out in enumerate(outs):
            row = first - task.start + offset
            per_head = out.by_head  # (layer, head, T, T)
            layers, heads, tokens = per_head.shape[0], per_head.shape[1], per_head.shape[-1]
            if tokens > t_max and (layers, heads) == (n_layers, n_heads) \
                    and out.input_id == ids[row]:
                raise too_many_tokens(task.model, ids[row], tokens, t_max, task.store)
            if (layers, heads) != (n_layers, n_heads) or tokens > t_max \
                    or out.input_id != ids[row]:
                raise ExtractionError(
                    f"model {task.model!r} input {ids[row]!r}: got {out.input_id!r} with "
                    f"{layers} layers x {heads} heads x {tokens} tokens, the store expects "
                    f"{n_layers} layers x {n_heads} heads x <= {t_max} tokens"
                )
            attention[offset, :, :, :tokens, :tokens] = per_head
            n_tokens[row] = tokens
            token_kind[row, :tokens] = out.token_kind
        write_attention(group, first, attention)
        if task.device_rollout != "off":
            rows = slice(first - task.start, last - task.start)
            device_kappa[rows] = rollout_on_device(
                attention, n_tokens[rows], token_kind[rows], token_sets, task.device_rollout,
                str(extractor.device))
    write_tokens(group, task.start, n_tokens, token_kind)
    names = ("attention", "n_tokens", "token_kind")
    if task.device_rollout != "off":
        write_device_rollout(group, task.start, device_kappa)
        names += (DEVICE_ROLLOUT,)
    if "input_digest" in group:
        write_input_digest(group, task.start, digests)
        names += ("input_digest",)
    files = shard_chunks(group, names, task.shard, task.start, task.stop)
    sums = checksums(task.store, files, written_by(group))
    clear_dropped(task.store, task.model, task.shard)  # every input's attention is back
    mark_done(task.store, task.scope, task.marker, sums)
    return n


def rollout_on_device(attention: np.ndarray, n_tokens: np.ndarray, token_kind: np.ndarray,
                      token_sets: tuple[str, ...], rollout_mode: str, device: str) -> np.ndarray:
    """The rollout kappa (input, layer, head, token_set) that `evaluate_input` would compute for
    a batch's padded attention (input, layer, head, query, key), computed with the restriction
    on torch `device` (`workers.exact.device_rollout`); NaN where the test stage computes none
    here (the readings compute their own, a set of fewer than two tokens, layers from the first
    one with a kept row without mass, `off`)."""
    n, _, n_heads = attention.shape[:3]
    out = np.full(attention.shape[:3] + (len(token_sets),), np.nan)
    if rollout_mode == "off":
        return out
    for i in range(n):
        t = int(n_tokens[i])
        for s, token_set in enumerate(token_sets):
            keep = keep_mask(token_kind[i, :t], token_set)
            if token_set in READING_EVALUATORS or keep.sum() < 2:
                continue
            for h in range(n_heads):
                out[i, :, h, s] = restricted_rollout_kappa(attention[i, :, h, :t, :t], keep,
                                                           device, rollout_mode)
    return out

"""The GPU pool's bodies: preparation (training) and extraction. Imports torch and the model
families (`workers.models.extraction`); the CPU pool's bodies (`verdicts`, `nulls`) never import
this module.

Models are cached per worker process (keyed by the specs' JSON), so a worker loads each model
once and no task closes over weights.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from storage.attention import clear_dropped
from storage.device_pin import pin_device
from storage.errors import ExtractionError, InputError
from storage.fingerprint import canonical_json
from storage.integrity import checksums, written_by
from storage.layout import DEVICE_ROLLOUT
from storage.markers import clear_progress, mark_done, progress_writer
from storage.store import (
    make_attention_folders,
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
from workers.models.determinism import TORCH_THREADS, fixed_torch
from workers.models.extraction import (
    Batch,
    Extractor,
    join_batches,
    load_extractor,
    model_dataset,
    prepare_model,
    row_views,
)
from workers.models.registry import trained_here
from workers.tasks.buffers import ChunkBuffers, Filled, chunk_buffers
from workers.tasks.cache import CACHE_LOCK, cached_dataset, forget_dataset
from workers.tasks.pipeline import Mapper, run_batches
from workers.tasks.shards import shard_chunks, too_many_tokens
from workers.tasks.threads import task_cores

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
    """Prepare (train) the model, its progress in the store as it trains (`storage.markers`),
    keep its training record in the store if it returns one, then the marker. Holds the
    process's model lock throughout: torch's global RNG, which seeded training and seeded model
    builds draw from, is shared by every thread of a worker."""
    dataset = cached_dataset(task.dataset)
    with CACHE_LOCK:
        record = prepare_model(task.spec, dataset, task.cache_dir,
                               report=progress_writer(task.store, task.model))
    if record is not None:
        write_training_record(task.store, task.model, record)
    mark_done(task.store, task.scope, task.marker)
    if record is not None:
        clear_progress(task.store, task.model)
    return 1


def run_extract(task: ExtractTask) -> int:
    """Extract the shard's inputs, write attention (every head the store keeps: one
    head-averaged map, or each head's), n_tokens, token kinds and input digests, then the marker
    (with the checksums of those chunks). The batches go through `extract_batches`: read,
    decoded and preprocessed ahead, written behind the forward pass, on the worker's cores."""
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
    if extractor.n_layers != n_layers or (extractor.spec.heads != "each" and n_heads != 1):
        raise ExtractionError(
            f"model {task.model!r} input {ids[0]!r}: the model has {extractor.n_layers} layers "
            f"({extractor.spec.heads} heads), the store expects {n_layers} layers x {n_heads} "
            f"heads x <= {t_max} tokens")
    shard = Shard(task, group, dataset, list(ids), (n_layers, n_heads, t_max))
    names = ("attention", "n_tokens", "token_kind")
    names += (DEVICE_ROLLOUT,) if task.device_rollout != "off" else ()
    names += ("input_digest",) if "input_digest" in group else ()

    def side_arrays() -> None:  # every forward pass done: written while the last chunks are
        write_tokens(group, task.start, shard.n_tokens, shard.token_kind)
        if DEVICE_ROLLOUT in names:
            write_device_rollout(group, task.start, shard.device_kappa)
        if "input_digest" in names:
            write_input_digest(group, task.start, digests)

    with in_use:
        extract_batches(shard, extractor, task_cores(), tail=side_arrays)
    files = shard_chunks(group, names, task.shard, task.start, task.stop)
    sums = checksums(task.store, files, written_by(group))
    clear_dropped(task.store, task.model, task.shard)  # every input's attention is back
    mark_done(task.store, task.scope, task.marker, sums)
    return shard.size


class Shard:
    """One extraction task's shard: where it writes (the model group) and what it fills in for
    the store besides the attention (token counts and kinds, the device rollout's kappa)."""

    def __init__(self, task: ExtractTask, group: Any, dataset: Dataset, ids: list[str],
                 shape: tuple[int, int, int]) -> None:
        self.task, self.group, self.dataset, self.ids = task, group, dataset, ids
        self.n_layers, self.n_heads, self.t_max = shape
        self.size = task.stop - task.start
        self.firsts = range(task.start, task.stop, task.batch_size)
        self.n_tokens = np.zeros(self.size, dtype=np.int32)  # (input,)
        self.token_kind = np.full((self.size, self.t_max), TokenKind.PAD,
                                  dtype=np.int8)  # (input, token)
        self.token_sets = tuple(group.attrs["token_sets"])
        self.device_kappa = np.full((self.size, self.n_layers, self.n_heads,
                                     len(self.token_sets)), np.nan)

    def rows(self, k: int) -> slice:
        """Batch k's inputs, as rows of the shard."""
        first = self.firsts[k] - self.task.start
        return slice(first, min(first + self.task.batch_size, self.size))


def extract_batches(shard: Shard, extractor: Extractor, cores: int,
                    tail: Callable[[], None] | None = None) -> None:
    """Every batch of the shard through `workers.tasks.pipeline.run_batches`: load (read,
    decode, preprocess: in parts on the worker's cores where the family prepares inputs alone),
    run (the forward pass into the chunk buffers, token kinds, the device rollout), write (the
    chunks, after checking every value is finite; their folders made ahead, on the loader's
    thread: `make_attention_folders`). The forward pass and the rollout run on this
    thread, all of it under `fixed_torch(TORCH_THREADS)`: the same bits on any core count.
    `tail()`: after the last forward pass, on this thread, while the last batch is written."""
    task, batch_size = shard.task, shard.task.batch_size
    with chunk_buffers(task.model, (shard.n_layers, shard.n_heads, shard.t_max, shard.t_max),
                       min(batch_size, shard.size), extractor.spec.heads == "each",
                       extractor.device, count=2 if cores > 1 else 1) as buffers:
        _extract_batches(shard, extractor, cores, buffers, tail)


def _extract_batches(shard: Shard, extractor: Extractor, cores: int,
                     buffers: ChunkBuffers, tail: Callable[[], None] | None) -> None:
    task = shard.task
    stop = threading.Event()

    def part(indices: range, out: dict[str, torch.Tensor] | None = None) -> Batch:
        with fixed_torch(TORCH_THREADS):
            return extractor.prepare_into(extractor.read(shard.dataset, indices), out)

    def load(k: int, parts: Mapper) -> Batch:
        rows = shard.rows(k)
        first, last = task.start + rows.start, task.start + rows.stop
        with fixed_torch(TORCH_THREADS):
            if cores <= 1 or not extractor.independent_inputs:
                return part(range(first, last))
            step = -(-(last - first) // cores)
            reused = buffers.inputs.get(k % 2)  # batch k-2's: each part prepared into its rows
            batch = join_batches(
                parts(lambda r: part(r, row_views(reused, range(r.start - first, r.stop - first))),
                      [range(a, min(a + step, last)) for a in range(first, last, step)]),
                out=reused)
            buffers.inputs[k % 2] = whole_inputs(batch, reused)
            return batch

    def run(k: int, batch: Batch) -> Filled:
        rows = shard.rows(k)
        for offset, (positions, kinds) in enumerate(zip(batch.positions, batch.token_kinds,
                                                        strict=True)):
            row, tokens = rows.start + offset, len(positions)
            if tokens > shard.t_max:
                raise too_many_tokens(task.model, shard.ids[row], tokens, shard.t_max,
                                      task.store)
            shard.n_tokens[row] = tokens
            shard.token_kind[row, :tokens] = kinds
        sink = buffers.sink(k)
        extractor.extract_into(batch, shard.ids[rows], sink)
        if task.device_rollout != "off":
            shard.device_kappa[rows] = rollout_on_device(
                sink.chunk[:len(batch.positions)], shard.n_tokens[rows],
                shard.token_kind[rows], shard.token_sets, task.device_rollout,
                str(extractor.device))
        return buffers.filled(k, len(batch.positions))

    def write(k: int, filled: Filled, parts: Mapper) -> None:
        rows = shard.rows(k)
        attention = filled.ready()  # (b, L, H, t_max, t_max)
        ids = shard.ids[rows]
        parts(lambda b: check_finite(task.model, attention[b:b + 1], ids[b:b + 1]),
              range(len(attention)))  # every input checked before any is written
        step = max(1, WRITE_BLOCK_BYTES // max(attention[0].nbytes, 1))
        for a in range(0, len(attention), step):
            if stop.is_set():  # Ctrl-C: the task is failing, its marker never written
                return
            write_attention(shard.group, task.start + rows.start + a, attention[a:a + step],
                            parts)

    def folders(k: int) -> None:  # batch k's chunk folders, made beside the forward passes
        rows = shard.rows(k)
        make_attention_folders(shard.group, task.start + rows.start, task.start + rows.stop)

    with fixed_torch(TORCH_THREADS):
        run_batches(len(shard.firsts), load, run, write, cores, stop, ahead=folders, tail=tail)


def whole_inputs(batch: Batch, reused: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
    """A batch's model inputs as a later batch may be prepared into them: where the batch lies
    in `reused`'s first rows, the whole of `reused` (a last, shorter batch keeps every row)."""
    reused = reused or {}
    return {name: reused[name] if name in reused and value.data_ptr() == reused[name].data_ptr()
            else value for name, value in batch.inputs.items() if isinstance(value, torch.Tensor)}


WRITE_BLOCK_BYTES = 64 << 20  # the writer checks for Ctrl-C between blocks of this much


def check_finite(model: str, attention: np.ndarray, ids: Sequence[str]) -> None:
    """ExtractionError naming the first input, layer and row with a non-finite value in a
    batch's padded attention (input, layer, head, query, key); the padding is zeros. One float32
    sum per input (a non-finite value makes it non-finite; finite probabilities cannot overflow
    it; torch's, at 0.65-0.73x numpy's CPU time here: benchmarks/chunk_write_bench.py), then
    the search where one is not finite."""
    for b, values in enumerate(attention):
        if torch.from_numpy(values).sum().isfinite():
            continue
        bad = np.argwhere(~np.isfinite(values))  # (layer, head, query, key)
        if len(bad):
            raise ExtractionError(
                f"model {model!r}, input {ids[b]!r}: non-finite attention at layer "
                f"{bad[0][0]}, row {bad[0][-2]}: try dtype float32"
            )


def rollout_on_device(attention: np.ndarray | torch.Tensor, n_tokens: np.ndarray,
                      token_kind: np.ndarray,
                      token_sets: tuple[str, ...], rollout_mode: str, device: str) -> np.ndarray:
    """The rollout kappa (input, layer, head, token_set) that `evaluate_input` would compute for
    a batch's padded attention (input, layer, head, query, key; numpy, or the extraction's
    buffer on its device), computed with the restriction
    on torch `device` (`workers.exact.device_rollout`); NaN where the test stage computes none
    here (the readings compute their own, a set of fewer than two tokens, layers from the first
    one with a kept row without mass, `off`)."""
    n, _, n_heads = attention.shape[:3]
    out = np.full((*attention.shape[:3], len(token_sets)), np.nan)
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

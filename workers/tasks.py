"""The bodies of the sweep's tasks: plain functions of a frozen task spec (no Dask in here).

Each reads what it needs, writes only the store chunks its task owns, then writes its completion
marker. Models and datasets are cached per worker process (module-level dicts keyed by the
specs' JSON), so a worker loads each model once and no task closes over weights.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import numba
import numpy as np
import zarr

from storage.attention import clear_dropped, drop_attention
from storage.device_pin import pin_device
from storage.errors import ExtractionError, InputError
from storage.fingerprint import canonical_json
from storage.integrity import checksums, chunk_files, written_by
from storage.layout import DEVICE_ROLLOUT, RESULT_VARS, RESULTS_GROUP, ResultStatus
from storage.markers import clear_progress, mark_done, progress_writer
from storage.store import (
    StoredAttention,
    open_model,
    write_attention,
    write_baseline,
    write_device_rollout,
    write_input_digest,
    write_matched_nulls,
    write_results,
    write_tokens,
    write_training_record,
)
from workers.exact.cells import fill_rollout, fill_verdicts
from workers.exact.device_rollout import restricted_rollout_kappa
from workers.exact.equality import ROLLOUT_MODES, ROW_SUM_TOL, check, restrict_layers
from workers.exact.readings import READING_EVALUATORS, attaining_kinds
from workers.exact.scratch import scratch
from workers.exact.token_kinds import TokenKind, keep_mask, special_mask
from workers.inputs import Dataset, DatasetSpec, open_dataset
from workers.inputs.digests import input_digests
from workers.models.extraction import Extractor, load_extractor, model_dataset, prepare_model
from workers.models.registry import trained_here
from workers.nulls.baseline import holding_in_blocks
from workers.nulls.matched import matched_holding, size_histograms

if TYPE_CHECKING:
    from workers.task_specs import BaselineTask, ExtractTask, NullTask, PrepareTask, TestTask

MAX_CACHED_MODELS = 2  # per worker process; the least recently used one is dropped first
# An OrderedDict, not functools.lru_cache: the load runs under _CACHE_LOCK, so two threads that
# miss at once load a model once (lru_cache would load it twice), and each model keeps its lock.
_DATASETS: dict[str, Dataset] = {}
_EXTRACTORS: OrderedDict[str, tuple[Extractor, threading.Lock]] = OrderedDict()
_CACHE_LOCK = threading.Lock()


def cached_dataset(spec: DatasetSpec) -> Dataset:
    """The dataset `spec` opens, opened once per process."""
    key = canonical_json(spec.to_dict())
    with _CACHE_LOCK:
        if key not in _DATASETS:
            _DATASETS[key] = open_dataset(spec)
        return _DATASETS[key]


def cached_extractor(task: ExtractTask) -> tuple[Extractor, threading.Lock]:
    """The task's extractor, loaded once per process (keyed by model, dataset, device, dtype),
    with the lock that serialises its use: its hooks capture whatever forward pass runs."""
    key = canonical_json([task.spec.to_dict(), task.dataset.to_dict(), task.device, task.dtype,
                          str(task.cache_dir)])
    dataset = cached_dataset(task.dataset)
    with _CACHE_LOCK:
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
        with _CACHE_LOCK:
            _DATASETS.pop(canonical_json(task.dataset.to_dict()), None)
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


def run_prepare(task: PrepareTask) -> int:
    """Prepare (train) the model, its progress in the store as it trains (`storage.markers`),
    keep its training record in the store if it returns one, then the marker. Holds the
    process's model lock throughout: torch's global RNG, which seeded training and seeded model
    builds draw from, is shared by every thread of a worker."""
    dataset = cached_dataset(task.dataset)
    with _CACHE_LOCK:
        record = prepare_model(task.spec, dataset, task.cache_dir,
                               report=progress_writer(task.store, task.model))
    if record is not None:
        write_training_record(task.store, task.model, record)
    mark_done(task.store, task.scope, task.marker)
    if record is not None:
        clear_progress(task.store, task.model)
    return 1


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


def evaluate_input(attention: np.ndarray, token_kind: np.ndarray, token_set: str,
                   tol: float, rollout_mode: str = "every",
                   row_sum_tol: float = ROW_SUM_TOL,
                   device_kappa: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Every result variable, per layer, for one input's (L, T, T) attention and one token set.

    A token set that keeps fewer than two tokens has no pair: status TOO_SMALL (none) or
    ONE_TOKEN (one), no verdict. The content readings `content-pairs` and `content-complement`
    are evaluated by `workers.exact.readings`; the others by restriction (rows renormalised).
    `rollout_mode` (one of ROLLOUT_MODES): the layers whose whole-rollout kappa and bound are
    computed (every layer up to the first failed one; the last layer only, if no layer failed;
    none); the rollout variables stay NaN elsewhere. `row_sum_tol`: how far a row may miss 1
    (`workers.exact.equality.row_sum_tolerance` of the extraction dtype). `device_kappa`: the
    rollout's kappa per layer from the extraction device (`rollout_on_device`), used instead of
    the products (restriction sets; the readings compute their own).
    """
    if rollout_mode not in ROLLOUT_MODES:
        raise InputError(f"rollout {rollout_mode!r}: choose one of {', '.join(ROLLOUT_MODES)}")
    n_layers = attention.shape[0]
    out = {name: np.full(n_layers, var.fill, dtype=var.dtype) for name, var in RESULT_VARS.items()}
    keep = keep_mask(token_kind, token_set)  # (T,)
    out["n_kept"][:] = keep.sum()
    if keep.sum() < 2:
        out["status"][:] = ResultStatus.ONE_TOKEN if keep.any() else ResultStatus.TOO_SMALL
        return out
    if token_set in READING_EVALUATORS:
        READING_EVALUATORS[token_set](attention, token_kind, tol, out, rollout_mode, row_sum_tol)
        return out
    m = int(keep.sum())
    stack, kept, ok = restrict_layers(attention, keep,  # (ok layers, m, m)
                                      out=scratch("restricted", (n_layers, m, m)),
                                      row_sum_tol=row_sum_tol)
    out["status"][:] = np.where(ok, ResultStatus.OK, ResultStatus.EMPTY_ROW)
    if not ok.any():
        return out
    result = check(stack, tol=tol, special=special_mask(token_kind)[kept], validate=False,
                   radius=True)
    fill_verdicts(out, result, ok, kept)
    out["attaining_kind"][ok] = attaining_kinds(stack, token_kind[kept], result.kappa,
                                                result.attaining_special, tol)
    fill_rollout(out, stack, result.bound, ok, rollout_mode, device_kappa)
    return out


def evaluate_shard(attention: np.ndarray | StoredAttention, n_tokens: np.ndarray,
                   token_kind: np.ndarray, token_sets: tuple[str, ...], tol: float,
                   rollout_mode: str = "every",
                   row_sum_tol: float = ROW_SUM_TOL,
                   device_kappa: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Result variables (input, layer, head, token_set) for a shard's padded attention (input,
    layer, head, query, key): each head's (layer, T, T) stack is tested on its own
    (`evaluate_input`). `device_kappa`: (input, layer, head, token_set) rollout kappa from the
    extraction device (`rollout_on_device`), instead of the CPU's products. `attention[i]` is
    read once per input: a `StoredAttention` reads the store one input at a time, so a test
    task holds one input's attention, not its shard's."""
    n, n_layers, n_heads = len(n_tokens), attention.shape[1], attention.shape[2]
    results = {name: np.full((n, n_layers, n_heads, len(token_sets)), var.fill, dtype=var.dtype)
               for name, var in RESULT_VARS.items()}
    for i in range(n):
        t = int(n_tokens[i])
        stack = attention[i]  # (layer, head, query, key), padded
        for h in range(n_heads):
            for s, token_set in enumerate(token_sets):
                cells = evaluate_input(
                    stack[:, h, :t, :t], token_kind[i, :t], token_set, tol, rollout_mode,
                    row_sum_tol, None if device_kappa is None else device_kappa[i, :, h, s])
                for name, values in cells.items():
                    results[name][i, :, h, s] = values
    return results


def shard_attention(group: zarr.Group, start: int, stop: int) -> StoredAttention:
    """Inputs start..stop's stored attention as a test task reads it: in blocks, into this
    thread's reused buffer (`workers.exact.scratch`)."""
    return StoredAttention(group, start, stop,
                           buffer=lambda shape: scratch("attention-block", shape, np.float32))


def run_test(task: TestTask) -> int:
    """Test the shard's attention (read back one input at a time) for every token set, write
    results + marker; then delete the attention of the inputs in `task.drop`
    (`storage.attention.drop_attention`)."""
    group = open_model(task.store, task.model, mode="r+")
    n_tokens = group["n_tokens"][task.start:task.stop]  # (input,)
    token_kind = group["token_kind"][task.start:task.stop]  # (input, token)
    attention = shard_attention(group, task.start, task.stop)  # (input, layer, head, q, k)
    device_kappa = group[DEVICE_ROLLOUT][task.start:task.stop] if task.device_rollout else None
    arrays = write_results(group, task.start, evaluate_shard(attention, n_tokens, token_kind,
                                                             task.token_sets, task.tol,
                                                             task.rollout, task.row_sum_tol,
                                                             device_kappa))
    files = shard_chunks(arrays, tuple(name for name in RESULT_VARS if name in arrays),
                         task.shard, task.start, task.stop)
    mark_done(task.store, task.scope, task.marker,
              checksums(task.store, files, written_by(group)))
    if task.drop:
        drop_attention(task.store, task.model, task.shard, attention_chunks(group, task.drop))
    return task.stop - task.start


def attention_chunks(group: zarr.Group, inputs: tuple[int, ...]) -> dict[int, str]:
    """Input index -> key of its attention chunk (one chunk per input)."""
    array = group["attention"]
    return {i: chunk_files(array, [(i,) + (0,) * (array.ndim - 1)])[0] for i in inputs}


def run_baseline(task: BaselineTask) -> int:
    """Count the holding matrices among the chunk's trials, write the count, then the marker."""
    holding, disagreements = holding_in_blocks(task.n, task.seed, task.blocks, tol=task.tol,
                                               null=task.null)
    trials = task.blocks.trial_count
    group = write_baseline(task.store, task.size_index, task.chunk, holding, trials,
                           disagreements, task.null_index)
    files = [f for name in ("holding", "trials", "disagreements")
             for f in chunk_files(group[name], [(task.null_index, task.size_index, task.chunk)])]
    mark_done(task.store, task.scope, task.marker,
              checksums(task.store, files, written_by(group)))
    return trials


def run_null(task: NullTask) -> int:
    """Draw the chunk's size-matched null trials for every token set of the model (sizes from
    its stored results), write the counts, then the marker."""
    group = open_model(task.store, task.model)
    results = group[RESULTS_GROUP]
    histograms = size_histograms(results["n_kept"][...], results["status"][...],
                                 group["n_tokens"][...], task.token_sets)
    counts = [
        matched_holding(histogram, task.blocks.trials, task.blocks, model=task.model,
                        token_set=token_set, null=task.null, seed=task.seed, tol=task.tol)
        for histogram, token_set in zip(histograms, task.token_sets, strict=True)
    ]
    group = write_matched_nulls(task.store, task.model, task.null_index, task.chunk, counts)
    files = [f for name in ("holding", "trials", "disagreements")
             for f in chunk_files(group[name], [(task.null_index, 0, task.chunk)])]
    mark_done(task.store, task.scope, task.marker,
              checksums(task.store, files, written_by(group)))
    return sum(trials for trials, _, _ in counts)


def settle_numba_pool() -> None:
    """Make NUMBA_NUM_THREADS agree with numba's pool: adopt a value set after numba's import
    while its threads have not started, else put back the size they started with (numba's next
    compilation raises once the two differ: a Nanny sets its worker's variables only after a
    spawned worker re-imported numba; seen on a 16-core machine with no numba cache)."""
    from numba.np.ufunc import parallel

    pool = str(numba.config.NUMBA_NUM_THREADS)
    if os.environ.get("NUMBA_NUM_THREADS", pool) == pool:
        return
    if parallel._is_initialized:  # numba's own test before it raises
        os.environ["NUMBA_NUM_THREADS"] = pool
    else:
        numba.config.reload_config()


@contextlib.contextmanager
def numba_threads(threads: int) -> Iterator[None]:
    """numba's parallel kernels on at most `threads` threads in this thread until the context
    exits (numba's count is per thread). A worker process calls its tasks in it with the cores
    it was given: the NUMBA_NUM_THREADS its Nanny sets comes too late where numba was imported
    before (a spawned worker re-imports the driver's main module, which may import numba)."""
    settle_numba_pool()
    saved = numba.get_num_threads()
    numba.set_num_threads(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))
    try:
        yield
    finally:
        numba.set_num_threads(saved)


def run_task(task: PrepareTask | ExtractTask | TestTask | BaselineTask | NullTask) -> int:
    """Dispatch a task spec to its body; returns the number of inputs or trials it covered
    (models, for a preparation)."""
    runner = {"prepare": run_prepare, "extract": run_extract, "test": run_test,
              "baseline": run_baseline, "nulls": run_null}[task.stage]
    return runner(task)

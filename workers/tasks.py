"""The bodies of the sweep's tasks: plain functions of a frozen task spec (no Dask in here).

Each reads what it needs, writes only the store chunks its task owns, then writes its completion
marker. Models and datasets are cached per worker process (module-level dicts keyed by the
specs' JSON), so a worker loads each model once and no task closes over weights.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

import numpy as np

from storage.fingerprint import canonical_json
from storage.layout import RESULT_VARS, ResultStatus
from storage.markers import mark_done
from storage.store import (
    open_model,
    write_attention,
    write_baseline,
    write_results,
    write_tokens,
    write_training_record,
)
from workers.baseline import holding_in_blocks
from workers.equality import check, restrict_layers, rollout
from workers.errors import ExtractionError, InputError
from workers.extraction import Extractor, load_extractor, prepare_model
from workers.inputs import Dataset, DatasetSpec, open_dataset
from workers.token_kinds import TokenKind, keep_mask, special_mask

if TYPE_CHECKING:
    from sweep.plan import BaselineTask, ExtractTask, PrepareTask, TestTask

MAX_CACHED_MODELS = 2  # per worker process; the least recently used one is dropped first
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
                          task.cache_dir])
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


def run_prepare(task: PrepareTask) -> int:
    """Prepare (train) the model, keep its training record in the store if it returns one, then
    the marker. Holds the process's model lock throughout: torch's global RNG, which seeded
    training and seeded model builds draw from, is shared by every thread of a worker."""
    dataset = cached_dataset(task.dataset)
    with _CACHE_LOCK:
        record = prepare_model(task.spec, dataset, task.cache_dir)
    if record is not None:
        write_training_record(task.store, task.model, record)
    mark_done(task.store, task.scope, task.marker)
    return 1


def run_extract(task: ExtractTask) -> int:
    """Extract the shard's inputs, write attention, n_tokens, token kinds, then the marker."""
    group = open_model(task.store, task.model, mode="r+")
    n_layers, t_max = group.attrs["n_layers"], group.attrs["t_max"]
    dataset = cached_dataset(task.dataset)
    ids = dataset.ids[task.start:task.stop]
    stored = [str(i) for i in group["input_id"][task.start:task.stop]]
    if stored != list(ids):
        raise InputError(
            f"model {task.model!r} shard {task.shard}: the dataset's input ids differ from the "
            f"store's (the dataset changed); restore it or use a new store"
        )
    extractor, in_use = cached_extractor(task)
    n = task.stop - task.start
    n_tokens = np.zeros(n, dtype=np.int32)  # (input,)
    token_kind = np.full((n, t_max), TokenKind.PAD, dtype=np.int8)  # (input, token)
    for first in range(task.start, task.stop, task.batch_size):
        last = min(first + task.batch_size, task.stop)
        items = dataset.load(range(first, last))
        with in_use:
            outs = extractor.extract(items, ids[first - task.start:last - task.start])
        attention = np.zeros((last - first, n_layers, t_max, t_max), np.float32)  # (b, L, q, k)
        for offset, out in enumerate(outs):
            row = first - task.start + offset
            layers, tokens = out.attention.shape[0], out.attention.shape[-1]
            if layers != n_layers or tokens > t_max or out.input_id != ids[row]:
                raise ExtractionError(
                    f"model {task.model!r} input {ids[row]!r}: got {out.input_id!r} with "
                    f"{layers} layers x {tokens} tokens, the store expects {n_layers} layers x "
                    f"<= {t_max} tokens"
                )
            attention[offset, :, :tokens, :tokens] = out.attention
            n_tokens[row] = tokens
            token_kind[row, :tokens] = out.token_kind
        write_attention(group, first, attention)
    write_tokens(group, task.start, n_tokens, token_kind)
    mark_done(task.store, task.scope, task.marker)
    return n


def evaluate_input(attention: np.ndarray, token_kind: np.ndarray, token_set: str,
               tol: float) -> dict[str, np.ndarray]:
    """Every result variable, per layer, for one input's (L, T, T) attention and one token set."""
    n_layers = attention.shape[0]
    out = {name: np.full(n_layers, var.fill, dtype=var.dtype) for name, var in RESULT_VARS.items()}
    keep = keep_mask(token_kind, token_set)  # (T,)
    out["n_kept"][:] = keep.sum()
    if not keep.any():
        out["status"][:] = ResultStatus.TOO_SMALL
        return out
    stack, kept, ok = restrict_layers(attention, keep)  # (ok layers, m, m)
    out["status"][:] = np.where(ok, ResultStatus.OK, ResultStatus.EMPTY_ROW)
    if not ok.any():
        return out
    result = check(stack, tol=tol, special=special_mask(token_kind)[kept], validate=False)
    for name in ("kappa", "kappa_factor", "bound", "margin", "holds",
                 "holds_by_characterisation", "attaining_pairs", "attaining_special"):
        out[name][ok] = getattr(result, name)
    has_pair = result.pair[:, 0] >= 0
    out["pair_i"][ok] = np.where(has_pair, kept[result.pair[:, 0]], -1)
    out["pair_j"][ok] = np.where(has_pair, kept[result.pair[:, 1]], -1)
    prefix = int(np.argmin(ok)) if not ok.all() else n_layers  # rollout stops at a failed layer
    if prefix:
        kappa_r, bound_r = rollout(stack[:prefix], bounds=result.bound[:prefix], validate=False)
        out["rollout_kappa"][:prefix] = kappa_r
        out["rollout_bound"][:prefix] = bound_r
    return out


def evaluate_shard(attention: np.ndarray, n_tokens: np.ndarray, token_kind: np.ndarray,
               token_sets: tuple[str, ...], tol: float) -> dict[str, np.ndarray]:
    """Result variables (input, layer, token_set) for a shard's padded arrays."""
    n, n_layers = attention.shape[:2]
    results = {name: np.full((n, n_layers, len(token_sets)), var.fill, dtype=var.dtype)
               for name, var in RESULT_VARS.items()}
    for i in range(n):
        t = int(n_tokens[i])
        for s, token_set in enumerate(token_sets):
            cells = evaluate_input(attention[i, :, :t, :t], token_kind[i, :t], token_set, tol)
            for name, values in cells.items():
                results[name][i, :, s] = values
    return results


def run_test(task: TestTask) -> int:
    """Read the shard's attention back, test it for every token set, write results + marker."""
    group = open_model(task.store, task.model, mode="r+")
    n_tokens = group["n_tokens"][task.start:task.stop]  # (input,)
    token_kind = group["token_kind"][task.start:task.stop]  # (input, token)
    attention = group["attention"][task.start:task.stop]  # (input, layer, query, key)
    write_results(group, task.start,
                  evaluate_shard(attention, n_tokens, token_kind, task.token_sets, task.tol))
    mark_done(task.store, task.scope, task.marker)
    return task.stop - task.start


def run_baseline(task: BaselineTask) -> int:
    """Count the holding matrices among the chunk's trials, write the count, then the marker."""
    holding, disagreements = holding_in_blocks(task.n, task.seed, task.blocks, tol=task.tol)
    trials = sum(count for _, count in task.blocks)
    write_baseline(task.store, task.size_index, task.chunk, holding, trials, disagreements)
    mark_done(task.store, task.scope, task.marker)
    return trials


def run_task(task: PrepareTask | ExtractTask | TestTask | BaselineTask) -> int:
    """Dispatch a task spec to its body; returns the number of inputs or trials it covered
    (models, for a preparation)."""
    runner = {"prepare": run_prepare, "extract": run_extract, "test": run_test,
              "baseline": run_baseline}[task.stage]
    return runner(task)

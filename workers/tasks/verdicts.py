"""The test stage's body: a shard's stored attention read back one input at a time, every
layer, head and token set tested exactly (`workers.exact`), results and marker written. Imports
numpy, numba and zarr only (never torch, transformers or timm)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import zarr

from storage.attention import drop_attention
from storage.errors import InputError
from storage.integrity import checksums, written_by
from storage.layout import DEVICE_ROLLOUT, RESULT_VARS, ResultStatus
from storage.markers import mark_done
from storage.store import StoredAttention, open_model, write_results
from workers.exact.cells import fill_rollout, fill_verdicts
from workers.exact.equality import ROLLOUT_MODES, ROW_SUM_TOL, check, restrict_layers
from workers.exact.readings import READING_EVALUATORS, attaining_kinds
from workers.exact.scratch import scratch
from workers.exact.token_kinds import keep_mask, special_mask
from workers.tasks.shards import attention_chunks, shard_chunks

if TYPE_CHECKING:
    from workers.task_specs import TestTask


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

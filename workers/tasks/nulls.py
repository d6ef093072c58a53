"""The bodies of the null tasks: the config-size baseline's trial chunks and the size-matched
nulls of a model. Imports numpy, numba and zarr only (never torch, transformers or timm)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from storage.integrity import checksums, chunk_files, written_by
from storage.layout import RESULTS_GROUP
from storage.markers import mark_done
from storage.store import open_model, write_baseline, write_matched_nulls
from workers.nulls.baseline import holding_in_blocks
from workers.nulls.matched import matched_holding, size_histograms

if TYPE_CHECKING:
    from workers.task_specs import BaselineTask, NullTask


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

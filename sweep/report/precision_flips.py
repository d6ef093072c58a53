"""Measured flips: what extracting at a lower dtype does to a store's verdicts.

The precision table (`sweep.report.precision`) counts, per model and token set, the verdicts a
dtype's rounding *could* flip: `undecided` (decision radius <= the rounding bound epsilon). The
radius is a lower bound of the distance to the nearest verdict change, so `undecided` is an
upper bound on what rounding the attention entries to the dtype flips; and a forward pass at the
dtype perturbs more than one rounding per entry, so neither count is what such a sweep does.
This module measures it: it re-extracts a sample of a store's inputs at `dtype`, in process,
exactly as the sweep extracted them but for the dtype — the model from the group's recorded spec
(local weights only, checked against the store's record; an FT-Transformer from the store's
checkpoint cache, refused when it is not there: this never trains), the inputs from the recorded
dataset (their digests checked), in the sweep's own batches (a batch's padding changes the last
bits) on the device kind the store pinned — re-tests them with the sweep's own test
(`workers.tasks.verdicts.evaluate_shard`, the stored tolerance and token sets) and counts the cells
(input-layer[-head] pairs with a verdict in both) whose verdict differs from the stored one.

Per model and token set: `inputs` sampled, `cells`, `undecided` (of those cells, at `dtype`, as
the precision table counts them), `flipped` (verdict changed), `flipped_undecided` /
`flipped_decided` (how the flips split), `lost` (cells with a stored verdict and none now, e.g.
a row that lost its mass), and a 95% Wilson interval of flipped / cells (cells counted as
independent trials; an input's layers are not). Re-extracting at the store's own dtype is a
reproducibility check: it must flip nothing.

The sample: the `size` input ids ranked first by sha256(`seed:id`): the same inputs for a model
and its control (same ids), whatever their order in the store.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import zarr

from storage.device_pin import pinned_device
from storage.errors import InputError
from storage.layout import BOOKKEEPING_DIR, ResultStatus
from storage.location import StoreRef, locate
from storage.query.statistics import wilson_interval
from storage.store import open_root
from sweep.driver.plan import with_defaults
from sweep.driver.weights import check_weights, weights_record
from sweep.report.precision import UNIT_ROUNDOFF, rounding_bound
from workers.inputs import DatasetSpec
from workers.inputs.digests import input_digests
from workers.models.extraction import Extraction, Extractor, load_extractor, model_dataset
from workers.models.registry import ModelSpec, family_module, trained_here
from workers.tasks.cache import cached_dataset
from workers.tasks.verdicts import evaluate_shard

FLIP_COLUMNS = ["model", "token_set", "dtype", "stored_dtype", "device", "inputs", "cells",
                "undecided", "flipped", "flipped_undecided", "flipped_decided", "lost",
                "flip_low", "flip_high"]


def sample_indices(ids: Sequence[str], size: int | None, seed: int = 0) -> np.ndarray:
    """Indices (ascending) of the `size` ids ranked first by sha256 of `seed:id`; every index
    when `size` is None or at least len(ids)."""
    if size is None or size >= len(ids):
        return np.arange(len(ids))
    if size < 1:
        raise InputError(f"--sample {size}: give at least 1")
    rank = sorted(range(len(ids)),
                  key=lambda i: hashlib.sha256(f"{seed}:{ids[i]}".encode()).hexdigest())
    return np.sort(np.asarray(rank[:size], dtype=np.int64))


def sweep_batches(indices: Iterable[int], shard_size: int, batch_size: int,
                  n_inputs: int) -> dict[tuple[int, int], list[int]]:
    """(first, last) of each sweep batch that holds one of `indices` -> those indices: the
    sweep extracts each shard [s * shard_size, ...) in batches of `batch_size` from its start."""
    out: dict[tuple[int, int], list[int]] = {}
    for i in indices:
        start = (i // shard_size) * shard_size
        stop = min(start + shard_size, n_inputs)
        first = start + ((i - start) // batch_size) * batch_size
        out.setdefault((first, min(first + batch_size, stop)), []).append(int(i))
    return out


@dataclass(frozen=True)
class StoredModel:
    """What the sweep recorded about one model group: enough to extract and test it again."""

    name: str
    spec: ModelSpec
    dataset: DatasetSpec
    dtype: str
    batch_size: int
    tol: float
    token_sets: tuple[str, ...]
    shard_size: int
    n_inputs: int

    @classmethod
    def of(cls, group: zarr.Group, name: str) -> StoredModel:
        attrs = dict(group.attrs)
        inputs = with_defaults(dict(attrs.get("fingerprint_inputs") or {}))
        if "model" not in inputs or "dataset" not in inputs:
            raise InputError(f"model {name!r}: its group records no model or dataset spec (a "
                             f"store from before the fingerprints); it cannot be re-extracted")
        return cls(name, ModelSpec.from_dict(inputs["model"]), DatasetSpec(**inputs["dataset"]),
                   str(inputs["dtype"]), int(inputs["batch_size"]), float(inputs["tol"]),
                   tuple(inputs["token_sets"]), int(attrs["shard_size"]),
                   int(attrs["n_inputs"]))


def checkpoint_cache(store: StoreRef, config: dict) -> StoreRef:
    """Where the sweep kept its trained checkpoints: `cache_dir`, else the store's own cache."""
    if config.get("cache_dir"):
        return StoreRef.of(str(config["cache_dir"]))
    return StoreRef.of(f"{str(store).rstrip('/')}/{BOOKKEEPING_DIR}/cache", store.option_dict)


@dataclass(frozen=True)
class Reextraction:
    """A model of a store, loaded as the sweep loaded it but at `dtype`, ready to re-extract."""

    store: StoreRef
    model: StoredModel
    group: zarr.Group
    ids: list[str]
    dataset: Any
    extractor: Extractor

    def extract(self, indices: Iterable[int]) -> Iterator[tuple[int, Extraction]]:
        """(index, extraction) of each of `indices`, each extracted in its sweep batch."""
        model = self.model
        for (first, last), wanted in sweep_batches(indices, model.shard_size, model.batch_size,
                                                   model.n_inputs).items():
            outs = self.extractor.extract(self.dataset.load(range(first, last)),
                                          self.ids[first:last])
            for i in wanted:
                yield i, outs[i - first]


def reextraction(store: StoreRef, name: str, dtype: str,
                 device: str | None = None) -> Reextraction:
    """Model `name` of `store` loaded as the sweep did but at `dtype` (see the module): its
    recorded spec and dataset, its local weights checked against the store's record, its
    checkpoint from the sweep's cache, on `device` (default: the kind the store pinned)."""
    if dtype not in UNIT_ROUNDOFF:
        raise InputError(f"--dtype {dtype!r}: choose one of {sorted(UNIT_ROUNDOFF)}")
    root = open_root(store)
    if name not in root.attrs.get("models", []) or name not in root:
        raise InputError(f"store {store}: no model {name!r}; it holds "
                         f"{root.attrs.get('models', [])}")
    group = root[name]
    model = StoredModel.of(group, name)
    check_weights(str(store), name, group.attrs.get("weights_files"),
                  weights_record(model.spec, group.attrs.get("weights_files")))
    ids = [str(i) for i in group["input_id"][...]]
    dataset = model_dataset(model.spec, cached_dataset(model.dataset))
    if list(dataset.ids) != ids:
        raise InputError(f"model {name!r}: the dataset's input ids differ from the store's (the "
                         f"dataset changed since the sweep); restore it")
    cache = checkpoint_cache(store, root.attrs.get("config", {}) or {})
    if trained_here(model.spec) and not model.spec.random_init:  # FT-Transformer, digits ViT
        family = family_module(model.spec).FAMILY
        key = family.checkpoint_key(model.spec, cached_dataset(model.dataset).table)
        if locate(cache).info(key) is None:
            raise InputError(f"model {name!r}: its trained checkpoint {key} is not in {cache} "
                             f"(the sweep's checkpoint cache); sweep precision never trains: "
                             f"rerun `sweep run` with the store's config to restore it")
    kind = device or pinned_device(store, name) or "cpu"
    extractor = load_extractor(model.spec, dataset=cached_dataset(model.dataset), device=kind,
                               dtype=dtype, cache_dir=cache)
    return Reextraction(store, model, group, ids, dataset, extractor)


def check_digests(again: Reextraction, indices: np.ndarray) -> None:
    """InputError if an input at `indices` is not the one the sweep extracted (its digest)."""
    group, model = again.group, again.model
    if "input_digest" not in group:
        return
    stored = [str(d) for d in np.asarray(group["input_digest"][...])[indices]]
    whole_table = trained_here(model.spec)
    if list(input_digests(again.dataset, indices, whole_table=whole_table)) != stored:
        raise InputError(f"model {model.name!r}: a sampled input differs from the one the sweep "
                         f"extracted (its digest changed); restore the dataset")


def tested_attention(out: Extraction, dtype: str, stored_dtype: str) -> np.ndarray:
    """(1, layer, head, T, T): what the test gets of one re-extracted input. At the stored dtype
    the extraction as it is (the sweep's own bits); at another, its rows renormalised in
    float64 first: a half-precision softmax row misses 1 by up to about T * 2^-9 (1.3e-3 seen on
    a 40-token input), past the test's input check (row sums within 1e-3, `workers.exact.equality`),
    and the test renormalises every row anyway."""
    by_head = out.by_head[None]
    if dtype == stored_dtype:
        return by_head
    rows = by_head.astype(np.float64)
    return rows / rows.sum(axis=-1, keepdims=True)


def measure_model(store: StoreRef, name: str, dtype: str, size: int | None = None,
                  seed: int = 0, device: str | None = None) -> list[dict]:
    """The flip counts of model `name` of `store` re-extracted at `dtype` (rows of
    FLIP_COLUMNS, one per token set)."""
    again = reextraction(store, name, dtype, device)
    model, group = again.model, again.group
    results = group["results"]
    status, holds, radius, n_kept = (np.asarray(results[v][...]) for v in
                                     ("status", "holds", "radius", "n_kept"))
    n_tokens = np.asarray(group["n_tokens"][...])
    chosen = sample_indices(again.ids, size, seed)
    check_digests(again, chosen)
    shape = (len(chosen), *status.shape[1:])  # (sample, layer, head, token_set)
    new_status = np.full(shape, ResultStatus.NOT_COMPUTED, dtype=status.dtype)
    new_holds = np.zeros(shape, dtype=bool)
    row = {int(i): k for k, i in enumerate(chosen)}
    for i, out in again.extract(chosen):
        per_head = tested_attention(out, dtype, model.dtype)  # (1, layer, head, T, T)
        cells = evaluate_shard(per_head, np.array([per_head.shape[-1]]), out.token_kind[None],
                               model.token_sets, model.tol, rollout_mode="off")
        new_status[row[i]], new_holds[row[i]] = cells["status"][0], cells["holds"][0]
    was, now = status[chosen] == ResultStatus.OK, new_status == ResultStatus.OK
    steps = n_tokens[chosen][:, None, None, None] - n_kept[chosen]
    rows = []
    for s, token_set in enumerate(model.token_sets):
        both = was[..., s] & now[..., s]
        undecided = radius[chosen][..., s] <= rounding_bound(dtype, token_set, steps[..., s])
        flipped = both & (holds[chosen][..., s] != new_holds[..., s])
        k, n = int(flipped.sum()), int(both.sum())
        low, high = wilson_interval(k, n) if n else (math.nan, math.nan)
        rows.append({"model": name, "token_set": token_set, "dtype": dtype,
                     "stored_dtype": model.dtype, "device": str(again.extractor.device.type),
                     "inputs": len(chosen), "cells": n,
                     "undecided": int((both & undecided).sum()), "flipped": k,
                     "flipped_undecided": int((flipped & undecided).sum()),
                     "flipped_decided": int((flipped & ~undecided).sum()),
                     "lost": int((was[..., s] & ~now[..., s]).sum()),
                     "flip_low": low, "flip_high": high})
    return rows


def measure(store: StoreRef, dtype: str, size: int | None = None, seed: int = 0,
            models: Sequence[str] | None = None, device: str | None = None) -> pd.DataFrame:
    """`measure_model` for each of `models` (default: every model of the store), as a table."""
    names = list(models) if models else list(open_root(store).attrs.get("models", []))
    rows = [r for name in names for r in measure_model(store, name, dtype, size, seed, device)]
    return pd.DataFrame(rows, columns=FLIP_COLUMNS)


def _share(k: int, n: int) -> str:
    return "–" if n == 0 else f"{k}/{n} ({100 * k / n:.1f}%)"


def render_markdown(table: pd.DataFrame, store: str = "") -> str:
    """The flips table as Markdown, with how to read it."""
    lines = [f"# Verdicts that flip at a lower dtype: {store}", "",
             "Each sampled input re-extracted at the dtype (the sweep's model, inputs, batches "
             "and device kind) and re-tested with the sweep's own test; cells = input-layer "
             "pairs with a verdict in the store and now. undecided: of those cells, the ones "
             "whose decision radius is within the dtype's rounding bound (the precision table's "
             "count: an upper bound on what rounding the entries could flip, not a count of "
             "flips); flipped: verdicts that changed, with a 95% Wilson interval (cells counted "
             "as independent); decided / undecided: how the flips split.", "",
             "| model | token set | dtype (stored) | device | inputs | undecided | flipped "
             "[95% CI] | flipped decided | lost |", "|" + "---|" * 9]
    for r in table.to_dict("records"):
        interval = ("" if not r["cells"] else
                    f" [{100 * r['flip_low']:.1f}%, {100 * r['flip_high']:.1f}%]")
        lines.append(f"| {r['model']} | {r['token_set']} | {r['dtype']} ({r['stored_dtype']}) | "
                     f"{r['device']} | {r['inputs']} | {_share(r['undecided'], r['cells'])} | "
                     f"{_share(r['flipped'], r['cells'])}{interval} | {r['flipped_decided']} | "
                     f"{r['lost']} |")
    return "\n".join([*lines, ""])

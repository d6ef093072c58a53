"""FT-Transformer (rtdl_revisiting_models): trained by the project, attention recomputed in full.

Training: a fixed seed splits the table into train/validation/test; AdamW (the library's default
optimiser) with early stopping on the validation metric; the best weights and the feature
standardisation go into one safetensors checkpoint, the test metric into a JSON beside it, both
keyed by the spec and the table's content, and reused when present.

Attention: the library returns no probabilities and runs its last block with the CLS query only.
A forward pre-hook on each block's attention captures its (normalised) input and recomputes the
full softmax(q k^T / sqrt(d_head)) over all tokens. CLS is token 0; each feature is a content token.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rtdl_revisiting_models import FTTransformer, MultiheadAttention
from safetensors.torch import load_file, save_file

from workers.errors import ExtractionError, InputError, StoreDamagedError
from workers.extraction import Batch, Extractor, Sink
from workers.inputs import Dataset, Table
from workers.models import ModelSpec
from workers.token_kinds import TokenKind

STATS = ("stats.feature_mean", "stats.feature_std", "stats.target_mean", "stats.target_std")


def checkpoint_path(spec: ModelSpec, table: Table, cache_dir: Path) -> Path:
    """Where the checkpoint of `spec` trained on `table` lives (metrics: same stem, .json)."""
    key = json.dumps({"spec": spec.to_dict(), "table": table.fingerprint}, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return Path(cache_dir) / f"ft-transformer-{digest}.safetensors"


def split_indices(n: int, seed: int, val_fraction: float, test_fraction: float) -> dict:
    """A fixed random train/val/test split of range(n) from `seed`."""
    order = np.random.default_rng(seed).permutation(n)
    n_test, n_val = round(n * test_fraction), round(n * val_fraction)
    if n - n_test - n_val < 1 or n_val < 1 or n_test < 1:
        raise InputError(f"tabular dataset of {n} rows is too small to split train/val/test")
    return {"test": order[:n_test], "val": order[n_test:n_test + n_val],
            "train": order[n_test + n_val:]}


def build_model(spec: ModelSpec, n_features: int, d_out: int) -> FTTransformer:
    """An FTTransformer with the library's default hyperparameters for `n_blocks`."""
    kwargs = FTTransformer.get_default_kwargs(int(spec.options["n_blocks"]))
    return FTTransformer(n_cont_features=n_features, cat_cardinalities=[], d_out=d_out, **kwargs)


def _metric(task: str, out: torch.Tensor, target: torch.Tensor, stats: dict) -> float:
    """Accuracy (classification; higher is better) or minus RMSE in target units (regression)."""
    if task == "classification":
        return float((out.argmax(-1) == target).double().mean())
    pred = out.squeeze(-1) * stats["stats.target_std"] + stats["stats.target_mean"]
    return -float(torch.sqrt(((pred - target) ** 2).mean()))


def train(spec: ModelSpec, table: Table) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Train on a seeded split with early stopping; the best state (+ stats) and the metrics."""
    options = spec.options
    split = split_indices(len(table.target), spec.seed, options["val_fraction"],
                          options["test_fraction"])
    x = torch.as_tensor(table.features, dtype=torch.float32)  # (rows, features)
    classification = table.task == "classification"
    y = torch.as_tensor(table.target, dtype=torch.long if classification else torch.float32)
    train_x, train_y = x[split["train"]], y[split["train"]]
    stats = {
        "stats.feature_mean": train_x.mean(0),
        "stats.feature_std": train_x.std(0).clamp_min(1e-8),
        "stats.target_mean": torch.tensor(0.0 if classification else float(train_y.mean())),
        "stats.target_std": torch.tensor(1.0 if classification else float(train_y.std()) or 1.0),
    }
    x = (x - stats["stats.feature_mean"]) / stats["stats.feature_std"]
    d_out = int(y.max()) + 1 if classification else 1
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = build_model(spec, x.shape[1], d_out)
        optimizer = model.make_default_optimizer()
        loss_fn = torch.nn.CrossEntropyLoss() if classification else torch.nn.MSELoss()
        scaled = (y - stats["stats.target_mean"]) / stats["stats.target_std"]
        target = y if classification else scaled
        generator = torch.Generator().manual_seed(spec.seed)
        best, best_state, best_epoch, epoch = -math.inf, None, 0, 0
        for epoch in range(int(options["max_epochs"])):
            model.train()
            order = split["train"][torch.randperm(len(split["train"]), generator=generator).numpy()]
            for start in range(0, len(order), int(options["batch_size"])):
                rows = order[start:start + int(options["batch_size"])]
                out = model(x[rows], None)
                loss = loss_fn(out if classification else out.squeeze(-1), target[rows])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            model.eval()
            with torch.no_grad():
                score = _metric(table.task, model(x[split["val"]], None), y[split["val"]], stats)
            if score > best:
                best, best_epoch = score, epoch
                best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            elif epoch - best_epoch >= int(options["patience"]):
                break
        model.load_state_dict(best_state)
        model.eval()
        with torch.no_grad():
            test = _metric(table.task, model(x[split["test"]], None), y[split["test"]], stats)
    name = "accuracy" if classification else "rmse"
    sign = 1 if classification else -1
    metrics = {
        "task": table.task, "metric": name, "test": sign * test, "val": sign * best,
        "best_epoch": best_epoch, "epochs_run": epoch + 1, "d_out": d_out,
        "n_features": x.shape[1], "split": {k: len(v) for k, v in split.items()},
        "seed": spec.seed, "table": table.fingerprint, "spec": spec.to_dict(),
    }
    return {**best_state, **stats}, metrics


def check_checkpoint(path: Path) -> None:
    """StoreDamagedError naming a cached checkpoint (or its metrics JSON) that does not load."""
    try:
        load_file(str(path))
        json.loads(path.with_suffix(".json").read_text())["d_out"]
    except Exception as error:  # noqa: BLE001 - safetensors raises its own error types
        raise StoreDamagedError(
            f"cached checkpoint {path} is truncated or corrupt ({type(error).__name__}); "
            f"delete it and {path.with_suffix('.json').name} to train it again"
        ) from None


def ensure_checkpoint(spec: ModelSpec, dataset: Dataset | None, cache_dir: Path) -> Path:
    """The checkpoint for (spec, dataset's table), training and saving it first if absent."""
    if dataset is None or dataset.table is None:
        raise InputError(f"model {spec.name!r} needs a tabular dataset (it is trained on it)")
    path = checkpoint_path(spec, dataset.table, cache_dir)
    if path.is_file():
        check_checkpoint(path)
        return path
    state, metrics = train(spec, dataset.table)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".partial-{os.getpid()}")
    meta = {"d_out": str(metrics["d_out"]), "n_features": str(metrics["n_features"])}
    save_file({k: v.contiguous() for k, v in state.items()}, str(partial), metadata=meta)
    path.with_suffix(".json").write_text(json.dumps(metrics, indent=2, sort_keys=True))
    partial.replace(path)  # atomic: a checkpoint that exists is complete
    return path


class FTExtractor(Extractor):
    """A trained FT-Transformer; full T x T attention recomputed from each block's input."""

    def __init__(self, spec: ModelSpec, dataset: Dataset, cache_dir: Path,
                 device: torch.device, dtype: torch.dtype) -> None:
        self.spec, self.device, self.dtype = spec, device, dtype
        path = ensure_checkpoint(spec, dataset, cache_dir)
        state = load_file(str(path))
        self.stats = {k: state.pop(k).to(device) for k in STATS}
        n_features = len(dataset.table.feature_names)
        d_out = int(json.loads(path.with_suffix(".json").read_text())["d_out"])
        self.model = build_model(spec, n_features, d_out)
        self.model.load_state_dict(state)
        self.model.eval().to(device=device, dtype=dtype)
        self.attentions: list[MultiheadAttention] = [
            block["attention"] for block in self.model.backbone.blocks
        ]
        self.n_layers = len(self.attentions)
        if any(a.key_compression is not None for a in self.attentions):
            raise ExtractionError(f"model {spec.name!r}: Linformer attention is not supported")
        self.kinds = np.array([TokenKind.CLS] + [TokenKind.CONTENT] * n_features, dtype=np.int8)

    def token_counts(self, items: Sequence[Any]) -> list[int]:
        return [len(self.kinds)] * len(items)

    def prepare(self, items: Sequence[Any]) -> Batch:
        rows = torch.as_tensor(np.stack(items), dtype=torch.float32, device=self.device)
        if rows.shape[1] != len(self.kinds) - 1:
            raise InputError(f"rows have {rows.shape[1]} features, the model {len(self.kinds) - 1}")
        x = (rows - self.stats["stats.feature_mean"]) / self.stats["stats.feature_std"]
        positions = [torch.arange(len(self.kinds))] * len(items)
        return Batch({"x": x.to(self.dtype)}, positions, [self.kinds] * len(items))

    def install_hooks(self, sink: Sink) -> list[torch.utils.hooks.RemovableHandle]:
        def hook(module: MultiheadAttention, args: tuple[torch.Tensor, torch.Tensor]) -> None:
            sink(full_attention(module, args[1]))

        return [a.register_forward_pre_hook(hook) for a in self.attentions]

    def forward(self, batch: Batch) -> Any:
        return self.model(batch.inputs["x"], None)


def full_attention(module: MultiheadAttention, x: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d_head)) of every token over every token, as the block computes it.

    x: (batch, tokens, d) the block's key/value input; returns (batch, heads, tokens, tokens).
    """
    batch, tokens, _ = x.shape
    heads = module._n_heads
    q = module.W_q(x).reshape(batch, tokens, heads, -1).transpose(1, 2)  # (batch, heads, T, d_head)
    k = module.W_k(x).reshape(batch, tokens, heads, -1).transpose(1, 2)  # (batch, heads, T, d_head)
    return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(k.shape[-1]), dim=-1)

"""FT-Transformer's training recipe: Gorishniy et al. (2021), as rtdl_revisiting_models gives it.

Preprocessing (`ft.data.fit_preprocessing`, option `preprocessing`): the quantile transform
fitted on the training rows (default) or standardisation. AdamW (lr 1e-4, weight decay 1e-5)
over the library's parameter groups (`make_parameter_groups`: no weight decay on the
embeddings, the normalisations and the biases); cross-entropy
(classification) or MSE on the standardised target (regression); early stopping on the
validation loss: training stops after `patience` epochs without a lower validation loss, or at
`max_epochs`, and the weights of the lowest-validation-loss epoch are kept. `train` returns those
weights (with the preprocessing) and a JSON-able training record.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from storage.errors import ExtractionError
from workers.inputs import Table
from workers.models.determinism import TORCH_THREADS, fixed_torch
from workers.models.registry import ModelSpec
from workers.models.trained.ft.data import (
    QUANTILE_NOISE,
    SUBSAMPLE,
    architecture,
    encode,
    fit_preprocessing,
    init_model,
    n_quantiles,
    output_size,
)
from workers.models.trained.split import table_split

LR = 1e-4
WEIGHT_DECAY = 1e-5
EVAL_BATCH = 1024  # rows per forward pass when scoring a split
LOG = logging.getLogger(__name__)
State = dict[str, torch.Tensor]


class EarlyStopping:
    """Tracks the lowest validation loss: a copy of its weights, its epoch, and when to stop.

    Epochs count from 1. `update` returns True once `patience` epochs have passed without a
    strictly lower validation loss than the best one.
    """

    def __init__(self, patience: int) -> None:
        self.patience = patience
        self.best_loss = math.inf
        self.best_epoch = 0
        self.best_state: dict[str, torch.Tensor] | None = None

    def update(self, epoch: int, loss: float, model: torch.nn.Module) -> bool:
        """Record `epoch`'s validation loss, keeping the weights if it is the lowest; True: stop."""
        if loss < self.best_loss:
            self.best_loss, self.best_epoch = loss, epoch
            self.best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        return epoch - self.best_epoch >= self.patience


def train_device() -> torch.device:
    """CUDA when the worker has it, else CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def train(spec: ModelSpec, table: Table, keep: Iterable[int] = (),
          device: torch.device | None = None) -> tuple[State, dict[int, State], dict[str, Any]]:
    """Train `spec` on `table` by the recipe: the kept weights plus the preprocessing
    (`ft.data.STATS_PREFIX` keys), the weights (with the preprocessing) after each epoch of
    `keep` that training reached (0: initial), and the training record (see `docs/models.md`).
    Runs on TORCH_THREADS torch threads with deterministic algorithms: the same bits on any
    machine's core count."""
    kept: dict[int, State] = {}
    with fixed_torch(TORCH_THREADS, deterministic=True):
        state, record = _train(spec, table, device, set(keep), kept)
    return state, kept, record


def _train(spec: ModelSpec, table: Table, device: torch.device | None, keep: set[int],
           kept: dict[int, State]) -> tuple[State, dict[str, Any]]:
    started = time.perf_counter()
    options, device = spec.options, device or train_device()
    split = table_split(options, spec.seed, table)
    stats = fit_preprocessing(options, spec.seed, table, split["train"])
    classification = table.task == "classification"
    target = torch.as_tensor(table.target, dtype=torch.long if classification else torch.float32)
    if not classification:
        target = (target - stats["stats.target_mean"]) / stats["stats.target_std"]
    data = {part: (*encode(table.features[rows], table, stats, device), target[rows].to(device))
            for part, rows in split.items()}
    loss_fn = torch.nn.CrossEntropyLoss() if classification else torch.nn.MSELoss()
    model = init_model(options, spec.seed, table).to(device)
    optimizer = torch.optim.AdamW(model.make_parameter_groups(), lr=LR, weight_decay=WEIGHT_DECAY)
    stopper = EarlyStopping(int(options["patience"]))
    generator = torch.Generator().manual_seed(spec.seed)
    batch_size, max_epochs = int(options["batch_size"]), int(options["max_epochs"])
    history: dict[str, list[float]] = {"train_loss": [], "val_loss": []}
    stopped_by, epoch = "max_epochs", 0

    def snapshot(at: int) -> None:
        if at in keep:
            kept[at] = {**{k: v.detach().cpu().clone() for k, v in model.state_dict().items()},
                        **stats}

    snapshot(0)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(spec.seed)  # dropout masks
        bar = tqdm(total=max_epochs, desc=f"training {spec.name}", unit="epoch",
                   file=sys.stderr, leave=False, disable=None)  # a bar on a terminal only
        for epoch in range(1, max_epochs + 1):
            history["train_loss"].append(
                _epoch(model, data["train"], loss_fn, optimizer, batch_size, generator)
            )
            history["val_loss"].append(_loss(model, data["val"], loss_fn))
            bar.update()
            bar.set_postfix(val_loss=f"{history['val_loss'][-1]:.4f}", refresh=False)
            if epoch % 10 == 0:
                LOG.info("%s: epoch %d, validation loss %.4f", spec.name, epoch,
                         history["val_loss"][-1])
            snapshot(epoch)
            if stopper.update(epoch, history["val_loss"][-1], model):
                stopped_by = "patience"
                break
        bar.close()
    if stopper.best_state is None:
        raise ExtractionError(f"model {spec.name!r}: training diverged (no finite validation loss)")
    model.load_state_dict(stopper.best_state)
    metric = "accuracy" if classification else "rmse"
    scale = float(stats["stats.target_std"])
    record = {
        "model": spec.name,
        "task": table.task,
        "metric": metric,
        "test_score": _score(model, data["test"], metric, scale),
        "val_score": _score(model, data["val"], metric, scale),
        "val_loss": stopper.best_loss,
        "best_epoch": stopper.best_epoch,
        "epochs_run": epoch,
        "stopped_by": stopped_by,
        "split": {part: len(split[part]) for part in ("train", "val", "test")},
        "wall_s": round(time.perf_counter() - started, 3),
        "n_params": sum(p.numel() for p in model.parameters()),
        "hyperparameters": hyperparameters(spec, classification, len(split["train"])),
        "inputs": {"n_cont": len(table.continuous),
                   "cat_cardinalities": list(table.cardinalities), "d_out": output_size(table)},
        "table": table.fingerprint,
        "device": str(device),
        "torch_threads": torch.get_num_threads(),
        "history": history,
    }
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    return {**state, **stats}, record


def preprocessing(options: dict[str, Any], n_train: int) -> dict[str, Any]:
    """The preprocessing the record names: its kind and, for `quantile`, its parameters."""
    if options["preprocessing"] == "standard":
        return {"kind": "standard", "fitted_on": "train rows"}
    return {"kind": "quantile", "fitted_on": "train rows", "output_distribution": "normal",
            "n_quantiles": min(n_quantiles(n_train), n_train), "noise_std": QUANTILE_NOISE,
            "subsample": SUBSAMPLE, "random_state": "seed"}


def hyperparameters(spec: ModelSpec, classification: bool, n_train: int) -> dict[str, Any]:
    """What determines the training: architecture, preprocessing, optimiser, loss, batch,
    stopping, split."""
    arch = {k: v for k, v in architecture(spec.options).items() if not k.startswith("_")}
    keys = ("batch_size", "max_epochs", "patience", "val_fraction", "test_fraction")
    return {
        **arch, "preprocessing": preprocessing(spec.options, n_train),
        "optimizer": "AdamW", "lr": LR, "weight_decay": WEIGHT_DECAY,
        "no_weight_decay": "embeddings, normalisations, biases (make_parameter_groups)",
        "loss": "cross_entropy" if classification else "mse (standardised target)",
        "early_stopping": "validation loss", **{k: spec.options[k] for k in keys},
        "seed": spec.seed,
    }


Part = tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor]  # x_cont, x_cat, target


def _rows(part: Part, index: torch.Tensor | slice) -> Part:
    x_cont, x_cat, y = part
    return (None if x_cont is None else x_cont[index], None if x_cat is None else x_cat[index],
            y[index])


def _output(model: torch.nn.Module, x_cont: torch.Tensor | None,
            x_cat: torch.Tensor | None) -> torch.Tensor:
    out = model(x_cont, x_cat)
    return out if out.shape[-1] > 1 else out.squeeze(-1)


def _epoch(model: torch.nn.Module, part: Part, loss_fn: torch.nn.Module,
           optimizer: torch.optim.Optimizer, batch_size: int, generator: torch.Generator) -> float:
    """One pass over the training rows in a seeded random order; the mean training loss."""
    model.train()
    n = len(part[2])
    order = torch.randperm(n, generator=generator).to(part[2].device)
    total = 0.0
    for start in range(0, n, batch_size):
        x_cont, x_cat, y = _rows(part, order[start:start + batch_size])
        loss = loss_fn(_output(model, x_cont, x_cat), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.item() * len(y)
    return total / n


def _predict(model: torch.nn.Module, part: Part) -> torch.Tensor:
    """Eval-mode outputs for every row of `part`, in batches of `EVAL_BATCH`."""
    model.eval()
    with torch.no_grad():
        outs = [_output(model, *_rows(part, slice(s, s + EVAL_BATCH))[:2])
                for s in range(0, len(part[2]), EVAL_BATCH)]
    return torch.cat(outs)


def _loss(model: torch.nn.Module, part: Part, loss_fn: torch.nn.Module) -> float:
    return float(loss_fn(_predict(model, part), part[2]))


def _score(model: torch.nn.Module, part: Part, metric: str, scale: float) -> float:
    """Accuracy, or RMSE in the target's own units (`scale`: its training std)."""
    out = _predict(model, part)
    if metric == "accuracy":
        return float((out.argmax(-1) == part[2]).double().mean())
    return float(np.sqrt(float(((out - part[2]) ** 2).mean()))) * scale

"""The digits ViT's training recipe, and the epochs it keeps.

AdamW (weight decay on every parameter) with a one-cycle learning rate (torch's `OneCycleLR`,
peak `lr`, over every step of `epochs` epochs), cross-entropy, batches of `batch_size` training
images in a seeded order, no augmentation, no early stopping: every epoch runs, and the weights
of the epoch with the lowest validation loss are the model ("best"). The weights after each
epoch of `keep` are kept too (epoch 0: the initial weights). One torch thread, deterministic
algorithms (`workers.models.determinism`): the same bits on any machine.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable
from typing import Any

import torch

from storage.errors import ExtractionError
from workers.inputs import Table
from workers.models.determinism import TORCH_THREADS, fixed_torch
from workers.models.registry import ModelSpec
from workers.models.trained.options import training_options
from workers.models.trained.split import table_split
from workers.models.trained.vit.data import (
    architecture,
    init_model,
    n_classes,
    table_images,
)

LOG = logging.getLogger(__name__)
State = dict[str, torch.Tensor]


def train(spec: ModelSpec, table: Table, keep: Iterable[int] = ()
          ) -> tuple[State, dict[int, State], dict[str, Any]]:
    """Train `spec` on the digits `table`: the best weights, the weights after each epoch of
    `keep`, and the JSON-able training record (docs/training.md)."""
    with fixed_torch(TORCH_THREADS, deterministic=True):
        return _train(spec, table, set(keep))


def _train(spec: ModelSpec, table: Table, keep: set[int]
           ) -> tuple[State, dict[int, State], dict[str, Any]]:
    started, cpu = time.perf_counter(), time.process_time()
    options = spec.options
    split = table_split(options, spec.seed, table)
    x, y = table_images(table), torch.as_tensor(table.target, dtype=torch.long)
    data = {part: (x[rows], y[rows]) for part, rows in split.items()}
    classes = n_classes(table)
    model = init_model(options, spec.seed, classes)
    epochs, batch = int(options["epochs"]), int(options["batch_size"])
    steps = math.ceil(len(split["train"]) / batch)
    optimizer = torch.optim.AdamW(model.parameters(), lr=float(options["lr"]),
                                  weight_decay=float(options["weight_decay"]))
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=float(options["lr"]),
                                                   total_steps=epochs * steps)
    generator = torch.Generator().manual_seed(spec.seed)
    kept = {0: _copy(model)} if 0 in keep else {}
    history: dict[str, list[float]] = {"train_loss": [], "val_loss": [], "val_accuracy": [],
                                       "test_accuracy": []}
    best = (math.inf, 0, _copy(model))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)  # dropout (none by default) and anything else drawn
        for epoch in range(1, epochs + 1):
            history["train_loss"].append(
                _epoch(model, data["train"], optimizer, schedule, batch, generator))
            val_loss, val_accuracy = _evaluate(model, data["val"])
            history["val_loss"].append(val_loss)
            history["val_accuracy"].append(val_accuracy)
            history["test_accuracy"].append(_evaluate(model, data["test"])[1])
            if val_loss < best[0]:
                best = (val_loss, epoch, _copy(model))
            if epoch in keep:
                kept[epoch] = _copy(model)
            if epoch % 10 == 0:
                LOG.info("%s: epoch %d, validation loss %.4f", spec.name, epoch, val_loss)
    if not math.isfinite(best[0]):
        raise ExtractionError(f"model {spec.name!r}: training diverged (no finite validation loss)")
    model.load_state_dict(best[2])
    test_loss, test_accuracy = _evaluate(model, data["test"])
    record = {
        "model": spec.name, "task": "classification", "metric": "accuracy",
        "test_score": test_accuracy, "val_score": history["val_accuracy"][best[1] - 1],
        "val_loss": best[0], "best_epoch": best[1], "epochs_run": epochs,
        "stopped_by": "epochs", "split": {part: len(split[part]) for part in split},
        "wall_s": round(time.perf_counter() - started, 3),
        "cpu_s": round(time.process_time() - cpu, 3),
        "n_params": sum(p.numel() for p in model.parameters()),
        "hyperparameters": {**training_options(options), **architecture(options, classes),
                            "optimizer": "AdamW", "schedule": "one-cycle (OneCycleLR)",
                            "loss": "cross_entropy", "augmentation": "none",
                            "selection": "lowest validation loss", "seed": spec.seed},
        "table": table.fingerprint, "device": "cpu", "torch_threads": torch.get_num_threads(),
        "history": history,
    }
    return best[2], kept, record


def _copy(model: torch.nn.Module) -> State:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _epoch(model: torch.nn.Module, part: tuple[torch.Tensor, torch.Tensor],
           optimizer: torch.optim.Optimizer, schedule: Any, batch: int,
           generator: torch.Generator) -> float:
    """One pass over the training images in a seeded order; the mean training loss."""
    model.train()
    x, y = part
    order = torch.randperm(len(y), generator=generator)
    total = 0.0
    for start in range(0, len(y), batch):
        rows = order[start:start + batch]
        loss = torch.nn.functional.cross_entropy(model(x[rows]), y[rows])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        total += loss.item() * len(rows)
    return total / len(y)


def _evaluate(model: torch.nn.Module, part: tuple[torch.Tensor, torch.Tensor]
              ) -> tuple[float, float]:
    """Eval-mode (loss, accuracy) over every image of `part` in one forward pass."""
    model.eval()
    with torch.no_grad():
        out = model(part[0])
    loss = float(torch.nn.functional.cross_entropy(out, part[1]))
    return loss, float((out.argmax(-1) == part[1]).double().mean())

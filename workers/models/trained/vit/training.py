"""The digits ViT's training recipe, and the epochs it keeps.

AdamW (weight decay on every parameter) with a one-cycle learning rate (torch's `OneCycleLR`,
peak `lr`, over every step of `epochs` epochs), cross-entropy, batches of `batch_size` training
images in a seeded order, no augmentation, no early stopping: every epoch runs, and the weights
of the epoch with the lowest validation loss are the model ("best"). The weights after each
epoch of `keep` are kept too (epoch 0: the initial weights). One torch thread, deterministic
algorithms (`workers.models.determinism`): the same bits on any machine.
"""

from __future__ import annotations

import importlib
import math
import time
from collections.abc import Iterable
from typing import Any

import torch

from workers.inputs import Table
from workers.models.determinism import TORCH_THREADS, fixed_torch
from workers.models.registry import ModelSpec
from workers.models.trained.loop import Outcome, Recipe, State, copy_weights, run_epochs
from workers.models.trained.options import training_options
from workers.models.trained.run import TrainingRun
from workers.models.trained.split import table_split
from workers.models.trained.vit.data import (
    architecture,
    init_model,
    n_classes,
    table_images,
)
from workers.models.trained.vit.options import objective
from workers.models.trained.vit.probe import features, linear_probe

RECIPES = {"supervised": "workers.models.trained.vit.training.SupervisedRecipe",
           "dino": "workers.models.trained.vit.dino.DinoRecipe",
           "distilled": "workers.models.trained.vit.distilled.DistilledRecipe"}
"""The recipe of each objective (option `objective`), imported when it trains."""


def train(spec: ModelSpec, table: Table, keep: Iterable[int] = (), run: TrainingRun | None = None
          ) -> tuple[State, dict[int, State], dict[str, Any]]:
    """Train `spec` on the digits `table`: the best weights, the weights after each epoch of
    `keep`, and the JSON-able training record (docs/training.md). `run`: where the run writes
    as it goes (`workers.models.trained.run`)."""
    with fixed_torch(TORCH_THREADS, deterministic=True):
        started = time.perf_counter(), time.process_time()
        module, name = RECIPES[objective(spec.options)].rsplit(".", 1)
        recipe = getattr(importlib.import_module(module), name)(spec, table)
        outcome = run_epochs(recipe, spec.name, spec.seed, set(keep), run, started)
        return outcome.best, outcome.kept, recipe.record(outcome, started)


class DigitsRecipe(Recipe):
    """What every recipe of the digits ViT shares: the split and its images, the seeded initial
    model, AdamW with a one-cycle learning rate over every step, the batches in a seeded order,
    and the record."""

    selection, score = "val_loss", "val_accuracy"

    def __init__(self, spec: ModelSpec, table: Table) -> None:
        options = self.options = spec.options
        self.spec, self.table = spec, table
        self.split = table_split(options, spec.seed, table)
        x, y = table_images(table), torch.as_tensor(table.target, dtype=torch.long)
        self.data = {part: (x[rows], y[rows]) for part, rows in self.split.items()}
        self.classes = n_classes(table)
        self.model = init_model(options, spec.seed, self.classes)
        self.epochs, self.batch = int(options["epochs"]), int(options["batch_size"])
        self.total_steps = self.epochs * math.ceil(len(self.split["train"]) / self.batch)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=float(options["lr"]),
                                           weight_decay=float(options["weight_decay"]))
        self.schedule = torch.optim.lr_scheduler.OneCycleLR(
            self.optimizer, max_lr=float(options["lr"]), total_steps=self.total_steps)
        self.generator = torch.Generator().manual_seed(spec.seed)
        self.modules, self.optimizers = {"model": self.model}, [self.optimizer]
        self.schedules, self.buffers = [self.schedule], {}
        self.generators = {"batches": self.generator}

    def weights(self) -> State:
        return copy_weights(self.model)

    def batches(self) -> list[torch.Tensor]:
        """This epoch's batches of training rows, in an order drawn from the seeded generator."""
        order = torch.randperm(len(self.data["train"][1]), generator=self.generator)
        return [order[start:start + self.batch] for start in range(0, len(order), self.batch)]

    def step(self, loss: torch.Tensor) -> None:
        """One optimiser step on `loss`, and the schedule's."""
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.schedule.step()

    def hyperparameters(self) -> dict[str, Any]:
        """The record's hyperparameters: the options, the architecture and the recipe's own."""
        return {**training_options(self.options), **architecture(self.options, self.classes),
                "optimizer": "AdamW", "schedule": "one-cycle (OneCycleLR)",
                "loss": "cross_entropy", "augmentation": "none",
                "selection": "lowest validation loss", "seed": self.spec.seed}

    def scores(self, outcome: Outcome) -> dict[str, Any]:
        """The record's scores of the kept weights (loaded into the model): test and
        validation accuracy, and the validation loss."""
        self.model.load_state_dict(outcome.best)
        return {"test_score": evaluate(self.model, self.data["test"])[1],
                "val_score": outcome.history["val_accuracy"][outcome.best_epoch - 1],
                "val_loss": outcome.best_value}

    def probe(self, weights: State | None) -> dict[str, float]:
        """A linear probe's validation and test accuracy on the CLS features of `weights`
        (None: the initial weights), `vit.probe`."""
        model = init_model(self.options, self.spec.seed, self.classes)
        if weights is not None:
            model.load_state_dict(weights)
        (x, y), parts = self.data["train"], {p: self.data[p] for p in ("val", "test")}
        return linear_probe(features(model, x), y,
                            {p: (features(model, px), py) for p, (px, py) in parts.items()})

    def record(self, outcome: Outcome, started: tuple[float, float]) -> dict[str, Any]:
        """The training record of `outcome` (docs/training.md)."""
        spec, split = self.spec, self.split
        self.probes = ({} if objective(self.options) == "supervised" else
                       {"kept": self.probe(outcome.best), "initial": self.probe(None)})
        record = {
            "model": spec.name, "task": "classification", "metric": "accuracy",
            **self.scores(outcome), "best_epoch": outcome.best_epoch,
            "epochs_run": outcome.epochs_run, "stopped_by": outcome.stopped_by,
            "split": {part: len(split[part]) for part in split},
            "wall_s": round(outcome.earlier_s[0] + time.perf_counter() - started[0], 3),
            "cpu_s": round(outcome.earlier_s[1] + time.process_time() - started[1], 3),
            "n_params": sum(p.numel() for p in self.model.parameters()),
            "hyperparameters": self.hyperparameters(),
            "table": self.table.fingerprint, "device": "cpu",
            "torch_threads": torch.get_num_threads(), "history": outcome.history,
        }
        if objective(self.options) != "supervised":  # the supervised record as it always was
            record["objective"] = objective(self.options)
            record["probe"] = self.probes
        if outcome.resumed_from is not None:
            record["resumed_from"] = outcome.resumed_from
        return record


class SupervisedRecipe(DigitsRecipe):
    """Cross-entropy on the labels, no augmentation (see the module)."""

    def epoch(self, epoch: int) -> dict[str, float]:
        self.model.train()
        x, y = self.data["train"]
        total = 0.0
        for rows in self.batches():
            loss = torch.nn.functional.cross_entropy(self.model(x[rows]), y[rows])
            self.step(loss)
            total += loss.item() * len(rows)
        val_loss, val_accuracy = evaluate(self.model, self.data["val"])
        return {"train_loss": total / len(y), "val_loss": val_loss, "val_accuracy": val_accuracy,
                "test_accuracy": evaluate(self.model, self.data["test"])[1]}


def evaluate(model: torch.nn.Module, part: tuple[torch.Tensor, torch.Tensor]
              ) -> tuple[float, float]:
    """Eval-mode (loss, accuracy) over every image of `part` in one forward pass."""
    model.eval()
    with torch.no_grad():
        out = model(part[0])
    loss = float(torch.nn.functional.cross_entropy(out, part[1]))
    return loss, float((out.argmax(-1) == part[1]).double().mean())

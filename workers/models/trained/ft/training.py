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

import time
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from workers.inputs import Table
from workers.models.determinism import TORCH_THREADS, fixed_torch
from workers.models.registry import ModelSpec
from workers.models.trained.ft.data import (
    QUANTILE_NOISE,
    STATS_PREFIX,
    SUBSAMPLE,
    architecture,
    encode,
    fit_preprocessing,
    init_model,
    n_quantiles,
    output_size,
)
from workers.models.trained.loop import Outcome, Recipe, State, run_epochs
from workers.models.trained.run import TrainingRun
from workers.models.trained.split import table_split

LR = 1e-4
WEIGHT_DECAY = 1e-5
EVAL_BATCH = 1024  # rows per forward pass when scoring a split


def train_device() -> torch.device:
    """CUDA when the worker has it, else CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def train(spec: ModelSpec, table: Table, keep: Iterable[int] = (), run: TrainingRun | None = None,
          device: torch.device | None = None) -> tuple[State, dict[int, State], dict[str, Any]]:
    """Train `spec` on `table` by the recipe: the kept weights plus the preprocessing
    (`ft.data.STATS_PREFIX` keys), the weights (with the preprocessing) after each epoch of
    `keep` that training reached (0: initial), and the training record (see `docs/models.md`).
    Runs on TORCH_THREADS torch threads with deterministic algorithms: the same bits on any
    machine's core count. `run`: where the run writes as it goes (`workers.models.trained.run`)."""
    with fixed_torch(TORCH_THREADS, deterministic=True):
        started = time.perf_counter(), time.process_time()
        recipe = FTRecipe(spec, table, device or train_device())
        outcome = run_epochs(recipe, spec.name, spec.seed, set(keep), run, started)
        record = recipe.record(outcome, outcome.earlier_s[0] + time.perf_counter() - started[0])
        return outcome.best, outcome.kept, record


class FTRecipe(Recipe):
    """The paper's recipe on one table (see the module) for `workers.models.trained.loop`."""

    def __init__(self, spec: ModelSpec, table: Table, device: torch.device) -> None:
        options = spec.options
        self.spec, self.table, self.device = spec, table, device
        self.split = table_split(options, spec.seed, table)
        self.stats = fit_preprocessing(options, spec.seed, table, self.split["train"])
        self.classification = table.task == "classification"
        target = torch.as_tensor(table.target,
                                 dtype=torch.long if self.classification else torch.float32)
        if not self.classification:
            target = (target - self.stats["stats.target_mean"]) / self.stats["stats.target_std"]
        self.data = {part: (*encode(table.features[rows], table, self.stats, device),
                            target[rows].to(device)) for part, rows in self.split.items()}
        self.loss_fn = (torch.nn.CrossEntropyLoss() if self.classification
                        else torch.nn.MSELoss())
        self.model = init_model(options, spec.seed, table).to(device)
        self.optimizer = torch.optim.AdamW(self.model.make_parameter_groups(), lr=LR,
                                           weight_decay=WEIGHT_DECAY)
        self.generator = torch.Generator().manual_seed(spec.seed)
        self.batch_size = int(options["batch_size"])
        self.epochs, self.patience = int(options["max_epochs"]), int(options["patience"])
        self.modules, self.optimizers, self.schedules = {"model": self.model}, [self.optimizer], []
        self.generators, self.buffers = {"batches": self.generator}, {}

    def epoch(self, epoch: int) -> dict[str, float]:
        train_loss = _epoch(self.model, self.data["train"], self.loss_fn, self.optimizer,
                            self.batch_size, self.generator)
        return {"train_loss": train_loss, "val_loss": _loss(self.model, self.data["val"],
                                                            self.loss_fn)}

    def weights(self) -> State:
        """The model's weights and the preprocessing (`ft.data.STATS_PREFIX` keys)."""
        return {**{k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()},
                **self.stats}

    def record(self, outcome: Outcome, wall_s: float) -> dict[str, Any]:
        """The training record of `outcome` (the kept weights are loaded into the model)."""
        spec, table, split = self.spec, self.table, self.split
        self.model.load_state_dict({k: v for k, v in outcome.best.items()
                                    if not k.startswith(STATS_PREFIX)})
        metric = "accuracy" if self.classification else "rmse"
        scale = float(self.stats["stats.target_std"])
        record = {
            "model": spec.name,
            "task": table.task,
            "metric": metric,
            "test_score": _score(self.model, self.data["test"], metric, scale),
            "val_score": _score(self.model, self.data["val"], metric, scale),
            "val_loss": outcome.best_value,
            "best_epoch": outcome.best_epoch,
            "epochs_run": outcome.epochs_run,
            "stopped_by": outcome.stopped_by,
            "split": {part: len(split[part]) for part in ("train", "val", "test")},
            "wall_s": round(wall_s, 3),
            "n_params": sum(p.numel() for p in self.model.parameters()),
            "hyperparameters": hyperparameters(spec, self.classification, len(split["train"])),
            "inputs": {"n_cont": len(table.continuous),
                       "cat_cardinalities": list(table.cardinalities),
                       "d_out": output_size(table)},
            "table": table.fingerprint,
            "device": str(self.device),
            "torch_threads": torch.get_num_threads(),
            "history": outcome.history,
        }
        if outcome.resumed_from is not None:
            record["resumed_from"] = outcome.resumed_from
        return record


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

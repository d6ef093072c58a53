"""The epoch loop every recipe trained here runs, and what a resume point holds.

A recipe (`Recipe`) builds its modules, optimiser, schedule and generators from the spec, and
says how one epoch trains and what it measures (`epoch`: the history entries of that epoch). The
loop (`run_epochs`) runs epochs 1..`epochs` in torch's global RNG seeded with the spec's seed
(forked: the caller's is left as it was), keeps the weights of the epoch with the lowest
`selection` entry (strictly lower: the first of equals; no `selection`: the last epoch's), the
weights after each epoch of `keep`
(0: before the first), stops early after `patience` epochs without a lower one (None: never),
reports its progress and writes resume points (`workers.models.trained.run`). Resumed, it
restores all of it (and the global RNG) and goes on from the point's epoch: the same bits as a
run never stopped.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import torch

from storage.errors import ExtractionError
from storage.markers import TrainingProgress
from workers.models.trained.run import TrainingRun

LOG = logging.getLogger(__name__)
State = dict[str, torch.Tensor]


def copy_weights(module: torch.nn.Module) -> State:
    """A detached copy of `module`'s state dict (weights and buffers)."""
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


class Recipe:
    """One training run's moving parts (see the module). A subclass sets `epochs`, `modules`
    (name -> module: every one a resume point saves), `optimizers`, `schedules`, `generators`
    and `buffers` (tensors it updates by assignment: a resume restores them by name), and
    defines `epoch` and `weights`."""

    epochs: int = 1
    patience: int | None = None
    device = torch.device("cpu")
    selection: str | None = "val_loss"  # the entry whose lowest value marks the kept epoch
    # (None: the last epoch is kept)
    score = "val_loss"  # the history entry the progress shows
    modules: dict[str, torch.nn.Module]
    optimizers: list[torch.optim.Optimizer]
    schedules: list[Any]
    generators: dict[str, torch.Generator]
    buffers: dict[str, torch.Tensor]

    def epoch(self, epoch: int) -> dict[str, float]:
        """Train one epoch and measure it: its history entries, `selection` among them."""
        raise NotImplementedError

    def weights(self) -> State:
        """A copy of the weights a checkpoint keeps."""
        raise NotImplementedError

    def state(self) -> tuple[State, dict[str, Any]]:
        """Everything a resume point holds of the recipe: tensors, and a JSON-able part. The
        optimisers' state is keyed by parameter name (a module's parameter groups may list
        their parameters in another order in another process)."""
        tensors: State = {}
        for name, module in self.modules.items():
            tensors.update({f"module.{name}.{k}": v for k, v in copy_weights(module).items()})
        names = self._parameter_names()
        groups = []
        for i, optimizer in enumerate(self.optimizers):
            for group in optimizer.param_groups:
                for parameter in group["params"]:
                    for key, value in optimizer.state.get(parameter, {}).items():
                        tensors[f"optimizer.{i}.{names[id(parameter)]}.{key}"] = (
                            value.detach().clone())
            groups.append([{k: v for k, v in g.items() if k != "params"}
                           for g in optimizer.param_groups])
        tensors.update({f"generator.{k}": g.get_state() for k, g in self.generators.items()})
        tensors.update({f"buffer.{k}": v.detach().clone() for k, v in self.buffers.items()})
        meta = {"param_groups": groups, "schedules": [s.state_dict() for s in self.schedules]}
        return tensors, meta

    def load_state(self, tensors: State, meta: dict[str, Any]) -> None:
        """Restore what `state` returned."""
        for name, module in self.modules.items():
            prefix = f"module.{name}."
            module.load_state_dict({k[len(prefix):]: v for k, v in tensors.items()
                                    if k.startswith(prefix)})
        names = self._parameter_names()
        for i, optimizer in enumerate(self.optimizers):
            saved: dict[str, dict[str, torch.Tensor]] = {}
            prefix = f"optimizer.{i}."
            for key, value in tensors.items():
                if key.startswith(prefix):
                    parameter, entry = key[len(prefix):].rsplit(".", 1)
                    saved.setdefault(parameter, {})[entry] = value.clone()
            for group, hyper in zip(optimizer.param_groups, meta["param_groups"][i], strict=True):
                group.update({k: tuple(v) if k == "betas" else v for k, v in hyper.items()})
                for parameter in group["params"]:
                    if names[id(parameter)] in saved:
                        optimizer.state[parameter] = saved[names[id(parameter)]]
        for schedule, state in zip(self.schedules, meta["schedules"], strict=True):
            schedule.load_state_dict(state)
        for name, generator in self.generators.items():
            generator.set_state(tensors[f"generator.{name}"])
        for name in self.buffers:
            self.buffers[name] = tensors[f"buffer.{name}"].clone()

    def _parameter_names(self) -> dict[int, str]:
        """id(parameter) -> `<module>.<parameter name>`, for every module's parameters."""
        names: dict[int, str] = {}
        for name, module in self.modules.items():
            for key, parameter in module.named_parameters():
                names.setdefault(id(parameter), f"{name}.{key}")
        return names


@dataclass
class Outcome:
    """What the loop leaves: the kept weights (`best`, of epoch `best_epoch`), the epochs kept,
    the history, how it ended, and for a resumed run the wall and CPU seconds spent before the
    resume (`earlier_s`: (0, 0) for a run from the start)."""

    best: State
    best_epoch: int
    best_value: float
    kept: dict[int, State]
    history: dict[str, list[float]]
    epochs_run: int
    stopped_by: str
    resumed_from: int | None
    earlier_s: tuple[float, float]


def run_epochs(recipe: Recipe, name: str, seed: int, keep: set[int],
               run: TrainingRun | None = None, started: tuple[float, float] | None = None
               ) -> Outcome:
    """Run `recipe` (see the module) as model `name`; ExtractionError when no epoch had a
    finite `selection` value (training diverged). `started`: the (perf_counter, process_time)
    the run's time counts from (default: now)."""
    run = run or TrainingRun()
    started, cpu = started or (time.perf_counter(), time.process_time())
    kept: dict[int, State] = {}
    history: dict[str, list[float]] = {}
    best: tuple[float, int, State | None] = (math.inf, 0, None)
    start, spent = 0, (0.0, 0.0)
    cuda = [recipe.device] if recipe.device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(seed)  # dropout, augmentation and anything else drawn
        point = run.resume_point()
        if point is not None:
            start, history, best, spent = _restore(recipe, *point)
        elif 0 in keep:
            kept[0] = recipe.weights()
            run.keep(0, kept[0])
        stopped_by, epoch = "epochs" if recipe.patience is None else "max_epochs", start
        for epoch in range(start + 1, recipe.epochs + 1):
            entries = recipe.epoch(epoch)
            for key, value in entries.items():
                history.setdefault(key, []).append(value)
            value = -math.inf if recipe.selection is None else entries[recipe.selection]
            if value < best[0] or recipe.selection is None:
                best = (value, epoch, recipe.weights())
            if epoch in keep:
                kept[epoch] = recipe.weights()
                run.keep(epoch, kept[epoch])
            if epoch % 10 == 0:
                LOG.info("%s: epoch %d, %s %.4f", name, epoch, recipe.score, entries[recipe.score])
            stop = recipe.patience is not None and epoch - best[1] >= recipe.patience
            last = stop or epoch == recipe.epochs
            if run.due(last):
                run.save_point(epoch, *_point(recipe, history, best,
                                              _spent(spent, started, cpu)))
            run.report(_progress(recipe, name, epoch, entries, best[1], start, run,
                                 _spent(spent, started, cpu)), last)
            if stop:
                stopped_by = "patience"
                break
    if best[2] is None:
        raise ExtractionError(f"model {name!r}: training diverged (no finite validation loss)")
    return Outcome(best[2], best[1], best[0], kept, history, epoch, stopped_by,
                   start or None, spent)


def _spent(before: tuple[float, float], started: float, cpu: float) -> tuple[float, float]:
    return (before[0] + time.perf_counter() - started, before[1] + time.process_time() - cpu)


def _point(recipe: Recipe, history: dict, best: tuple, spent: tuple[float, float]
           ) -> tuple[State, dict[str, Any]]:
    tensors, meta = recipe.state()
    tensors.update({f"best.{k}": v for k, v in (best[2] or {}).items()})
    tensors["rng.torch"] = torch.get_rng_state()
    if recipe.device.type == "cuda":
        tensors["rng.cuda"] = torch.cuda.get_rng_state(recipe.device)
    meta.update(history=history, best_value=best[0], best_epoch=best[1], wall_s=spent[0],
                cpu_s=spent[1])
    return tensors, meta


def _restore(recipe: Recipe, tensors: State, meta: dict[str, Any]
             ) -> tuple[int, dict, tuple, tuple[float, float]]:
    recipe.load_state(tensors, meta)
    torch.set_rng_state(tensors["rng.torch"])
    if "rng.cuda" in tensors:
        torch.cuda.set_rng_state(tensors["rng.cuda"], recipe.device)
    weights = {k[len("best."):]: v for k, v in tensors.items() if k.startswith("best.")}
    best = (float(meta["best_value"]), int(meta["best_epoch"]), weights or None)
    return int(meta["epoch"]), meta["history"], best, (meta["wall_s"], meta["cpu_s"])


def _progress(recipe: Recipe, name: str, epoch: int, entries: dict[str, float], best_epoch: int,
              start: int, run: TrainingRun, spent: tuple[float, float]) -> TrainingProgress:
    stop_by = (recipe.epochs if recipe.patience is None
               else min(recipe.epochs, best_epoch + recipe.patience))
    return TrainingProgress(
        model=name, epoch=epoch, epochs=recipe.epochs, early_stopping=recipe.patience is not None,
        stop_by=stop_by, score=recipe.score, value=float(entries[recipe.score]),
        elapsed_s=round(spent[0], 3), cpu_s=round(spent[1], 3), resumed_from=start or None,
        resume_point=run.resume_epoch, updated=time.time())

"""Seed replicates: a trained model's `seeds: [k, ...]` becomes one model per seed.

A model entry with `seeds` (a model the project trains: FT-Transformer today) is replaced, in
place, by the models `<name>@seed<k>`, one per seed in the order given, each with the option
`seed: k` (its split, preprocessing noise, initial weights, batch order and dropout all follow
from it) and the entry's other settings, its `control` included: `sweep.config.controls` then adds
`<name>@seed<k>@random-init` after each. `seed_groups` finds the replicates again from the names
alone (the report's across-seed table), as `sweep.config.controls.control_pairs` finds the controls.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from storage.errors import InputError

if TYPE_CHECKING:
    from sweep.config.schema import SweepConfig

SEED_NAME = re.compile(r"^(?P<model>.+)@seed(?P<seed>\d+)\Z")


def seed_name(model: str, seed: int) -> str:
    """The generated name of `model`'s replicate with seed `seed`: `<model>@seed<seed>`."""
    return f"{model}@seed{seed}"


def expand_seeds(config: SweepConfig, trained: Iterable[str]) -> SweepConfig:
    """`config` with every entry that has `seeds` replaced by its replicates (same settings,
    option `seed: k`, no `seeds`); `trained` names the entries whose models are trained by the
    project (only those may replicate). InputError names the first misuse."""
    trained = set(trained)
    models = {}
    for name, entry in config.models.items():
        if entry.seeds is None:
            models[name] = entry
            continue
        if name not in trained:
            raise InputError(f"models.{name}.seeds: only a model the project trains "
                             f"(ft-transformer, vit-digits) has seed replicates")
        if "seed" in entry.options:
            raise InputError(f"models.{name}.options.seed: give either `seed` or `seeds`, "
                             f"not both")
        for seed in entry.seeds:
            models[seed_name(name, seed)] = entry.model_copy(
                update={"seeds": None, "options": {**entry.options, "seed": seed}})
    return config.model_copy(update={"models": models})


def seed_groups(models: Iterable[str]) -> dict[str, list[tuple[int, str]]]:
    """Model name -> [(seed, replicate name), ...] for every model with replicates among
    `models` (controls are not replicates), in first-seen order."""
    groups: dict[str, list[tuple[int, str]]] = {}
    for name in models:
        match = SEED_NAME.match(name)
        if match:
            groups.setdefault(match["model"], []).append((int(match["seed"]), name))
    return groups

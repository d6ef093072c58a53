"""Random-initialisation controls: config entries that ask for one become a second model.

A model entry with `control: random-init` adds the model `<name>@random-init` right after it:
the same source, dataset, options and settings, plus the option `random_init: true`, so its spec
is the trained model's with `random_init=True` (same architecture and preprocessing, seeded
random weights, see `workers.models.random_init`) and its results are stored as a model group
of their own. Users cannot write '@' names or `random_init` themselves: the generated name is
the only way to a control, and `control_pairs` finds every pair again from the names alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from storage.errors import InputError

if TYPE_CHECKING:
    from sweep.config.schema import SweepConfig

CONTROLS = ("random-init",)  # values of a model entry's `control` key
SEPARATOR = "@"


def control_name(model: str, control: str = "random-init") -> str:
    """The generated name of `model`'s control: `<model>@<control>`."""
    return f"{model}{SEPARATOR}{control}"


def expand_controls(config: SweepConfig) -> SweepConfig:
    """`config` with each requested control added right after its model (same settings)."""
    models = {}
    for name, entry in config.models.items():
        if "random_init" in entry.options:
            raise InputError(
                f"models.{name}.options.random_init: not an option; write `control: random-init` "
                f"to add the control {control_name(name)!r}"
            )
        models[name] = entry
        if entry.control is not None:
            options = {**entry.options, "random_init": True}
            models[control_name(name, entry.control)] = entry.model_copy(
                update={"control": None, "options": options}
            )
    return config.model_copy(update={"models": models})


def control_pairs(models: Iterable[str]) -> list[tuple[str, str]]:
    """(model, control) for every control among `models` whose model is there too, in order."""
    names = list(models)
    present = set(names)
    pairs = []
    for name in names:
        for control in CONTROLS:
            if control_name(name, control) in present:
                pairs.append((name, control_name(name, control)))
    return pairs

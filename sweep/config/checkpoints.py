"""Checkpoints as a sweep axis: one model per training checkpoint, named by a rule.

A model the project trains (`vit-digits`, FT-Transformer) with `checkpoints: [0, 1, 5, best]`
becomes, in place, `<name>@epoch<k>` for each epoch k (option `checkpoint: k`: the weights after
epoch k of the one training run; 0 is the initialisation) followed by `<name>` itself, the
trained model as without the key (its best weights; `best` in the list names it, and it is
always kept). Every one of them carries `keep_epochs` (all the epochs listed), so the one training
run keeps them all. A Hugging Face model with `revision: [r1, r2]` becomes `<name>@rev-<r>` for each
revision (option `revision: r`: a hub revision, or a commit of a local folder that is a git
repository). Seed replicates expand first (`<name>@seed<s>@epoch<k>`) and controls before this
step: a control belongs to its model (`<name>@seed<s>@random-init`), not to a checkpoint; a
Hugging Face model's control is built from its last revision's config.

`checkpoint_groups` finds every trajectory again from the names alone (the report's "tightness
over training"), as `sweep.config.seeds.seed_groups` finds the replicates.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from storage.errors import InputError

if TYPE_CHECKING:
    from sweep.config.schema import SweepConfig

BEST = "best"
CHECKPOINT_NAME = re.compile(r"^(?P<model>.+)@(?:epoch(?P<epoch>\d+)|rev-(?P<revision>.+))\Z")


def epoch_name(model: str, epoch: int) -> str:
    """The generated name of `model`'s weights after epoch `epoch`: `<model>@epoch<k>`."""
    return f"{model}@epoch{epoch}"


def revision_name(model: str, revision: str) -> str:
    """The generated name of `model` at Hugging Face revision `revision`: `<model>@rev-<r>`."""
    return f"{model}@rev-{revision}"


def expand_checkpoints(config: SweepConfig, trained: Iterable[str]) -> SweepConfig:
    """`config` with every entry that has `checkpoints` or `revision` replaced by one model per
    checkpoint (see the module); `trained` names the entries whose models the project trains.
    InputError names the first misuse."""
    trained = set(trained)
    models = {}
    for name, entry in config.models.items():
        control = "random_init" in entry.options
        if entry.checkpoints is not None:
            models.update(_epochs(name, entry, name in trained, control))
        elif entry.revision is not None:
            models.update(_revisions(name, entry, control))
        else:
            models[name] = entry
    return config.model_copy(update={"models": models})


def _epochs(name: str, entry, trained: bool, control: bool) -> dict:
    if not trained:
        raise InputError(f"models.{name}.checkpoints: only a model the project trains "
                         f"(vit-digits, ft-transformer) has epochs; a Hugging Face model's "
                         f"published checkpoints are its `revision:` list")
    epochs = sorted({c for c in entry.checkpoints if c != BEST})
    if control:  # the control is the initialisation: it has no checkpoints
        return {name: entry.model_copy(update={"checkpoints": None})}
    for key in ("checkpoint", "keep_epochs"):
        if key in entry.options:
            raise InputError(f"models.{name}.options.{key}: set by `checkpoints:`; give the "
                             f"epochs there")
    options = {**entry.options, "keep_epochs": epochs}
    out = {epoch_name(name, k): entry.model_copy(
        update={"checkpoints": None, "control": None, "options": {**options, "checkpoint": k}})
        for k in epochs}
    out[name] = entry.model_copy(update={"checkpoints": None, "options": options})
    return out


def _revisions(name: str, entry, control: bool) -> dict:
    if "revision" in entry.options:
        raise InputError(f"models.{name}.options.revision: give the revisions as the model's "
                         f"`revision:` list")
    if control:  # one control, from the last revision's config
        options = {**entry.options, "revision": entry.revision[-1]}
        return {name: entry.model_copy(update={"revision": None, "options": options})}
    return {revision_name(name, r): entry.model_copy(
        update={"revision": None, "control": None, "options": {**entry.options, "revision": r}})
        for r in entry.revision}


def checkpoint_groups(models: Iterable[str]) -> dict[str, list[tuple[str, str]]]:
    """Model name -> [(checkpoint label, model name), ...] for every trajectory among `models`:
    labels `epoch <k>` in epoch order, then `best` (the model itself, when present), or
    `rev <r>` in first-seen order. Controls are not checkpoints."""
    names = list(models)
    groups: dict[str, list[tuple[str, str]]] = {}
    for name in names:
        match = CHECKPOINT_NAME.match(name)
        if match and not name.endswith("@random-init"):
            label = (f"epoch {int(match['epoch'])}" if match["epoch"] is not None
                     else f"rev {match['revision']}")
            groups.setdefault(match["model"], []).append((label, name))
    present = set(names)
    for model, members in groups.items():
        members.sort(key=lambda m: int(m[0][6:]) if m[0].startswith("epoch ") else 0)
        if model in present:
            members.append((BEST, model))
    return groups

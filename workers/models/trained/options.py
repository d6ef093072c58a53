"""What the options of every family trained here share: defaults filled in, the rules of the
shared options, the epochs a training run keeps, and the options that determine training.

Pure (no torch): the registry checks options at resolve time with each family's `check`, which
calls `filled` with its own defaults and a rule that falls back on `shared_rule`.

Shared options:
    val_fraction, test_fraction   shares of the rows held out, each in (0, 0.5)
    split         test: measure attention on the held-out test rows; all: on every row
    checkpoint    k: measure the weights after epoch k (0: the initial weights) of the training
                  run instead of the kept ones; null: the kept ones
    keep_epochs   the epochs whose weights training keeps beside the kept ones (a sweep's
                  `checkpoints:` sets it; it changes what is written, not the weights)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from storage.errors import InputError

SPLITS = ("test", "all")
MEASUREMENT_ONLY = ("split", "checkpoint", "keep_epochs")
"""What is measured (or kept), not how it is trained: outside the checkpoint's key."""


def filled(name: str, options: dict[str, Any], defaults: dict[str, Any],
           rule: Callable[[str, Any], str | None],
           optional: Iterable[str] = ()) -> dict[str, Any]:
    """`options` over `defaults`, each value checked by `rule` (the rule it breaks, or None);
    InputError names an unknown option or the first bad value (a model trained here).
    `optional`: options accepted but never filled in."""
    unknown = sorted(set(options) - set(defaults) - set(optional))
    if unknown:
        raise InputError(f"model {name!r}: unknown option(s) {unknown}; valid: {sorted(defaults)}")
    config = {**defaults, **options}
    for key, value in config.items():
        broken = rule(key, value)
        if broken:
            raise InputError(f"model {name!r}: option {key}={value!r} must be {broken}")
    return config


def check_epochs(name: str, config: dict[str, Any], last: str) -> None:
    """`keep_epochs` made a sorted tuple without repeats (in place); InputError when it or
    `checkpoint` names an epoch past option `last` (the last epoch trained)."""
    if "keep_epochs" in config:
        config["keep_epochs"] = tuple(sorted(set(config["keep_epochs"])))
    late = [e for e in [*config.get("keep_epochs", ()), config.get("checkpoint") or 0]
            if e > config[last]]
    if late:
        raise InputError(f"model {name!r}: checkpoint epoch {late[0]} is past the last epoch "
                         f"trained ({last}={config[last]})")


def shared_rule(key: str, value: Any) -> str | None:
    """The rule `value` breaks for a shared option `key` (else: an integer >= 1), or None."""
    integer = isinstance(value, int) and not isinstance(value, bool)
    if key.endswith("_fraction"):
        number = isinstance(value, int | float) and not isinstance(value, bool)
        return None if number and 0 < value < 0.5 else "in (0, 0.5)"
    if key == "split":
        return None if value in SPLITS else f"one of {list(SPLITS)}"
    if key == "checkpoint":
        return None if value is None or (integer and value >= 0) else "null or an epoch >= 0"
    if key == "keep_epochs":
        valid = isinstance(value, list | tuple) and all(
            isinstance(e, int) and not isinstance(e, bool) and e >= 0 for e in value)
        return None if valid else "a list of epochs >= 0"
    return None if integer and value >= 1 else "an integer >= 1"


def kept_epochs(options: dict[str, Any]) -> set[int]:
    """The epochs a training run keeps for these options: `keep_epochs` and `checkpoint`."""
    checkpoint = options.get("checkpoint")
    return set(options.get("keep_epochs", ())) | ({checkpoint} if checkpoint is not None
                                                  else set())


def training_options(options: dict[str, Any],
                     measurement_only: Iterable[str] = MEASUREMENT_ONLY) -> dict[str, Any]:
    """The options that determine training (all but `measurement_only`): a checkpoint's key."""
    skipped = set(measurement_only)
    return {k: v for k, v in options.items() if k not in skipped}

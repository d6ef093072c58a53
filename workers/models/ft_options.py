"""FT-Transformer options: their defaults, their rules, and the layers a spec measures.

Pure (no torch): the registry validates options at resolve time with `check`, and the driver
sizes an FT model's store from its spec with `measured_layers`, without building it.

Options (a `ModelSpec`'s `config`):
    n_blocks      1..6; the library's default architecture for that depth (3: the paper's)
    d_block       null (the library's width for `n_blocks`: 192 at 3 blocks, the paper's) or a
                  multiple of 8 (8 heads)
    preprocessing quantile (the paper's: QuantileTransformer to a normal distribution, fitted on
                  the training rows with 1e-5 noise, as the package example) or standard
                  (mean and std of the training rows)
    max_epochs    cap on training epochs; set it so that `patience`, not the cap, ends training
    patience      epochs without a lower validation loss before training stops (16: the paper)
    batch_size    training rows per AdamW step (256: the paper's for its smallest datasets, and
                  the package example's; docs/ft-transformer.md)
    val_fraction, test_fraction   shares of the table's rows held out, each in (0, 0.5)
    split         test: measure attention on the held-out test rows; all: on every row
    last_block    skip: measure the blocks that compute every query row (n_blocks - 1 layers);
                  full: also the last block, whose non-CLS rows are recomputed (the library
                  computes only the CLS row there). See docs/ft-transformer.md.
Optional (no default; a sweep's `checkpoints:` sets them, docs/training.md):
    checkpoint    k: measure the weights after epoch k of the training run (0: the initial
                  weights) instead of the kept (best) ones
    keep_epochs   the epochs whose weights training keeps beside the best
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from storage.errors import InputError

HEADS = 8  # attention_n_heads of the library's default configurations
SPLITS = ("test", "all")
LAST_BLOCKS = ("skip", "full")
PREPROCESSINGS = ("quantile", "standard")
MEASUREMENT_ONLY = ("split", "last_block", "checkpoint", "keep_epochs")  # what is measured (or
# kept), not how it is trained: outside the checkpoint's key
OPTIONAL = ("checkpoint", "keep_epochs")  # accepted, never filled in (specs without them unchanged)

DEFAULTS: dict[str, Any] = {
    "n_blocks": 3,
    "d_block": None,
    "preprocessing": "quantile",
    "max_epochs": 1000,
    "patience": 16,
    "batch_size": 256,
    "val_fraction": 0.2,
    "test_fraction": 0.2,
    "split": "test",
    "last_block": "skip",
}


def check(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """Every option filled in from `DEFAULTS` and checked; InputError names the first bad one.

    `name` is the model's name, for the message.
    """
    config = filled(name, options, DEFAULTS, _rule, OPTIONAL)
    check_epochs(name, config, "max_epochs")
    if config["last_block"] == "skip" and config["n_blocks"] < 2:
        raise InputError(
            f"model {name!r}: option last_block='skip' needs n_blocks >= 2 (it would leave no "
            f"layer to measure); use n_blocks >= 2 or last_block: full"
        )
    return config


def filled(name: str, options: dict[str, Any], defaults: dict[str, Any],
           rule: Callable[[str, Any], str | None],
           optional: Iterable[str] = ()) -> dict[str, Any]:
    """`options` over `defaults`, each value checked by `rule` (the rule it breaks, or None);
    InputError names an unknown option or the first bad value (a model trained here)."""
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


def _rule(key: str, value: Any) -> str | None:
    """The rule `value` breaks for option `key`, or None when it is valid."""
    integer = isinstance(value, int) and not isinstance(value, bool)
    if key.endswith("_fraction"):
        number = isinstance(value, int | float) and not isinstance(value, bool)
        return None if number and 0 < value < 0.5 else "in (0, 0.5)"
    if key == "checkpoint":
        return None if integer and value >= 0 else "an epoch >= 0"
    if key == "keep_epochs":
        valid = isinstance(value, list | tuple) and all(
            isinstance(e, int) and not isinstance(e, bool) and e >= 0 for e in value)
        return None if valid else "a list of epochs >= 0"
    if key == "split":
        return None if value in SPLITS else f"one of {list(SPLITS)}"
    if key == "last_block":
        return None if value in LAST_BLOCKS else f"one of {list(LAST_BLOCKS)}"
    if key == "preprocessing":
        return None if value in PREPROCESSINGS else f"one of {list(PREPROCESSINGS)}"
    if key == "n_blocks":
        return None if integer and 1 <= value <= 6 else "an integer >= 1 and <= 6"
    if key == "d_block":
        valid = value is None or (integer and value >= HEADS and value % HEADS == 0)
        return None if valid else f"null or a positive multiple of {HEADS} (the heads)"
    return None if integer and value >= 1 else "an integer >= 1"


def measured_layers(options: dict[str, Any]) -> int:
    """Attention layers an FT spec's extraction yields: n_blocks, less one with last_block skip."""
    return int(options["n_blocks"]) - (options["last_block"] == "skip")


def training_options(options: dict[str, Any]) -> dict[str, Any]:
    """The options that determine training (all but `MEASUREMENT_ONLY`): a checkpoint's key."""
    return {k: v for k, v in options.items() if k not in MEASUREMENT_ONLY}

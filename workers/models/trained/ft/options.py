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
    val_fraction, test_fraction, split   shared (`workers.models.trained.options`)
    last_block    skip: measure the blocks that compute every query row (n_blocks - 1 layers);
                  full: also the last block, whose non-CLS rows are recomputed (the library
                  computes only the CLS row there). See docs/ft-transformer.md.
Optional (no default; a sweep's `checkpoints:` sets them, docs/training.md): `checkpoint` and
`keep_epochs`, shared (`workers.models.trained.options`).
"""

from __future__ import annotations

from typing import Any

from storage.errors import InputError
from workers.models.trained.options import check_epochs, filled, shared_rule

HEADS = 8  # attention_n_heads of the library's default configurations
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


def _rule(key: str, value: Any) -> str | None:
    """The rule `value` breaks for option `key`, or None when it is valid."""
    integer = isinstance(value, int) and not isinstance(value, bool)
    if key == "checkpoint":  # optional: never null (a spec without it is the kept weights)
        return None if integer and value >= 0 else "an epoch >= 0"
    if key == "last_block":
        return None if value in LAST_BLOCKS else f"one of {list(LAST_BLOCKS)}"
    if key == "preprocessing":
        return None if value in PREPROCESSINGS else f"one of {list(PREPROCESSINGS)}"
    if key == "n_blocks":
        return None if integer and 1 <= value <= 6 else "an integer >= 1 and <= 6"
    if key == "d_block":
        valid = value is None or (integer and value >= HEADS and value % HEADS == 0)
        return None if valid else f"null or a positive multiple of {HEADS} (the heads)"
    return shared_rule(key, value)


def measured_layers(options: dict[str, Any]) -> int:
    """Attention layers an FT spec's extraction yields: n_blocks, less one with last_block skip."""
    return int(options["n_blocks"]) - (options["last_block"] == "skip")

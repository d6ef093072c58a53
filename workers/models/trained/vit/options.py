"""The digits ViT's options: their defaults, their rules, and which of them determine training.

Pure (no torch): the registry checks options at resolve time with `check`; the checkpoint's key
is `workers.models.trained.options.training_options` (every option but the measurement-only
ones).

Options (a `ModelSpec`'s `config`):
    depth, embed_dim, num_heads, mlp_ratio   the timm VisionTransformer (embed_dim a multiple
                  of num_heads)
    patch_size    pixels per patch side; must divide the image side (8): 2 gives 16 patches
    reg_tokens    register tokens after CLS (0: none)
    epochs        training epochs (the one-cycle schedule spans them all)
    batch_size, lr, weight_decay   AdamW with a one-cycle learning rate peaking at `lr`
    val_fraction, test_fraction    shares of the digits held out, each in (0, 0.5)
    split         test: measure attention on the held-out test images; all: on every image
    checkpoint    null: the kept weights (the epoch of lowest validation loss, "best"); k: the
                  weights after epoch k (0: the initial weights) of the same training run
    keep_epochs   the epochs whose weights training keeps beside the best (a sweep's
                  `checkpoints:` sets it; it changes what is written, not the weights)
"""

from __future__ import annotations

from typing import Any

from storage.errors import InputError
from workers.models.trained.options import check_epochs, filled, shared_rule

IMAGE_SIDE = 8  # scikit-learn's digits

DEFAULTS: dict[str, Any] = {
    "depth": 4,
    "embed_dim": 64,
    "num_heads": 4,
    "mlp_ratio": 2.0,
    "patch_size": 2,
    "reg_tokens": 0,
    "epochs": 40,
    "batch_size": 32,
    "lr": 3e-3,
    "weight_decay": 0.05,
    "val_fraction": 0.1,
    "test_fraction": 0.2,
    "split": "test",
    "checkpoint": None,
    "keep_epochs": (),
}


def check(name: str, options: dict[str, Any]) -> dict[str, Any]:
    """Every option filled in from `DEFAULTS` and checked; InputError names the first bad one.
    `keep_epochs` comes back a sorted tuple, without repeats."""
    config = filled(name, options, DEFAULTS, _rule)
    if config["embed_dim"] % config["num_heads"]:
        raise InputError(f"model {name!r}: option embed_dim={config['embed_dim']} must be a "
                         f"multiple of num_heads={config['num_heads']}")
    if IMAGE_SIDE % config["patch_size"]:
        raise InputError(f"model {name!r}: option patch_size={config['patch_size']} must divide "
                         f"the image side ({IMAGE_SIDE} px)")
    check_epochs(name, config, "epochs")
    return config


def _rule(key: str, value: Any) -> str | None:
    """The rule `value` breaks for option `key`, or None when it is valid."""
    integer = isinstance(value, int) and not isinstance(value, bool)
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if key in ("lr", "mlp_ratio"):
        return None if number and value > 0 else "a number > 0"
    if key == "weight_decay":
        return None if number and value >= 0 else "a number >= 0"
    if key == "reg_tokens":
        return None if integer and value >= 0 else "an integer >= 0"
    return shared_rule(key, value)


def n_tokens(options: dict[str, Any]) -> int:
    """Tokens of every input: CLS, the registers, then (side / patch)^2 patches."""
    return 1 + int(options["reg_tokens"]) + (IMAGE_SIDE // int(options["patch_size"])) ** 2

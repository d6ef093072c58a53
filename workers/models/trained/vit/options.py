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
Optional (no default: a spec without it is the supervised recipe, its key unchanged):
    objective     supervised (cross-entropy on the labels), dino (self-distillation without
                  labels: `vit.dino`) or distilled (a distillation token taught by a supervised
                  teacher, timm's `VisionTransformerDistilled`: `vit.distilled`; no registers)
"""

from __future__ import annotations

from typing import Any

from storage.errors import InputError
from workers.models.trained.options import check_epochs, filled, shared_rule

IMAGE_SIDE = 8  # scikit-learn's digits
OBJECTIVES = ("supervised", "dino", "distilled")
OPTIONAL = ("objective",)  # accepted, never filled in (specs without it unchanged)

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
    config = filled(name, options, DEFAULTS, _rule, OPTIONAL)
    if config.get("objective") == "supervised":  # the default, named: the same spec
        del config["objective"]
    if config["embed_dim"] % config["num_heads"]:
        raise InputError(f"model {name!r}: option embed_dim={config['embed_dim']} must be a "
                         f"multiple of num_heads={config['num_heads']}")
    if IMAGE_SIDE % config["patch_size"]:
        raise InputError(f"model {name!r}: option patch_size={config['patch_size']} must divide "
                         f"the image side ({IMAGE_SIDE} px)")
    if objective(config) == "distilled" and config["reg_tokens"]:
        raise InputError(f"model {name!r}: objective distilled reads CLS and DIST tokens only; "
                         f"use reg_tokens: 0")
    check_epochs(name, config, "epochs")
    return config


def objective(options: dict[str, Any]) -> str:
    """The training objective of these options (`supervised` without the option)."""
    return options.get("objective", "supervised")


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
    if key == "objective":
        return None if value in OBJECTIVES else f"one of {list(OBJECTIVES)}"
    return shared_rule(key, value)


def n_tokens(options: dict[str, Any]) -> int:
    """Tokens of every input: CLS, DIST (objective distilled) or the registers, then
    (side / patch)^2 patches."""
    prefix = 2 if objective(options) == "distilled" else 1 + int(options["reg_tokens"])
    return prefix + (IMAGE_SIDE // int(options["patch_size"])) ** 2

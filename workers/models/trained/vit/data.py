"""The digits ViT's view of the digits: pixels as the model reads them, the seeded split and the
seeded initial model.

Training and extraction read the same pixels: each digit as `workers.inputs.images.digit_pixels`
makes it (the 8 x 8 uint8 image `sweep show` draws), scaled to [-1, 1] by `to_model`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from timm.models.deit import VisionTransformerDistilled
from timm.models.vision_transformer import VisionTransformer

from storage.errors import InputError
from workers.inputs import Table
from workers.inputs.images import digit_pixels
from workers.models.trained.vit.options import IMAGE_SIDE, objective


def to_model(pixels: np.ndarray) -> torch.Tensor:
    """(images, 8, 8) uint8 -> (images, 1, 8, 8) float32 in [-1, 1]: what the model reads."""
    x = torch.as_tensor(np.asarray(pixels, dtype=np.uint8), dtype=torch.float32)
    return (x / 255.0 * 2.0 - 1.0).unsqueeze(1)


def table_images(table: Table) -> torch.Tensor:
    """Every row of the digits table as the model reads it: (rows, 1, 8, 8) float32."""
    if table.features.shape[1] != IMAGE_SIDE * IMAGE_SIDE:
        raise InputError(f"a table of {table.features.shape[1]} features is not {IMAGE_SIDE} x "
                         f"{IMAGE_SIDE} images: the digits ViT reads sklearn:digits")
    return to_model(np.stack([digit_pixels(row) for row in table.features]))


def n_classes(table: Table) -> int:
    """The classes of the labels (every row's)."""
    return int(table.target.max()) + 1


def architecture(options: dict[str, Any], classes: int) -> dict[str, Any]:
    """The timm VisionTransformer's keyword arguments: CLS token, its registers, greyscale."""
    return {"img_size": IMAGE_SIDE, "patch_size": int(options["patch_size"]), "in_chans": 1,
            "num_classes": classes, "embed_dim": int(options["embed_dim"]),
            "depth": int(options["depth"]), "num_heads": int(options["num_heads"]),
            "mlp_ratio": float(options["mlp_ratio"]), "reg_tokens": int(options["reg_tokens"]),
            "class_token": True, "global_pool": "token"}


def init_model(options: dict[str, Any], seed: int, classes: int) -> VisionTransformer:
    """The architecture with its initial weights drawn from `seed` alone (torch's global RNG is
    left as it was), fused attention off in every block (so the probabilities pass `attn_drop`):
    what training starts from, epoch 0, and the random-init control. Objective `distilled`:
    timm's `VisionTransformerDistilled` (a DIST token after CLS, and its head)."""
    kind = VisionTransformerDistilled if objective(options) == "distilled" else VisionTransformer
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = kind(**architecture(options, classes))
    for block in model.blocks:
        block.attn.fused_attn = False
    return model

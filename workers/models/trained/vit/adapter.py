"""The `vit-trained` family (preset `vit-digits`): trained by the project, cached, measured on the
held-out digits.

Checkpoint cache (`workers.models.trained.cache`, read or trained by
`workers.models.trained.family`): `vit-trained-<digest>.safetensors` (the best weights), `.json`
(the training record) and `vit-trained-<digest>.epoch-<k>.safetensors` (the weights after epoch
k, for the epochs a spec keeps: option `keep_epochs`, and `checkpoint`). Training is
bit-reproducible, so an epoch asked for later is trained again and written beside the others. A
random-init control (`spec.random_init`) is the seeded initial model training starts from
(epoch 0's weights), never trained.

Inputs (`model_dataset`): the test digits of the spec's split (`split: test`), or all. Tokens:
CLS, the registers, then the patches row-major.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from storage.errors import InputError
from storage.location import StoreLike
from workers.exact.token_kinds import TokenKind
from workers.inputs import Dataset, Table
from workers.models.extraction import Batch
from workers.models.registry import ModelSpec
from workers.models.timm_ import VisionTransformerExtractor, prefix_kinds
from workers.models.token_layout import TokenLayout
from workers.models.trained.family import TrainedFamily
from workers.models.trained.options import MEASUREMENT_ONLY
from workers.models.trained.vit.data import init_model, n_classes, to_model
from workers.models.trained.vit.options import n_tokens


class DigitsViTFamily(TrainedFamily):
    """The digits ViT's checkpoints (`workers.models.trained.family`)."""

    measurement_only = MEASUREMENT_ONLY
    recipe = "workers.models.trained.vit.training"

    def table(self, spec: ModelSpec, dataset: Dataset | None) -> Table:
        if dataset is None or dataset.table is None or dataset.kind != "image":
            raise InputError(f"model {spec.name!r} needs the digits as images (dataset `kind: "
                             f"image`, `source: sklearn:digits`): it is trained on them")
        return dataset.table


FAMILY = DigitsViTFamily()
ensure_checkpoint, prepare, model_dataset = (FAMILY.ensure_checkpoint, FAMILY.prepare,
                                             FAMILY.model_dataset)


def token_layout(spec: ModelSpec, dataset: Dataset | None) -> TokenLayout:
    """`depth` layers of `num_heads` heads over CLS, registers and patches: from the options."""
    o = spec.options
    return TokenLayout(int(o["depth"]), int(o["num_heads"]), tokens=n_tokens(o),
                       head_dim=int(o["embed_dim"]) // int(o["num_heads"]))


def seen_image(spec: ModelSpec, image: Any) -> tuple[np.ndarray, int]:
    """The digit as the model reads it ((8, 8, 3) uint8: its grey levels) and the patch side."""
    grey = np.asarray(image.convert("L"), dtype=np.uint8)
    return np.repeat(grey[:, :, None], 3, axis=2), int(spec.options["patch_size"])


class TrainedViTExtractor(VisionTransformerExtractor):
    """A trained digits ViT at one of its checkpoints (or its random-init control)."""

    def __init__(self, spec: ModelSpec, dataset: Dataset, cache: StoreLike,
                 device: torch.device, dtype: torch.dtype) -> None:
        self.spec, self.device, self.dtype = spec, device, dtype
        table = FAMILY.table(spec, dataset)
        self.model = init_model(spec.options, spec.seed, n_classes(table))
        if not spec.random_init:
            self.model.load_state_dict(ensure_checkpoint(spec, dataset, cache)[0])
        self.model.eval().to(device=device, dtype=dtype)
        self.n_layers = len(self.model.blocks)
        patches = int(self.model.patch_embed.num_patches)
        self.kinds = np.array([*prefix_kinds(self.model), *[TokenKind.CONTENT] * patches],
                              dtype=np.int8)

    def prepare(self, items: Sequence[Any]) -> Batch:
        pixels = np.stack([np.asarray(image.convert("L"), dtype=np.uint8) for image in items])
        positions = [torch.arange(len(self.kinds))] * len(items)
        inputs = {"x": to_model(pixels).to(self.device, self.dtype)}  # (batch, 1, 8, 8)
        return Batch(inputs, positions, [self.kinds] * len(items))


def build_extractor(spec: ModelSpec, dataset: Dataset | None, cache: StoreLike,
                    device: torch.device, dtype: torch.dtype) -> TrainedViTExtractor:
    """The family's entry in `workers.models.registry.FAMILY_MODULES`."""
    FAMILY.table(spec, dataset)
    return TrainedViTExtractor(spec, dataset, cache, device, dtype)

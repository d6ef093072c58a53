"""timm ViT/DeiT (incl. distilled): fused attention switched off per block, captured per layer.

timm runs `scaled_dot_product_attention` unless a block's `fused_attn` is False; then every
block computes `softmax(q k^T * scale)` and passes it through `attn_drop`, whose forward hook
sees the (batch, heads, query, key) probabilities. The switch is set explicitly on each block
and checked after loading (never via the import-time TIMM_FUSED_ATTN global).

Option `image_size` creates the model with `img_size` (timm resamples loaded position embeddings
to it); a random-init control (`spec.random_init`) is `create_model(pretrained=False)` of the
same architecture and tag (so the same preprocessing), seeded from `control_seed(spec.seed)`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import timm
import torch
from timm.models.deit import VisionTransformerDistilled
from timm.models.vision_transformer import VisionTransformer

from storage.errors import ExtractionError, InputError
from workers.exact.token_kinds import TokenKind
from workers.models.extraction import Batch, Extractor, Sink, stack_into
from workers.models.random_init import control_seed, seeded
from workers.models.registry import ModelSpec
from workers.models.token_layout import TokenLayout


def build_model(spec: ModelSpec) -> torch.nn.Module:
    """The timm model of `spec` (hub weights, a local safetensors file, or random init), eval."""
    if not timm.is_model(spec.source):
        close = timm.list_models(f"*{spec.source.split('.')[0][:12]}*")[:8]
        raise InputError(f"timm model {spec.source!r} is unknown; similar names: {close}")
    overrides = spec.options
    if "image_size" in overrides:
        overrides["img_size"] = overrides.pop("image_size")
    try:
        if spec.random_init:
            with seeded(control_seed(spec.seed)):
                model = timm.create_model(spec.source, pretrained=False, **overrides)
        elif spec.weights:
            model = timm.create_model(
                spec.source, pretrained=True, pretrained_cfg_overlay={"file": spec.weights},
                **overrides,
            )
        elif spec.pretrained:
            model = timm.create_model(spec.source, pretrained=True, **overrides)
        else:
            with seeded(spec.seed):
                model = timm.create_model(spec.source, pretrained=False, **overrides)
    except (OSError, RuntimeError) as error:
        message = " ".join(str(error).split())[:300]
        raise InputError(f"model {spec.name!r}: cannot load {spec.source!r}: {message}") from error
    if not isinstance(model, VisionTransformer):
        raise ExtractionError(
            f"model {spec.name!r} is a {type(model).__name__}: only timm VisionTransformer "
            "models (ViT, DeiT, distilled DeiT) are supported"
        )
    for block in model.blocks:
        block.attn.fused_attn = False
    return model.eval()


def prefix_kinds(model: VisionTransformer) -> tuple[TokenKind, ...]:
    """Kinds of the tokens before the patches: CLS, then DIST (distilled) or registers."""
    if isinstance(model, VisionTransformerDistilled):
        kinds = (TokenKind.CLS, TokenKind.DIST)
    else:
        kinds = (TokenKind.CLS,) * int(model.has_class_token)
        kinds += (TokenKind.REGISTER,) * int(model.num_reg_tokens)
    if len(kinds) != model.num_prefix_tokens:
        raise ExtractionError(
            f"timm {type(model).__name__}: {model.num_prefix_tokens} prefix tokens, layout "
            f"{kinds} expected: unsupported token layout"
        )
    return kinds


class VisionTransformerExtractor(Extractor):
    """What every timm VisionTransformer shares (`model`, `kinds`, `device`, `dtype` set by the
    subclass, which prepares its batches): one token layout per input, the attention
    probabilities from each block's `attn_drop`, `forward_features` on `x`."""

    model: VisionTransformer
    kinds: np.ndarray

    def token_counts(self, items: Sequence[Any]) -> list[int]:
        return [len(self.kinds)] * len(items)

    def install_hooks(self, sink: Sink) -> list[torch.utils.hooks.RemovableHandle]:
        def hook(module: torch.nn.Module, args: Any, output: torch.Tensor) -> None:
            sink(output)  # (batch, heads, query, key)

        return [b.attn.attn_drop.register_forward_hook(hook) for b in self.model.blocks]

    def forward(self, batch: Batch) -> Any:
        return self.model.forward_features(batch.inputs["x"])


class TimmExtractor(VisionTransformerExtractor):
    """A timm VisionTransformer."""

    independent_inputs = True  # its transform takes one image at a time

    def __init__(self, spec: ModelSpec, device: torch.device, dtype: torch.dtype) -> None:
        self.spec, self.device, self.dtype = spec, device, dtype
        self.model = build_model(spec).to(device=device, dtype=dtype)
        self.n_layers = len(self.model.blocks)
        unfused = [b for b in self.model.blocks if getattr(b.attn, "fused_attn", True) is False]
        if len(unfused) != self.n_layers:
            raise ExtractionError(
                f"model {spec.name!r}: {self.n_layers - len(unfused)} blocks still use fused "
                "attention, which returns no probabilities: set block.attn.fused_attn = False"
            )
        config = timm.data.resolve_model_data_config(self.model)
        # The model's own size: a pretrained_cfg keeps 224 px when `img_size` is overridden.
        config["input_size"] = (3, *self.model.patch_embed.img_size)
        self.transform = timm.data.create_transform(**config, is_training=False)
        n_patches = int(self.model.patch_embed.num_patches)
        self.kinds = np.array(
            [*prefix_kinds(self.model), *[TokenKind.CONTENT] * n_patches], dtype=np.int8
        )

    def prepare(self, items: Sequence[Any]) -> Batch:
        return self.prepare_into(items, None)

    def prepare_into(self, items: Sequence[Any], out: dict[str, torch.Tensor] | None) -> Batch:
        pixels = stack_into([self.transform(image) for image in items],
                            (out or {}).get("x"))  # (batch, 3, H, W)
        positions = [torch.arange(len(self.kinds))] * len(items)
        inputs = {"x": pixels.to(self.device, self.dtype)}
        return Batch(inputs, positions, [self.kinds] * len(items))


def build_extractor(spec: ModelSpec, dataset: Any, cache_dir: Path, device: torch.device,
                    dtype: torch.dtype) -> TimmExtractor:
    """The family's entry in `workers.models.registry.FAMILY_MODULES` (no dataset or cache
    needed)."""
    return TimmExtractor(spec, device, dtype)


def token_layout(spec: ModelSpec, dataset: Any) -> TokenLayout:
    """Blocks, heads, head width and tokens of `spec`: the architecture built on torch's `meta`
    device (no memory, no initialisation, no weights), since timm derives the patch grid and
    prefix tokens from its entrypoint's arguments and exposes them nowhere else."""
    with torch.device("meta"):
        model = build_model(replace(spec, pretrained=False, weights=None))
    attn = model.blocks[0].attn
    return TokenLayout(len(model.blocks), int(attn.num_heads),
                       tokens=len(prefix_kinds(model)) + int(model.patch_embed.num_patches),
                       head_dim=int(attn.head_dim))

"""A model's size from its spec alone: layers and tokens per input, with no weights and no inputs.

The driver sizes the store with this before any task runs, so it must stay cheap: O(1) per model
for images and tables, one tokenizer pass (no model) for text. One function per family, in
`LAYOUTS`:

- `hf`: the model's config (`config.json`, or the tiny preset's config) gives the layers; text
  counts each input's tokens with the model's own tokenizer; images run the model's own image
  processor on two small synthetic pictures (never on an input) and take the patch grid and the
  prefix tokens (CLS, registers, DIST) the adapter lays out. The adapter's own preprocessing
  methods do this, on an adapter that has no model, so the plan and extraction cannot drift apart.
- `timm`: the architecture is built on torch's `meta` device (no memory, no weights: timm derives
  the patch grid and prefix tokens from its entrypoint's arguments, which it exposes nowhere else).
- `ft-transformer`: CLS + one token per feature of the table; `n_blocks` layers. Nothing trained.

Every layout also gives the heads of each layer (`n_heads`): the store keeps that many maps per
layer for a model whose `heads` option is `each`.

`needs_preparation(spec)` says whether a model has work to do before extraction (training).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from storage.errors import InputError
from workers.models import ModelSpec
from workers.models.ft_options import HEADS, measured_layers

# Synthetic pictures the image processor runs on: portrait and landscape, like real inputs.
PROBE_SIZES = ((640, 427), (427, 640))


@dataclass(frozen=True)
class TokenLayout:
    """Layers and attention heads per layer of a model, and the real tokens of its inputs:
    fixed (`tokens`) or per input (`count`, e.g. text), never needing a forward pass."""

    n_layers: int
    n_heads: int  # attention heads of each layer (the model's, whatever its `heads` option)
    tokens: int | None = None  # every input's T, when it does not depend on the input
    count: Callable[[Sequence[Any]], list[int]] | None = None  # per input T (text)

    @property
    def per_input(self) -> bool:
        """Whether token counts depend on the input (then `token_counts` needs the inputs)."""
        return self.tokens is None

    def token_counts(self, items: Sequence[Any]) -> list[int]:
        """Real tokens of each of `items`."""
        if self.tokens is not None:
            return [self.tokens] * len(items)
        return [int(c) for c in self.count(items)]


def hf_config(spec: ModelSpec) -> Any:
    """The transformers config of `spec`: `config.json` only (no weights), or the tiny preset's."""
    from transformers import AutoConfig

    from workers.models.hf import model_location

    if not spec.pretrained:
        return AutoConfig.for_model(spec.source, **spec.options)
    try:
        return AutoConfig.from_pretrained(model_location(spec.source))
    except (OSError, ValueError) as error:
        message = " ".join(str(error).split())[:300]
        raise InputError(f"model {spec.name!r}: cannot load {spec.source!r}: {message}") from error


def _hf_layout(spec: ModelSpec, dataset: Any) -> TokenLayout:
    import torch
    from PIL import Image

    from workers.models.hf import HFExtractor

    config = hf_config(spec)
    shell = HFExtractor.__new__(HFExtractor)  # the adapter's preprocessing, without a model
    shell.spec, shell.config = spec, config
    n_layers, n_heads = int(config.num_hidden_layers), int(config.num_attention_heads)
    if spec.modality == "text":
        shell.tokenizer = shell._tokenizer()
        return TokenLayout(n_layers, n_heads, count=shell.token_counts)
    shell.processor = shell._image_processor()
    shapes = set()
    for size in PROBE_SIZES:
        pixels = shell.processor(images=[Image.new("RGB", size)], return_tensors="pt")
        shapes.add(tuple(torch.as_tensor(pixels["pixel_values"]).shape[-2:]))
    if len(shapes) != 1:
        raise InputError(
            f"model {spec.name!r}: its image processor's output size follows the input's "
            f"({sorted(shapes)}): set a crop size so every image has the same tokens"
        )
    height, width = shapes.pop()
    return TokenLayout(n_layers, n_heads,
                       tokens=len(shell._image_kinds(torch.empty(1, 3, height, width))))


def _timm_layout(spec: ModelSpec, dataset: Any) -> TokenLayout:
    import torch

    from workers.models.timm_ import build_model, prefix_kinds

    with torch.device("meta"):  # shapes only: no storage, no initialisation, no weights
        model = build_model(replace(spec, pretrained=False, weights=None))
    return TokenLayout(len(model.blocks), int(model.blocks[0].attn.num_heads),
                       tokens=len(prefix_kinds(model)) + int(model.patch_embed.num_patches))


def _ft_layout(spec: ModelSpec, dataset: Any) -> TokenLayout:
    table = getattr(dataset, "table", None)
    if table is None:
        raise InputError(f"model {spec.name!r} needs a tabular dataset (it is trained on it)")
    return TokenLayout(measured_layers(spec.options), HEADS, tokens=len(table.feature_names) + 1)


LAYOUTS: dict[str, Callable[[ModelSpec, Any], TokenLayout]] = {
    "hf": _hf_layout,
    "timm": _timm_layout,
    "ft-transformer": _ft_layout,
}


def token_layout(spec: ModelSpec, dataset: Any = None) -> TokenLayout:
    """Layers and token counts of `spec` on `dataset` (tables need it), without building it."""
    return LAYOUTS[spec.family](spec, dataset)


def needs_preparation(spec: ModelSpec) -> bool:
    """Whether `spec` must be prepared (trained) by a task before its extractions run."""
    return spec.family == "ft-transformer" and not getattr(spec, "random_init", False)

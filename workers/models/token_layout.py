"""A model's size from its spec alone: layers and tokens per input, with no weights and no inputs.

The driver sizes the store with this before any task runs, so it must stay cheap: O(1) per model
for images and tables, one tokenizer pass (no model) for text. Each family's module
(`workers.models.registry.FAMILY_MODULES`) defines `token_layout(spec, dataset) -> TokenLayout`;
`token_layout` here dispatches to it, importing the module on first use:

- `hf` (`workers.models.hf`): the model's config gives the layers; text counts each input's
  tokens with the model's own tokenizer; images run the model's own image processor on two small
  synthetic pictures (never on an input). The adapter's own preprocessing methods do this, on an
  adapter that has no model, so the plan and extraction cannot drift apart.
- `timm` (`workers.models.timm_`): the architecture is built on torch's `meta` device (no memory,
  no weights).
- `ft-transformer` (`workers.models.trained.ft.adapter`): CLS + one token per feature of the table;
  the measured blocks are the layers. Nothing trained.

Every layout also gives the heads of each layer (`n_heads`): the store keeps that many maps per
layer for a model whose `heads` option is `each`; and each head's query/key dimension
(`head_dim`, from the same config objects): the size-matched `qk-head` null's d.

`needs_preparation(spec)` says whether a model has work to do before extraction (training).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from workers.models.registry import ModelSpec, family_module, trained_here


@dataclass(frozen=True)
class TokenLayout:
    """Layers and attention heads per layer of a model, and the real tokens of its inputs:
    fixed (`tokens`) or per input (`count`, e.g. text), never needing a forward pass."""

    n_layers: int
    n_heads: int  # attention heads of each layer (the model's, whatever its `heads` option)
    tokens: int | None = None  # every input's T, when it does not depend on the input
    count: Callable[[Sequence[Any]], list[int]] | None = None  # per input T (text)
    head_dim: int | None = None  # each head's query/key width (None: the family does not say)

    @property
    def per_input(self) -> bool:
        """Whether token counts depend on the input (then `token_counts` needs the inputs)."""
        return self.tokens is None

    def token_counts(self, items: Sequence[Any]) -> list[int]:
        """Real tokens of each of `items`."""
        if self.tokens is not None:
            return [self.tokens] * len(items)
        return [int(c) for c in self.count(items)]


def token_layout(spec: ModelSpec, dataset: Any = None) -> TokenLayout:
    """Layers and token counts of `spec` on `dataset` (tables need it), without building it:
    its family module's `token_layout`."""
    return family_module(spec).token_layout(spec, dataset)


def needs_preparation(spec: ModelSpec) -> bool:
    """Whether `spec` must be prepared (trained) by a task before its extractions run."""
    return trained_here(spec) and not getattr(spec, "random_init", False)

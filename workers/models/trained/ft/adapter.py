"""FT-Transformer (rtdl_revisiting_models): trained by the project, attention recomputed in full.

Training (`workers.models.trained.ft.training`): the recipe of Gorishniy et al. (2021) on a
seeded train/validation/test split of the whole table; the kept weights and the preprocessing go
into one safetensors checkpoint, the training record into a JSON beside it, both keyed by the
spec and the table's content, and reused when present (`workers.models.trained.family`). A spec
with `random_init` is the control: the same architecture with the seeded initial weights
training would start from, never trained.

Inputs (`model_dataset`): the held-out test rows (option `split: test`, the default) or every
row (`split: all`). Tokens: CLS (token 0), the continuous features, the categorical features.

Attention: the library returns no probabilities and runs its last block with the CLS query only.
A forward pre-hook on each measured block's attention captures its (normalised) input and
recomputes the full softmax(q k^T / sqrt(d_head)) over all tokens. Option `last_block: skip`
(the default) measures the blocks before the last; `full` also the last block, every row of it
recomputed (docs/ft-transformer.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from rtdl_revisiting_models import FTTransformer, MultiheadAttention

from storage.errors import ExtractionError, InputError
from storage.location import StoreLike
from workers.exact.token_kinds import TokenKind
from workers.inputs import Dataset, Table
from workers.models.extraction import Batch, Extractor, Sink
from workers.models.registry import ModelSpec
from workers.models.token_layout import TokenLayout
from workers.models.trained.cache import in_cache
from workers.models.trained.family import TrainedFamily
from workers.models.trained.ft.data import (
    STATS_PREFIX,
    architecture,
    encode,
    fit_preprocessing,
    init_model,
)
from workers.models.trained.ft.options import HEADS, MEASUREMENT_ONLY, measured_layers
from workers.models.trained.split import table_split


class FTFamily(TrainedFamily):
    """The FT-Transformer's checkpoints (`workers.models.trained.family`)."""

    measurement_only = MEASUREMENT_ONLY
    recipe = "workers.models.trained.ft.training"

    def table(self, spec: ModelSpec, dataset: Dataset | None) -> Table:
        if dataset is None or dataset.table is None:
            raise InputError(f"model {spec.name!r} needs a tabular dataset (it is trained on it)")
        return dataset.table


FAMILY = FTFamily()
ensure_checkpoint, prepare, model_dataset = (FAMILY.ensure_checkpoint, FAMILY.prepare,
                                             FAMILY.model_dataset)


def checkpoint_path(spec: ModelSpec, table: Table, cache: StoreLike) -> str:
    """Where the checkpoint of `spec` trained on `table` lives: a path or a URL in `cache`."""
    return in_cache(cache, FAMILY.checkpoint_key(spec, table))


def token_layout(spec: ModelSpec, dataset: Dataset | None) -> TokenLayout:
    """The measured blocks (`ft.options.measured_layers`), their HEADS heads of width
    d_block / HEADS (24 at the paper's 192) and CLS + one token per feature of the table: from
    the spec and the table alone, nothing trained."""
    table = FAMILY.table(spec, dataset)
    return TokenLayout(measured_layers(spec.options), HEADS, tokens=len(table.feature_names) + 1,
                       head_dim=int(architecture(spec.options)["d_block"]) // HEADS)


def initial_state(spec: ModelSpec, table: Table) -> dict[str, torch.Tensor]:
    """The random-init control's weights and preprocessing: the seeded initial weights that
    training starts from, and the same training-row preprocessing the trained model uses."""
    model = init_model(spec.options, spec.seed, table)
    train_rows = table_split(spec.options, spec.seed, table)["train"]
    stats = fit_preprocessing(spec.options, spec.seed, table, train_rows)
    return {**model.state_dict(), **stats}


class FTExtractor(Extractor):
    """A trained FT-Transformer (or its random-init control); the full T x T attention of each
    measured block recomputed from the block's input."""

    def __init__(self, spec: ModelSpec, dataset: Dataset, cache: StoreLike,
                 device: torch.device, dtype: torch.dtype) -> None:
        self.spec, self.device, self.dtype = spec, device, dtype
        self.table = FAMILY.table(spec, dataset)
        if spec.random_init:
            state = initial_state(spec, self.table)
        else:
            state = ensure_checkpoint(spec, dataset, cache)[0]
        self.stats = {k: state.pop(k).to(device) for k in list(state)
                      if k.startswith(STATS_PREFIX)}
        self.model: FTTransformer = init_model(spec.options, spec.seed, self.table)
        self.model.load_state_dict(state)
        self.model.eval().to(device=device, dtype=dtype)
        blocks = self.model.backbone.blocks
        self.attentions: list[MultiheadAttention] = [
            block["attention"] for block in blocks[: measured_layers(spec.options)]
        ]
        self.n_layers = len(self.attentions)
        if any(block["attention"].key_compression is not None for block in blocks):
            raise ExtractionError(f"model {spec.name!r}: Linformer attention is not supported")
        n_features = len(self.table.feature_names)
        self.kinds = np.array([TokenKind.CLS] + [TokenKind.CONTENT] * n_features, dtype=np.int8)

    def token_counts(self, items: Sequence[Any]) -> list[int]:
        return [len(self.kinds)] * len(items)

    def prepare(self, items: Sequence[Any]) -> Batch:
        x_cont, x_cat = encode(np.stack(items), self.table, self.stats, self.device)
        inputs = {"x_cont": None if x_cont is None else x_cont.to(self.dtype), "x_cat": x_cat}
        positions = [torch.arange(len(self.kinds))] * len(items)
        return Batch(inputs, positions, [self.kinds] * len(items))

    def install_hooks(self, sink: Sink) -> list[torch.utils.hooks.RemovableHandle]:
        def hook(module: MultiheadAttention, args: tuple[torch.Tensor, torch.Tensor]) -> None:
            sink(full_attention(module, args[1]))

        return [a.register_forward_pre_hook(hook) for a in self.attentions]

    def forward(self, batch: Batch) -> Any:
        return self.model(batch.inputs["x_cont"], batch.inputs["x_cat"])


def full_attention(module: MultiheadAttention, x: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d_head)) of every token over every token, as the block computes it.

    x: (batch, tokens, d) the block's key/value input; returns (batch, heads, tokens, tokens).
    """
    batch, tokens, _ = x.shape
    heads = module._n_heads
    q = module.W_q(x).reshape(batch, tokens, heads, -1).transpose(1, 2)  # (batch, heads, T, d_head)
    k = module.W_k(x).reshape(batch, tokens, heads, -1).transpose(1, 2)  # (batch, heads, T, d_head)
    return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(k.shape[-1]), dim=-1)


def build_extractor(spec: ModelSpec, dataset: Dataset | None, cache: StoreLike,
                    device: torch.device, dtype: torch.dtype) -> FTExtractor:
    """The family's entry in `workers.models.registry.FAMILY_MODULES`: it needs its tabular
    dataset."""
    FAMILY.table(spec, dataset)
    return FTExtractor(spec, dataset, cache, device, dtype)

"""FT-Transformer (rtdl_revisiting_models): trained by the project, attention recomputed in full.

Training (`workers.models.ft_training`): the recipe of Gorishniy et al. (2021) on a seeded
train/validation/test split of the whole table; the kept weights and the preprocessing go
into one safetensors checkpoint, the training record into a JSON beside it, both keyed by the
spec and the table's content, and reused when present. A spec with `random_init` is the control:
the same architecture with the seeded initial weights training would start from, never trained.

Inputs (`model_dataset`): the held-out test rows (option `split: test`, the default) or every
row (`split: all`). Tokens: CLS (token 0), the continuous features, the categorical features.

Attention: the library returns no probabilities and runs its last block with the CLS query only.
A forward pre-hook on each measured block's attention captures its (normalised) input and
recomputes the full softmax(q k^T / sqrt(d_head)) over all tokens. Option `last_block: skip`
(the default) measures the blocks before the last; `full` also the last block, every row of it
recomputed (docs/ft-transformer.md).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from rtdl_revisiting_models import FTTransformer, MultiheadAttention
from safetensors.torch import load, save

from storage.errors import ExtractionError, InputError, StoreDamagedError
from storage.location import Location, StoreLike, StoreRef, locate
from workers.exact.token_kinds import TokenKind
from workers.inputs import Dataset, Table
from workers.models.determinism import TORCH_THREADS
from workers.models.extraction import Batch, Extractor, Sink
from workers.models.ft_data import (
    STATS_PREFIX,
    architecture,
    encode,
    fit_preprocessing,
    init_model,
    model_rows,
    split_indices,
    table_split,
)
from workers.models.ft_options import HEADS, measured_layers, training_options
from workers.models.registry import ModelSpec
from workers.models.token_layout import TokenLayout

__all__ = ["FTExtractor", "checkpoint_key", "checkpoint_path", "ensure_checkpoint",
           "full_attention", "model_dataset", "prepare", "read_checkpoint", "split_indices",
           "token_layout", "train"]


def checkpoint_key(spec: ModelSpec, table: Table) -> str:
    """The checkpoint's name in the cache (its record: same stem, .json).

    The key covers what determines training: the spec without its measurement-only options
    (`split`, `last_block`, `heads`), the table's content and the torch thread count training
    runs on (`workers.models.determinism`).
    """
    trained = {**spec.to_dict(), "config": training_options(spec.options)}
    trained.pop("heads", None)  # averaged or kept per head, the weights are the same
    key = json.dumps({"spec": trained, "table": table.fingerprint, "torch_threads": TORCH_THREADS},
                     sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return f"ft-transformer-{digest}.safetensors"


def checkpoint_path(spec: ModelSpec, table: Table, cache: StoreLike) -> str:
    """Where the checkpoint of `spec` trained on `table` lives: a path or a URL in `cache`."""
    return f"{str(StoreRef.of(cache)).rstrip('/')}/{checkpoint_key(spec, table)}"


def _table(spec: ModelSpec, dataset: Dataset | None) -> Table:
    if dataset is None or dataset.table is None:
        raise InputError(f"model {spec.name!r} needs a tabular dataset (it is trained on it)")
    return dataset.table


def model_dataset(spec: ModelSpec, dataset: Dataset) -> Dataset:
    """The inputs `spec` is measured on: the test rows of its split (`split: test`) or every row
    (`split: all`), ascending, with the dataset's own ids; then the dataset's `limit`.

    Pure: from the spec and the table alone, no training (the driver plans with it).
    """
    table = _table(spec, dataset)
    return dataset.subset(model_rows(spec.options, spec.seed, table))


def token_layout(spec: ModelSpec, dataset: Dataset | None) -> TokenLayout:
    """The measured blocks (`ft_options.measured_layers`), their HEADS heads of width
    d_block / HEADS (24 at the paper's 192) and CLS + one token per feature of the table: from
    the spec and the table alone, nothing trained."""
    table = _table(spec, dataset)
    return TokenLayout(measured_layers(spec.options), HEADS, tokens=len(table.feature_names) + 1,
                       head_dim=int(architecture(spec.options)["d_block"]) // HEADS)


def ensure_checkpoint(spec: ModelSpec, dataset: Dataset | None,
                      cache: StoreLike) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The trained weights (with the standardisation) for (spec, dataset's table) and the
    training record, read from the cache (a folder or a URL, through `storage.location`), or
    trained and written there first: the record, then the checkpoint (a checkpoint that exists is
    complete)."""
    table = _table(spec, dataset)
    if spec.random_init:
        raise InputError(f"model {spec.name!r} is a random-init control: it has no checkpoint")
    location, key = locate(cache), checkpoint_key(spec, table)
    cached = read_checkpoint(location, key)
    checkpoint = spec.options.get("checkpoint")
    keep = set(spec.options.get("keep_epochs", ())) | ({checkpoint} if checkpoint is not None
                                                       else set())
    epochs = {e: read_weights(location, epoch_key(key, e)) for e in keep}
    if cached is None or any(state is None for state in epochs.values()):
        kept: dict[int, dict[str, torch.Tensor]] = {}
        state, record = train(spec, table, kept) if keep else train(spec, table)
        for epoch, weights in kept.items():
            if epochs.get(epoch) is None:
                location.write(epoch_key(key, epoch), weights_bytes(weights, table))
        location.write(record_key(key), json.dumps(record, indent=2, sort_keys=True).encode())
        location.write(key, weights_bytes(state, table))
        cached, epochs = (state, record), {**epochs, **kept}
    if checkpoint is None:
        return cached
    if epochs.get(checkpoint) is None:
        raise InputError(f"model {spec.name!r}: checkpoint epoch {checkpoint} is past the last "
                         f"epoch trained ({cached[1]['epochs_run']}, stopped by "
                         f"{cached[1]['stopped_by']}); choose epochs up to it")
    return epochs[checkpoint], cached[1]


def epoch_key(key: str, epoch: int) -> str:
    """The name of the weights after `epoch` of the training whose best weights are `key`."""
    return key.removesuffix(".safetensors") + f".epoch-{epoch}.safetensors"


def weights_bytes(state: dict[str, torch.Tensor], table: Table) -> bytes:
    """Weights as cached: safetensors, with the table's fingerprint (the digits ViT's too)."""
    return save({k: v.contiguous() for k, v in state.items()},
                metadata={"table": table.fingerprint})


def read_weights(location: Location, key: str) -> dict[str, torch.Tensor] | None:
    """Cached weights `key`, None when absent; StoreDamagedError when they do not load."""
    data = location.read(key)
    if data is None:
        return None
    try:
        return load(data)
    except Exception as error:  # noqa: BLE001 - safetensors raises its own error types
        raise StoreDamagedError(f"cached checkpoint {str(location).rstrip('/')}/{key} is "
                                f"truncated or corrupt ({type(error).__name__}); delete it to "
                                f"train it again") from None


def record_key(key: str) -> str:
    """The name of the training record beside the best weights `key`."""
    return key.removesuffix(".safetensors") + ".json"


def read_checkpoint(location: Location,
                    key: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]] | None:
    """The cached checkpoint `key` and its training record, None when the checkpoint is absent;
    StoreDamagedError naming a checkpoint or record that does not load (truncated, corrupt)."""
    data = location.read(key)
    if data is None:
        return None
    where = f"{str(location).rstrip('/')}/{key}"
    try:
        state = load(data)
        record = json.loads(location.read(record_key(key)) or b"")
    except Exception as error:  # noqa: BLE001 - safetensors raises its own error types
        raise StoreDamagedError(
            f"cached checkpoint {where} is truncated or corrupt ({type(error).__name__}); "
            f"delete it and {record_key(key)} to train it again"
        ) from None
    return state, record


def prepare(spec: ModelSpec, dataset: Dataset | None, cache: StoreLike) -> dict[str, Any] | None:
    """Train (or find cached) the model of `spec`; its training record, or None for a control."""
    _table(spec, dataset)
    if spec.random_init:
        return None
    return ensure_checkpoint(spec, dataset, cache)[1]


def train(spec: ModelSpec, table: Table, kept: dict[int, dict[str, torch.Tensor]] | None = None,
          ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The recipe (`workers.models.ft_training.train`); here so tests can replace it."""
    from workers.models import ft_training

    return ft_training.train(spec, table, kept=kept)


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
        self.table = _table(spec, dataset)
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
    _table(spec, dataset)
    return FTExtractor(spec, dataset, cache, device, dtype)

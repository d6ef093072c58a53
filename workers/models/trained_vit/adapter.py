"""The `vit-trained` family (preset `vit-digits`): trained by the project, cached, measured on the
held-out digits.

Checkpoint cache (a folder or URL, through `storage.location`), keyed like the FT-Transformer's
by the spec's training options, the table's content and the torch thread count:
`vit-trained-<digest>.safetensors` (the best weights), `.json` (the training record) and
`vit-trained-<digest>.epoch-<k>.safetensors` (the weights after epoch k, for the epochs a spec
keeps: option `keep_epochs`, and `checkpoint`). Training is bit-reproducible, so an epoch asked for
later is trained again and written beside the others; the best file is written last (a best
file that exists means the record exists). A random-init control (`spec.random_init`) is the
seeded initial model training starts from (epoch 0's weights), never trained.

Inputs (`model_dataset`): the test digits of the spec's split (`split: test`), or all. Tokens:
CLS, the registers, then the patches row-major.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from storage.errors import InputError, StoreDamagedError
from storage.location import Location, StoreLike, locate
from workers.exact.token_kinds import TokenKind
from workers.inputs import Dataset, Table
from workers.models.determinism import TORCH_THREADS
from workers.models.extraction import Batch
from workers.models.ft_data import model_rows  # the FT models' test rows
from workers.models.ft_transformer import epoch_key, read_weights, record_key, weights_bytes
from workers.models.registry import ModelSpec
from workers.models.timm_ import VisionTransformerExtractor, prefix_kinds
from workers.models.token_layout import TokenLayout
from workers.models.trained_vit.data import init_model, n_classes, to_model
from workers.models.trained_vit.options import n_tokens, training_options

State = dict[str, torch.Tensor]


def _table(spec: ModelSpec, dataset: Dataset | None) -> Table:
    if dataset is None or dataset.table is None or dataset.kind != "image":
        raise InputError(f"model {spec.name!r} needs the digits as images (dataset `kind: image`, "
                         f"`source: sklearn:digits`): it is trained on them")
    return dataset.table


def checkpoint_key(spec: ModelSpec, table: Table) -> str:
    """The best weights' name in the cache; the record and the epochs share its stem."""
    trained = {**spec.to_dict(), "config": training_options(spec.options)}
    trained.pop("heads", None)  # averaged or kept per head, the weights are the same
    key = json.dumps({"spec": trained, "table": table.fingerprint, "torch_threads": TORCH_THREADS},
                     sort_keys=True)
    return f"vit-trained-{hashlib.sha256(key.encode()).hexdigest()[:16]}.safetensors"


def kept_epochs(spec: ModelSpec) -> set[int]:
    """The epochs `spec`'s training keeps: option `keep_epochs` and its own `checkpoint`."""
    checkpoint = spec.options.get("checkpoint")
    return set(spec.options.get("keep_epochs", ())) | ({checkpoint} if checkpoint is not None
                                                       else set())


def ensure_checkpoint(spec: ModelSpec, dataset: Dataset | None,
                      cache: StoreLike) -> tuple[State, dict[str, Any]]:
    """The weights `spec` measures (its `checkpoint`, else the best) and the training record,
    from the cache, or trained and written there first (missing epochs, the record, then the
    best weights)."""
    table = _table(spec, dataset)
    if spec.random_init:
        raise InputError(f"model {spec.name!r} is a random-init control: it has no checkpoint")
    location, key = locate(cache), checkpoint_key(spec, table)
    keep = kept_epochs(spec)
    best, record = read_weights(location, key), _read_record(location, key)
    epochs = {e: read_weights(location, epoch_key(key, e)) for e in keep}
    if best is None or record is None or any(state is None for state in epochs.values()):
        best, trained, record = train(spec, table, keep)
        for epoch, state in trained.items():
            if epochs.get(epoch) is None:
                location.write(epoch_key(key, epoch), weights_bytes(state, table))
        epochs = trained
        location.write(record_key(key), json.dumps(record, indent=2, sort_keys=True).encode())
        location.write(key, weights_bytes(best, table))
    checkpoint = spec.options.get("checkpoint")
    return (best if checkpoint is None else epochs[checkpoint]), record


def _read_record(location: Location, key: str) -> dict[str, Any] | None:
    data = location.read(record_key(key))
    if data is None:
        return None
    try:
        return json.loads(data)
    except ValueError:
        raise StoreDamagedError(f"training record {str(location).rstrip('/')}/{record_key(key)} "
                                f"is not JSON; delete it to train again") from None


def train(spec: ModelSpec, table: Table, keep: set[int]) -> tuple[State, dict[int, State],
                                                                   dict[str, Any]]:
    """The recipe (`workers.models.trained_vit.training.train`); here so tests can replace it."""
    from workers.models.trained_vit import training

    return training.train(spec, table, keep)


def prepare(spec: ModelSpec, dataset: Dataset | None, cache: StoreLike) -> dict[str, Any] | None:
    """Train (or find cached) the model of `spec`; its training record, or None for a control."""
    _table(spec, dataset)
    if spec.random_init:
        return None
    return ensure_checkpoint(spec, dataset, cache)[1]


def model_dataset(spec: ModelSpec, dataset: Dataset) -> Dataset:
    """The digits `spec` is measured on: its test split (`split: test`) or all, ascending, with
    the dataset's own ids; then the dataset's `limit`. From the spec and the table alone."""
    return dataset.subset(model_rows(spec.options, spec.seed, _table(spec, dataset)))


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
        table = _table(spec, dataset)
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
    _table(spec, dataset)
    return TrainedViTExtractor(spec, dataset, cache, device, dtype)

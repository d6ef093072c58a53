"""Model + inputs -> per input, per layer, the head-averaged attention over its real tokens
(or every head's, for a spec whose `heads` option is `each`).

Each family adapter (`workers.models.hf`, `.timm_`, `.trained.ft.adapter`,
`.trained.vit.adapter`) subclasses `Extractor`: it prepares a batch (model inputs, each input's
real-token positions and token kinds), installs hooks that hand every layer's (batch, heads,
query, key) probabilities to a sink, and runs the forward pass. The sink averages heads as each
layer is produced (`heads: mean`, the default), so one layer's (batch, heads, T, T) is the most
ever held, or keeps them all (`heads: each`); padding masks keys only and is cropped away here.

Two sinks, the same maps: `Extractor.extract` (the straightforward path: every layer kept, then
`assemble` crops each input into arrays of its own) and `ChunkSink` (what a sweep's extraction
task uses: each layer's maps cropped, as it is produced, straight into a reused buffer laid out
as the store's attention chunks, zero beyond each input's tokens; `extract_into`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from storage.errors import ExtractionError, InputError
from storage.location import StoreLike
from workers.exact.numba_cache import cache_home
from workers.models.determinism import TORCH_THREADS, fixed_torch
from workers.models.registry import ModelSpec, family_module

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
Sink = Callable[[torch.Tensor], None]


@dataclass(frozen=True)
class Extraction:
    """One input's attention: (layers, T, T) float32 rows over its real tokens, head-averaged,
    or (layers, heads, T, T) when the spec keeps every head; and the tokens' kinds."""

    input_id: str
    attention: np.ndarray  # (layer, query, key), or (layer, head, query, key): float32
    token_kind: np.ndarray  # (token,) int8 TokenKind

    @property
    def by_head(self) -> np.ndarray:
        """(layer, head, query, key): the head-averaged attention as a single head."""
        return self.attention if self.attention.ndim == 4 else self.attention[:, None]


@dataclass(frozen=True)
class Batch:
    """A prepared batch: what the model is called with, and each input's real tokens."""

    inputs: dict[str, torch.Tensor]
    positions: list[torch.Tensor]  # per input: its real tokens on the padded axis, ascending
    token_kinds: list[np.ndarray]  # per input: (real tokens,) int8


class Extractor(ABC):
    """Base of the family adapters: `token_counts` (no forward pass) and `extract`."""

    spec: ModelSpec
    n_layers: int
    device: torch.device
    dtype: torch.dtype
    independent_inputs: bool = False
    """True where `prepare` treats every input alone (images, whatever the batch): a batch may
    then be prepared in parts, on several threads, and joined (`join_batches`), giving the same
    tensors. False where an input depends on its batch (text: padded to the longest)."""

    pixel_tensors: bool = False
    """True where `prepare` takes an image dataset's `load_pixels` (tensors where the dataset
    gives them, the pixels of its PIL images) as it takes its `load`: an image processor's
    torchvision backend, which turns every PIL image into that tensor first."""

    def read(self, dataset: Any, indices: Sequence[int]) -> list:
        """The inputs at `indices` as `prepare` takes them at least cost (`pixel_tensors`)."""
        return dataset.load_pixels(indices) if self.pixel_tensors else dataset.load(indices)

    @abstractmethod
    def token_counts(self, items: Sequence[Any]) -> list[int]:
        """Real tokens each input will have, without a forward pass (sizes the store's T_max)."""

    @abstractmethod
    def prepare(self, items: Sequence[Any]) -> Batch:
        """Preprocess `items` into model inputs on the device, with real positions and kinds."""

    def prepare_into(self, items: Sequence[Any], out: dict[str, torch.Tensor] | None) -> Batch:
        """`prepare(items)`, its tensors written into `out`'s where they fit (`stack_into`: the
        rows of a batch's reused buffer, for a part of its inputs, so that `join_batches` copies
        nothing); by default, as `prepare` gives them."""
        return self.prepare(items)

    @abstractmethod
    def install_hooks(self, sink: Sink) -> list[torch.utils.hooks.RemovableHandle]:
        """Hooks that call `sink` once per layer with (batch, heads, query, key) probabilities."""

    @abstractmethod
    def forward(self, batch: Batch) -> Any:
        """The bare forward pass of the model on a prepared batch."""

    def extract(self, items: Sequence[Any], ids: Sequence[str]) -> list[Extraction]:
        """Attention and token kinds of each item; ExtractionError if layers or values are wrong."""
        if len(items) != len(ids):
            raise InputError(f"extract: {len(items)} items but {len(ids)} ids")
        if not items:
            return []
        with fixed_torch(TORCH_THREADS):  # the same bits on any core count
            batch = self.prepare(items)
            with torch.inference_mode(), capture_attention(self) as layers:
                self.forward(batch)
        return assemble(self.spec.name, self.n_layers, layers, batch, ids)

    def extract_into(self, batch: Batch, ids: Sequence[str], sink: ChunkSink) -> None:
        """The forward pass of a prepared batch with every layer's maps written into `sink`'s
        chunk buffer (`ChunkSink`); run it under `fixed_torch(TORCH_THREADS)`, as `extract`
        does. ExtractionError if a layer is missing or the maps do not fit the chunk."""
        sink.start(batch, ids)
        handles = self.install_hooks(sink)
        try:
            with torch.inference_mode():
                self.forward(batch)
        finally:
            for handle in handles:
                handle.remove()
        sink.finish()


def layer_map(probs: torch.Tensor, each: bool) -> torch.Tensor:
    """One layer's (batch, heads, query, key) probabilities as stored: the head mean (batch,
    query, key), or every head (batch, heads, query, key), float32 (both sinks call this). The
    mean of one head is that head, bit for bit (x / 1 == x): a view of it, no reduction."""
    if each:
        return probs.to(torch.float32)
    if probs.shape[1] == 1:
        return probs[:, 0].to(torch.float32)
    return probs.mean(dim=1, dtype=torch.float32)


def stack_into(images: Sequence[torch.Tensor], out: torch.Tensor | None) -> torch.Tensor:
    """`torch.stack(images)`, contiguous (the layout a model is called with), into `out` where
    it is a contiguous CPU tensor of that shape and dtype."""
    if out is not None and out.device.type == "cpu" and out.dtype == images[0].dtype \
            and out.shape == (len(images), *images[0].shape) and out.is_contiguous():
        return torch.stack(images, out=out)
    return torch.stack(images).contiguous()


def row_views(tensors: dict[str, torch.Tensor] | None, rows: range) -> dict[str, torch.Tensor]:
    """`rows` of each tensor (along the batch): where `prepare_into` writes a part of a batch."""
    return {name: tensor[rows.start:rows.stop] for name, tensor in (tensors or {}).items()}


def join_batches(parts: Sequence[Batch], out: dict[str, torch.Tensor] | None = None) -> Batch:
    """Batches prepared from consecutive parts of one batch's inputs (by an extractor whose
    `independent_inputs`), as one: tensors concatenated along the batch (into the first rows of
    `out`'s tensors where they fit; nothing is copied where the parts were prepared into those
    rows: `row_views`), positions and kinds in order; other inputs (flags) from the first
    part."""
    if len(parts) == 1:
        return parts[0]
    inputs: dict[str, Any] = {}
    for name, value in parts[0].inputs.items():
        if not isinstance(value, torch.Tensor):
            inputs[name] = value
            continue
        values = [part.inputs[name] for part in parts]
        target = None if out is None else out.get(name)
        rows = sum(len(v) for v in values)
        if target is not None and len(target) >= rows and target.shape[1:] == value.shape[1:] \
                and target.dtype == value.dtype and target.device == value.device:
            target = target[:rows]
            inputs[name] = target if _laid_in(values, target) else torch.cat(values, out=target)
        else:
            inputs[name] = torch.cat(values)
    return Batch(inputs, [p for part in parts for p in part.positions],
                 [k for part in parts for k in part.token_kinds])


def _laid_in(values: Sequence[torch.Tensor], target: torch.Tensor) -> bool:
    """Whether `values` are `target`'s consecutive rows already (prepared into them)."""
    row = 0
    for value in values:
        if len(value) and value.data_ptr() != target[row].data_ptr():
            return False
        if value.stride() != target.stride():
            return False
        row += len(value)
    return True


class ChunkSink:
    """Where a batch's attention goes in a sweep's extraction: `chunk`, a (rows, layer, head,
    t_max, t_max) float32 tensor on the model's device laid out as the store's attention chunks
    (one input per row), reused batch after batch. Per layer, as the model produces it, each
    input's map (`layer_map`) over its real tokens lands at [:T, :T] of its row; what lies
    beyond (padding, and whatever the row's previous input left there) is zero after `finish`.

    `extents[r]` is how far row r holds non-zero values (its last input's T, 0 when zeroed):
    only the difference to the next input is cleared, never the whole buffer."""

    def __init__(self, model: str, n_layers: int, each: bool, chunk: torch.Tensor) -> None:
        self.model, self.n_layers, self.each, self.chunk = model, n_layers, each, chunk
        self.extents = [0] * chunk.shape[0]
        self.layer, self.batch = 0, None

    def start(self, batch: Batch, ids: Sequence[str]) -> None:
        """Take `batch` (its positions say each input's real tokens) and its inputs' ids before
        its forward pass."""
        if len(batch.positions) != len(ids) or len(ids) > self.chunk.shape[0]:
            raise ValueError(f"{len(batch.positions)} inputs, {len(ids)} ids, a chunk buffer "
                             f"of {self.chunk.shape[0]} rows")
        self.batch, self.ids, self.layer = batch, list(ids), 0
        self.tokens = [len(p) for p in batch.positions]
        # sorted real positions 0..n-1 (right padding, or none): a slice of the padded maps
        self.prefix = all(n == 0 or int(p[-1]) == n - 1
                          for n, p in zip(self.tokens, batch.positions, strict=True))
        self.width = max(self.tokens, default=0)  # the block every input's map lies in
        if self.width > self.chunk.shape[-1]:
            raise ValueError(f"{self.width} tokens for a chunk buffer of {self.chunk.shape[-1]}")

    def __call__(self, probs: torch.Tensor) -> None:  # (batch, heads, query, key)
        layer = self.layer
        self.layer += 1
        if layer >= self.n_layers:  # counted; `finish` names the count
            return
        maps = layer_map(probs, self.each)  # (batch, [heads,] query, key)
        if not self.each:
            maps = maps[:, None]  # (batch, 1, query, key)
        n, heads, width = len(self.tokens), maps.shape[1], maps.shape[-1]
        if heads != self.chunk.shape[2]:
            raise ExtractionError(
                f"model {self.model!r} input {self.ids[0]!r}: layer {layer} has {heads} heads, "
                f"the store expects {self.chunk.shape[2]}")
        for b, tokens in enumerate(self.tokens):
            if tokens > width:  # `assemble`'s check, in its words
                raise ExtractionError(
                    f"model {self.model!r}, input {self.ids[b]!r}: attention over {width} "
                    f"tokens but {tokens} token kinds: the token layout is wrong")
        out = self.chunk[:n, layer]  # (batch, heads, t_max, t_max)
        if self.prefix:
            w = self.width
            out[:, :, :w, :w].copy_(maps[:, :, :w, :w])
            return
        for b, keep in enumerate(self.batch.positions):
            keep = keep.to(maps.device)
            t = len(keep)
            out[b, :, :t, :t].copy_(maps[b].index_select(-2, keep).index_select(-1, keep))

    def finish(self) -> None:
        """After the forward pass: ExtractionError unless every layer came; then zeros beyond
        each input's tokens (the block's padding, the row's previous input)."""
        if self.layer != self.n_layers:
            raise ExtractionError(
                f"model {self.model!r} returned {self.layer} attention layers for its "
                f"{self.n_layers} layers: build it with eager (non-fused) attention and one "
                "attention call per layer"
            )
        written = self.width if self.prefix else 0
        for b, tokens in enumerate(self.tokens):
            edge = max(self.extents[b], written, tokens)
            if edge > tokens:
                row = self.chunk[b]  # (layer, head, t_max, t_max)
                row[:, :, tokens:edge, :edge] = 0
                row[:, :, :tokens, tokens:edge] = 0
            self.extents[b] = tokens


@contextmanager
def capture_attention(extractor: Extractor) -> Iterator[list[torch.Tensor]]:
    """Within the block, the extractor's forward passes append one (batch, q, k) float32 map per
    layer, heads averaged as the layer produces them, or, when the extractor's spec keeps every
    head, its (batch, heads, q, k) float32 maps; hooks are removed on exit."""
    layers: list[torch.Tensor] = []
    each = extractor.spec.heads == "each"

    def sink(probs: torch.Tensor) -> None:  # (batch, heads, query, key)
        layers.append(layer_map(probs, each))  # (batch, [heads,] query, key)

    handles = extractor.install_hooks(sink)
    try:
        yield layers
    finally:
        for handle in handles:
            handle.remove()


def assemble(
    model: str, n_layers: int, layers: list[torch.Tensor], batch: Batch, ids: Sequence[str]
) -> list[Extraction]:
    """Crop each input's (layer, [head,] T, T) from the captured per-layer maps; check count and
    values."""
    if len(layers) != n_layers:
        raise ExtractionError(
            f"model {model!r} returned {len(layers)} attention layers for its {n_layers} layers: "
            "build it with eager (non-fused) attention and one attention call per layer"
        )
    stacked = torch.stack(layers, dim=1).cpu()  # (batch, layer, [head,] query, key)
    out = []
    for b, input_id in enumerate(ids):
        keep = batch.positions[b].cpu()
        n = len(keep)
        if n and int(keep[-1]) == n - 1:  # sorted real positions 0..n-1: a slice, no gather
            attention = stacked[b, ..., :n, :n].numpy()  # (layer, [head,] T, T)
        else:  # (layer, [head,] T, T)
            attention = stacked[b].index_select(-2, keep).index_select(-1, keep).numpy()
        if attention.shape[-1] != len(batch.token_kinds[b]):
            raise ExtractionError(
                f"model {model!r}, input {input_id!r}: attention over {attention.shape[-1]} tokens "
                f"but {len(batch.token_kinds[b])} token kinds: the token layout is wrong"
            )
        bad = np.argwhere(~np.isfinite(attention))
        if len(bad):
            raise ExtractionError(
                f"model {model!r}, input {input_id!r}: non-finite attention at layer {bad[0][0]}, "
                f"row {bad[0][-2]}: try dtype float32"
            )
        out.append(Extraction(str(input_id), np.ascontiguousarray(attention, np.float32),
                              batch.token_kinds[b].astype(np.int8)))
    return out


def resolve_device(device: str) -> torch.device:
    """'auto' -> CUDA when available, else CPU; anything else as torch spells it."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except RuntimeError as error:
        raise InputError(f"device {device!r}: {error}") from error


def resolve_dtype(dtype: str) -> torch.dtype:
    """'float32' (default), 'bfloat16' or 'float16'."""
    if dtype not in DTYPES:
        raise InputError(f"dtype {dtype!r} is unknown: use one of {sorted(DTYPES)}")
    return DTYPES[dtype]


def default_cache_dir() -> Path:
    """Where trained checkpoints go when no cache dir is given: $DOBRUSHIN_CACHE, else the
    user's cache folder (`workers.exact.numba_cache.cache_home`)."""
    return cache_home()


def prepare_model(
    spec: ModelSpec, dataset: Any = None, cache_dir: StoreLike | None = None,
    report: Callable[[Any], None] | None = None,
) -> dict[str, Any] | None:
    """Train and cache what a model needs before workers load it (the models trained here): its
    JSON-able training record (the cached one when the checkpoint exists). None for models that
    need no preparation (pretrained and tiny models, random-init controls). `report` receives
    the training's progress (`storage.markers.TrainingProgress`) as it trains."""
    prepare = getattr(family_module(spec), "prepare", None)
    if prepare is None:
        return None
    return prepare(spec, dataset, cache_dir or default_cache_dir(), report)


def model_dataset(spec: ModelSpec, dataset: Any) -> Any:
    """The inputs `spec` is measured on, from the spec and `dataset` alone (no training):
    FT-Transformer's test rows (option `split: test`) or every row (`split: all`); for every other
    model the dataset itself."""
    select = getattr(family_module(spec), "model_dataset", None)
    return dataset if select is None else select(spec, dataset)


def load_extractor(
    spec: ModelSpec,
    *,
    dataset: Any = None,
    device: str = "auto",
    dtype: str = "float32",
    cache_dir: StoreLike | None = None,
) -> Extractor:
    """Build the model of `spec` in eval mode on the device and wrap it in its family's adapter."""
    torch_device, torch_dtype = resolve_device(device), resolve_dtype(dtype)
    cache = cache_dir or default_cache_dir()
    return family_module(spec).build_extractor(spec, dataset, cache, torch_device, torch_dtype)

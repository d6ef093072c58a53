"""What an input of a sweep was, from the dataset its model group names (`dataset_spec` attr):
the sentence (and, for a Hugging Face text model, its tokens from the tokenizer alone, no
weights), the image's path, the table row. Where the dataset cannot be opened here (another
machine's path, an offline hub), one line says so; nothing fails.

A store is data anyone can hand over, and its `dataset_spec` may name any file (issue 34, item
11: `/etc/passwd` as a text dataset printed its lines): the store's own record is opened only
for the built-in sources (TRUSTED_SOURCES, which read no file the store names); a file, a
folder or a Hugging Face dataset is read only from where the user points (`sweep show
--inputs`), with the recorded kind, limit and columns."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from sweep.terminal.faults import one_line
from workers.exact.token_kinds import TokenKind
from workers.inputs.base import DatasetSpec, open_dataset

SNIPPET = 160  # characters of a text input shown
TRUSTED_SOURCES = ("sklearn:", "pydoc:")  # sources that name no file: opened from the store


@dataclass(frozen=True)
class InputAbout:
    """One line saying what the input was, a label per token where one is known, and for an
    image the picture the model saw with its patch size."""

    line: str
    labels: list[str] | None = None
    picture: np.ndarray | None = None  # (H, W, 3) uint8: the processor's resize and crop
    patch: int | None = None  # pixels per patch side of `picture`


def dataset_to_read(recorded: DatasetSpec, inputs: str | None) -> DatasetSpec | None:
    """The dataset to open: the recorded one where it is a built-in source, else the user's
    `inputs` (a path, or a source form with `:`) in its place; None when neither applies."""
    if inputs is None:
        trusted = recorded.path is None and str(recorded.source).startswith(TRUSTED_SOURCES)
        return recorded if trusted else None
    if ":" in inputs and not Path(inputs).exists():
        return replace(recorded, path=None, source=inputs)
    return replace(recorded, path=inputs, source=None)


def describe_input(attrs: dict[str, Any], input_id: str, kinds: np.ndarray,
                   inputs: str | None = None) -> InputAbout:
    """What input `input_id` of a model group (its `attrs`) was; `kinds`: its stored token kinds
    (labels are given only where they match them: as many text tokens, a square patch grid);
    `inputs`: where the user says the dataset is (`dataset_to_read`)."""
    n_tokens = int(kinds.size)
    spec_fields = attrs.get("dataset_spec")
    if not spec_fields:
        return InputAbout("(the store does not say which dataset this model read)")
    try:
        recorded = DatasetSpec(**spec_fields)
        spec = dataset_to_read(recorded, inputs)
        if spec is None:
            named = recorded.path or recorded.source
            return InputAbout(f"(dataset {named} not opened: a store may name any file; pass "
                              f"--inputs with where this model's inputs are to show it)")
        dataset = open_dataset(spec)
        if input_id not in dataset.ids:
            return InputAbout(f"(dataset {spec.path or spec.source} no longer holds "
                              f"{input_id!r})")
        item = dataset.load([dataset.ids.index(input_id)])[0]
    except Exception as error:  # noqa: BLE001 - any reason the dataset is not here: one line
        return InputAbout(f"(not available here: {one_line(error)})")
    if isinstance(item, str):
        text = item if len(item) <= SNIPPET else item[: SNIPPET - 1] + "…"
        return InputAbout(f"text {text!r}", _text_labels(attrs, item, n_tokens))
    if hasattr(item, "size") and hasattr(item, "mode"):  # a PIL image
        root = getattr(dataset, "root", None)
        where = str(Path(root) / input_id) if root is not None else \
            f"{input_id} ({spec.source})"
        picture, patch = _seen(attrs, item)
        return InputAbout(f"image {where} ({item.size[0]}×{item.size[1]} px)",
                          _patch_labels(kinds), picture, patch)
    row = np.asarray(item, dtype=np.float64)
    names = getattr(getattr(dataset, "table", None), "feature_names", None) or \
        [f"x{k}" for k in range(row.size)]
    cells = ", ".join(f"{name}={value:.4g}" for name, value in zip(names, row, strict=False))
    return InputAbout(f"table row {input_id}: {cells}")


def _text_labels(attrs: dict[str, Any], text: str, n_tokens: int) -> list[str] | None:
    """The tokenizer's tokens of `text` for a Hugging Face text model (no weights loaded)."""
    try:
        from workers.models.registry import ModelSpec, family_module

        spec = ModelSpec(**attrs["model_spec"])
        tokens = getattr(family_module(spec), "token_texts", None)
        labels = None if tokens is None else tokens(spec, text)
    except Exception:  # noqa: BLE001 - no tokenizer here: the kinds alone are shown
        return None
    return labels if labels is not None and len(labels) == n_tokens else None


def _seen(attrs: dict[str, Any], image: Any) -> tuple[np.ndarray | None, int | None]:
    """The picture the model saw and its patch size, where the model's family can say (Hugging
    Face image models: `workers.models.hf.seen_image`); (None, None) otherwise."""
    try:
        from workers.models.registry import ModelSpec, family_module

        spec = ModelSpec(**attrs["model_spec"])
        seen = getattr(family_module(spec), "seen_image", None)
        result = None if seen is None else seen(spec, image)
    except Exception:  # noqa: BLE001 - no processor here: the heat map alone is drawn
        return None, None
    return (None, None) if result is None else result


def _patch_labels(kinds: np.ndarray) -> list[str] | None:
    """'patch (row, col)' per content token when the special tokens come first and the content
    tokens make a square grid (row-major, as ViT and DINOv2 order them); else None."""
    content = np.flatnonzero(kinds == TokenKind.CONTENT)
    prefix = int(kinds.size - content.size)
    side = int(round(content.size ** 0.5))
    if side * side != content.size or not np.array_equal(content, np.arange(prefix, kinds.size)):
        return None
    return [""] * prefix + [f"patch ({k // side}, {k % side})" for k in range(content.size)]

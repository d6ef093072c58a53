"""Cropping captured per-layer maps to each input's real tokens, and the errors it raises."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from storage.errors import ExtractionError
from workers.models.extraction import Batch, assemble

KINDS = np.array([1, 0], dtype=np.int8)


def _layers(n_layers: int, batch: int, tokens: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.rand(batch, tokens, tokens, generator=gen) for _ in range(n_layers)]


def test_right_and_left_padded_inputs_are_cropped_to_their_real_tokens():
    layers = _layers(2, 2, 3)  # (batch, query, key) per layer
    batch = Batch({}, [torch.tensor([0, 1]), torch.tensor([1, 2])], [KINDS, KINDS])
    right, left = assemble("m", 2, layers, batch, ["r", "l"])
    for layer in range(2):
        np.testing.assert_array_equal(right.attention[layer], layers[layer][0, :2, :2].numpy())
        np.testing.assert_array_equal(left.attention[layer], layers[layer][1, 1:, 1:].numpy())
    assert right.attention.dtype == np.float32 and left.token_kind.tolist() == [1, 0]


def test_a_missing_layer_is_an_extraction_error_with_the_fix():
    batch = Batch({}, [torch.arange(2)], [KINDS])
    with pytest.raises(ExtractionError, match="returned 1 attention layers for its 2 layers"):
        assemble("m", 2, _layers(1, 1, 2), batch, ["x"])


def test_non_finite_attention_names_input_layer_and_row():
    layers = _layers(2, 1, 2)
    layers[1][0, 1, 0] = float("nan")
    batch = Batch({}, [torch.arange(2)], [KINDS])
    with pytest.raises(ExtractionError, match="input 'x': non-finite attention at layer 1, row 1"):
        assemble("m", 2, layers, batch, ["x"])


def test_token_kinds_must_match_the_tokens():
    batch = Batch({}, [torch.arange(2)], [np.array([1], dtype=np.int8)])
    with pytest.raises(ExtractionError, match="2 tokens but 1 token kinds"):
        assemble("m", 1, _layers(1, 1, 2), batch, ["x"])

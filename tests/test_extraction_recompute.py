"""The extracted matrices equal an independent float64 recomputation from each layer's queries
and keys (one transformers family, one timm family)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from workers.inputs import DatasetSpec, open_dataset
from workers.models.extraction import load_extractor
from workers.models.registry import resolve_model


def _images(n: int = 2) -> tuple[list, list[str]]:
    dataset = open_dataset(DatasetSpec(kind="image", source="sklearn:sample_images", limit=n))
    return dataset.load(range(n)), list(dataset.ids)


def _softmax_mean(q: torch.Tensor, k: torch.Tensor, scale: float) -> np.ndarray:
    """q, k: (batch, heads, T, d_head) float64 -> (batch, T, T) head-mean of softmax(q k^T s)."""
    return torch.softmax(q @ k.transpose(-1, -2) * scale, dim=-1).mean(1).numpy()


def _check(extractions, expected) -> None:
    assert len(expected) == extractions[0].attention.shape[0]
    for b, out in enumerate(extractions):
        for layer, maps in enumerate(expected):
            np.testing.assert_allclose(out.attention[layer], maps[b], rtol=0, atol=2e-6)


def test_dinov2_registers_match_queries_and_keys():
    ex = load_extractor(resolve_model("tiny-dinov2-reg"), device="cpu")
    expected = []

    def hook(module, args, kwargs):
        h = (args[0] if args else kwargs["hidden_states"]).double()  # (batch, T, d)
        heads = module.num_attention_heads

        def project(linear):  # (batch, heads, T, d_head)
            out = F.linear(h, linear.weight.double(), linear.bias.double())
            return out.view(h.shape[0], h.shape[1], heads, -1).transpose(1, 2)

        expected.append(_softmax_mean(project(module.q_proj), project(module.k_proj),
                                      module.head_dim ** -0.5))

    handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for m, _ in ex.attention_modules]
    try:
        items, ids = _images()
        outs = ex.extract(items, ids)
    finally:
        for handle in handles:
            handle.remove()
    _check(outs, expected)


def test_timm_deit_distilled_matches_queries_and_keys():
    ex = load_extractor(resolve_model("tiny-deit-distilled"), device="cpu")
    expected = []

    def hook(module, args):
        x = args[0].double()  # (batch, T, d)
        batch, tokens, _ = x.shape
        qkv = F.linear(x, module.qkv.weight.double(), module.qkv.bias.double())
        qkv = qkv.reshape(batch, tokens, 3, module.num_heads, -1).permute(2, 0, 3, 1, 4)
        q, k = qkv[0], qkv[1]  # (batch, heads, T, d_head); q_norm/k_norm are identities here
        assert isinstance(module.q_norm, torch.nn.Identity)
        expected.append(_softmax_mean(q, k, module.head_dim ** -0.5))

    handles = [b.attn.register_forward_pre_hook(hook) for b in ex.model.blocks]
    try:
        items, ids = _images()
        outs = ex.extract(items, ids)
    finally:
        for handle in handles:
            handle.remove()
    _check(outs, expected)

"""FT-Transformer: seeded training cached as safetensors with its test metric, CLS at token 0,
and a recomputed full attention that equals the library's own rows where it computes them."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from workers.errors import InputError
from workers.extraction import load_extractor, prepare_model
from workers.inputs import DatasetSpec, open_dataset
from workers.models import ft_transformer, resolve_model
from workers.token_kinds import TokenKind

SPEC = resolve_model("ft-transformer", n_blocks=2, max_epochs=2, patience=1)


@pytest.fixture(scope="module")
def wine():
    return open_dataset(DatasetSpec(kind="tabular", source="sklearn:wine", limit=5))


@pytest.fixture(scope="module")
def cache(tmp_path_factory, wine):
    directory = tmp_path_factory.mktemp("ft-cache")
    prepare_model(SPEC, wine, directory)
    return directory


def test_checkpoint_and_test_metric_are_saved_beside_each_other(cache, wine):
    path = ft_transformer.checkpoint_path(SPEC, wine.table, cache)
    assert path.suffix == ".safetensors" and path.is_file()
    metrics = json.loads(path.with_suffix(".json").read_text())
    assert metrics["metric"] == "accuracy" and 0.0 <= metrics["test"] <= 1.0
    assert metrics["split"] == {"train": 106, "val": 36, "test": 36}
    assert metrics["table"] == wine.table.fingerprint


def test_existing_checkpoint_is_reused(cache, wine, monkeypatch):
    def no_training(*args):
        raise AssertionError("trained again")

    monkeypatch.setattr(ft_transformer, "train", no_training)
    prepare_model(SPEC, wine, cache)
    assert load_extractor(SPEC, dataset=wine, cache_dir=cache, device="cpu").n_layers == 2


def test_split_is_fixed_by_the_seed_and_partitions_the_rows():
    a = ft_transformer.split_indices(100, 3, 0.2, 0.2)
    b = ft_transformer.split_indices(100, 3, 0.2, 0.2)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert sorted(np.concatenate(list(a.values())).tolist()) == list(range(100))
    assert not np.array_equal(a["test"], ft_transformer.split_indices(100, 4, 0.2, 0.2)["test"])


def test_cls_is_token_zero_and_features_are_content(cache, wine):
    ex = load_extractor(SPEC, dataset=wine, cache_dir=cache, device="cpu")
    seen = []
    handle = ex.model.backbone.blocks[0]["attention"].register_forward_pre_hook(
        lambda module, args: seen.append(args[1])
    )
    try:
        out = ex.extract(wine.load(range(2)), wine.ids[:2])
    finally:
        handle.remove()
    # Block 0 has no input normalisation: its token 0 is the library's CLS embedding itself.
    torch.testing.assert_close(seen[0][:, 0], ex.model.cls_embedding.weight.expand(2, -1))
    assert out[0].token_kind.tolist() == [TokenKind.CLS] + [TokenKind.CONTENT] * 13


def test_recomputed_attention_equals_the_library_rows(cache, wine):
    ex = load_extractor(SPEC, dataset=wine, cache_dir=cache, device="cpu")
    own = []  # per block: (batch * heads, queries, T), queries = T, or 1 (CLS) in the last block
    handles = [
        block["attention"].dropout.register_forward_hook(lambda m, a, out: own.append(out))
        for block in ex.model.backbone.blocks
    ]
    try:
        outs = ex.extract(wine.load(range(5)), wine.ids[:5])
    finally:
        for handle in handles:
            handle.remove()
    heads = ex.attentions[0]._n_heads
    assert [o.shape[1] for o in own] == [14, 1]
    for layer, probs in enumerate(own):
        mean = probs.reshape(5, heads, *probs.shape[1:]).mean(1).numpy()  # (batch, queries, T)
        for b, out in enumerate(outs):
            rows = out.attention[layer][: mean.shape[1]]
            np.testing.assert_allclose(rows, mean[b], rtol=0, atol=1e-6)
            np.testing.assert_allclose(out.attention[layer].sum(-1), 1.0, atol=1e-5)


def test_ft_transformer_needs_a_tabular_dataset():
    with pytest.raises(InputError, match="needs a tabular dataset"):
        load_extractor(SPEC, device="cpu")

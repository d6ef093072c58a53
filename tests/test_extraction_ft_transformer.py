"""FT-Transformer: seeded training cached as safetensors with its record, measured on the test
rows, CLS at token 0, a recomputed full attention that equals the library's own rows where it
computes them, the last block skipped or kept, and the random-init control."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from storage.errors import InputError
from workers.exact.token_kinds import TokenKind
from workers.inputs import DatasetSpec, open_dataset
from workers.models.extraction import load_extractor, model_dataset, prepare_model
from workers.models.registry import resolve_model
from workers.models.trained.ft import adapter as ft_transformer
from workers.models.trained.ft import training as ft_training
from workers.models.trained.ft.data import init_model
from workers.models.trained.split import split_indices

TINY = dict(n_blocks=2, d_block=16, max_epochs=2, patience=1)
SPEC = resolve_model("ft-transformer", **TINY)  # last_block: skip (the default)
FULL = resolve_model("ft-transformer", **TINY, last_block="full")


@pytest.fixture(scope="module")
def wine():
    return open_dataset(DatasetSpec(kind="tabular", source="sklearn:wine"))


@pytest.fixture(scope="module")
def cache(tmp_path_factory, wine):
    directory = tmp_path_factory.mktemp("ft-cache")
    records = {spec: prepare_model(spec, wine, directory) for spec in (SPEC, FULL)}
    return directory, records


def test_checkpoint_and_training_record_are_saved_beside_each_other(cache, wine):
    directory, records = cache
    path = Path(ft_transformer.checkpoint_path(SPEC, wine.table, directory))
    assert path.suffix == ".safetensors" and path.is_file()
    record = json.loads(path.with_suffix(".json").read_text())
    assert record == records[SPEC]
    assert record["metric"] == "accuracy" and 0.0 <= record["test_score"] <= 1.0
    assert record["split"] == {"train": 106, "val": 36, "test": 36}
    assert record["table"] == wine.table.fingerprint
    assert record["stopped_by"] in ("patience", "max_epochs") and record["epochs_run"] <= 2
    assert record["n_params"] == sum(p.numel() for p in init_model(
        SPEC.options, SPEC.seed, wine.table).parameters())


def test_the_record_round_trips_from_the_cache_without_retraining(cache, wine, monkeypatch):
    directory, records = cache

    def no_training(*args):
        raise AssertionError("trained again")

    monkeypatch.setattr(ft_training, "train", no_training)
    assert prepare_model(SPEC, wine, directory) == records[SPEC]
    assert load_extractor(SPEC, dataset=wine, cache_dir=directory, device="cpu").n_layers == 1


def test_measurement_options_share_the_checkpoint_training_options_do_not(cache, wine):
    directory, records = cache
    assert records[FULL] == records[SPEC]  # trained once: last_block changes no training
    path = ft_transformer.checkpoint_path
    assert path(SPEC, wine.table, directory) == path(FULL, wine.table, directory) == path(
        resolve_model("ft-transformer", **TINY, split="all"), wine.table, directory)
    other = resolve_model("ft-transformer", **{**TINY, "patience": 2})
    assert path(other, wine.table, directory) != path(SPEC, wine.table, directory)


def test_split_is_fixed_by_the_seed_and_partitions_the_rows():
    a = split_indices(100, 3, 0.2, 0.2)
    b = split_indices(100, 3, 0.2, 0.2)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert sorted(np.concatenate(list(a.values())).tolist()) == list(range(100))
    assert not np.array_equal(a["test"], split_indices(100, 4, 0.2, 0.2)["test"])


def test_split_test_measures_the_held_out_rows_only(wine):
    split = split_indices(len(wine.table.target), SPEC.seed, 0.2, 0.2)
    measured = model_dataset(SPEC, wine)
    assert measured.ids == tuple(f"wine-{r}" for r in split["test"])  # ascending rows
    assert not set(measured.ids) & {f"wine-{r}" for r in np.concatenate(
        [split["train"], split["val"]])}
    np.testing.assert_array_equal(measured.load([0])[0], wine.table.features[split["test"][0]])
    assert model_dataset(resolve_model("ft-transformer", split="all"), wine).ids == wine.ids
    limited = open_dataset(DatasetSpec(kind="tabular", source="sklearn:wine", limit=4))
    assert model_dataset(SPEC, limited).ids == measured.ids[:4]  # limit: first N test rows
    tiny_vit = resolve_model("tiny-vit")
    assert model_dataset(tiny_vit, wine) is wine


def test_cls_is_token_zero_and_features_are_content(cache, wine):
    ex = load_extractor(SPEC, dataset=wine, cache_dir=cache[0], device="cpu")
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
    ex = load_extractor(FULL, dataset=wine, cache_dir=cache[0], device="cpu")
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


def test_last_block_skip_measures_one_layer_less(wine, tmp_path):
    # Same weights (the random-init control of both specs): only the measured layers differ.
    skip, full = (replace(s, random_init=True) for s in (SPEC, FULL))
    rows = wine.load(range(3))
    a = load_extractor(skip, dataset=wine, cache_dir=tmp_path, device="cpu")
    b = load_extractor(full, dataset=wine, cache_dir=tmp_path, device="cpu")
    assert (a.n_layers, b.n_layers) == (1, 2)
    out_a, out_b = a.extract(rows, wine.ids[:3]), b.extract(rows, wine.ids[:3])
    assert out_a[0].attention.shape == (1, 14, 14) and out_b[0].attention.shape == (2, 14, 14)
    np.testing.assert_array_equal(out_a[0].attention[0], out_b[0].attention[0])


def test_random_init_control_has_other_weights_and_the_same_inputs(cache, wine):
    directory, records = cache
    control = replace(SPEC, random_init=True)
    assert prepare_model(control, wine, directory) is None  # nothing to train
    trained = load_extractor(SPEC, dataset=wine, cache_dir=directory, device="cpu")
    random = load_extractor(control, dataset=wine, cache_dir=directory, device="cpu")
    q_trained = trained.model.backbone.blocks[0]["attention"].W_q.weight
    q_random = random.model.backbone.blocks[0]["attention"].W_q.weight
    assert not torch.equal(q_trained, q_random)
    # The control is the very initialisation training started from, seeded by spec.seed.
    initial = init_model(SPEC.options, SPEC.seed, wine.table).state_dict()
    assert all(torch.equal(v, initial[k]) for k, v in random.model.state_dict().items())
    # Same measured rows, same preprocessing: the models see identical inputs.
    assert model_dataset(control, wine).ids == model_dataset(SPEC, wine).ids
    items = model_dataset(control, wine).load(range(4))
    for key in ("x_cont", "x_cat"):
        a, b = trained.prepare(items).inputs[key], random.prepare(items).inputs[key]
        assert (a is None and b is None) or torch.equal(a, b)
    checkpoint = load_file(str(ft_transformer.checkpoint_path(SPEC, wine.table, directory)))
    assert not torch.equal(checkpoint["backbone.blocks.0.attention.W_q.weight"], q_random)


def test_ft_transformer_needs_a_tabular_dataset():
    with pytest.raises(InputError, match="needs a tabular dataset"):
        load_extractor(SPEC, device="cpu")

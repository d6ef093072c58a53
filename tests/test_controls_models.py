"""Random-init controls build the same architecture with other, seeded weights (hf tiny, the real
MiniLM, timm tiny), without touching the global RNG, and see the same inputs as their model in
the store after a small in-process sweep."""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr

from sweep.config.load import load_config
from sweep.driver.runner import InProcessExecutor, run_sweep
from workers.models.extraction import load_extractor
from workers.models.random_init import control_seed
from workers.models.registry import resolve_model

TEXT = ["Attention rollout multiplies the layers.", "A second, longer sentence of prose here."]


@cache
def pair(name: str):
    """(trained extractor, control extractor) of a preset."""
    spec = resolve_model(name)
    return (load_extractor(spec, device="cpu"),
            load_extractor(replace(spec, random_init=True), device="cpu"))


@pytest.mark.parametrize("name", ["tiny-roberta", "minilm-l6", "tiny-vit"])
def test_control_has_the_same_architecture_and_other_weights(name):
    trained, control = pair(name)
    mine, theirs = trained.model.state_dict(), control.model.state_dict()
    assert {k: v.shape for k, v in mine.items()} == {k: v.shape for k, v in theirs.items()}
    differ = [k for k in mine if not torch.equal(mine[k], theirs[k])]
    weights = [k for k in mine if k.endswith("weight") and mine[k].ndim == 2]
    assert set(weights) <= set(differ)  # every weight matrix was drawn again
    assert control.n_layers == trained.n_layers and not control.model.training


def test_minilm_control_keeps_its_tokenizer_and_token_kinds():
    trained, control = pair("minilm-l6")
    assert control.tokenizer.get_vocab() == trained.tokenizer.get_vocab()
    ours, theirs = trained.extract(TEXT, ["a", "b"]), control.extract(TEXT, ["a", "b"])
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(a.token_kind, b.token_kind)
        assert a.attention.shape == b.attention.shape
        assert not np.allclose(a.attention, b.attention, atol=1e-3)


@pytest.mark.parametrize("name", ["tiny-distilbert", "tiny-deit-distilled"])
def test_control_weights_are_a_function_of_the_seed_and_leave_the_global_rng_alone(name):
    spec = replace(resolve_model(name, seed=3), random_init=True)
    state = torch.get_rng_state()
    first = load_extractor(spec, device="cpu").model.state_dict()
    assert torch.equal(torch.get_rng_state(), state)
    again = load_extractor(spec, device="cpu").model.state_dict()
    other = load_extractor(replace(spec, seed=4), device="cpu").model.state_dict()
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not all(torch.equal(first[k], other[k]) for k in first)


def test_control_seed_is_a_distinct_deterministic_stream():
    assert control_seed(0) == control_seed(0) != control_seed(1)
    assert control_seed(0) != 0 and 0 <= control_seed(2**40) < 2**63


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    folder = tmp_path_factory.mktemp("controls-sweep")
    (folder / "sweep.yaml").write_text("\n".join([
        "store: sweep.zarr", "shard_size: 2", "token_sets: [all, content]",
        "datasets:",
        "  photos: {source: 'sklearn:sample_images', limit: 3}",
        "  topics: {source: 'pydoc:topics', limit: 3}",
        "models:",
        "  vit: {source: tiny-deit-distilled, dataset: photos, control: random-init}",
        "  rob: {source: tiny-roberta, dataset: topics, control: random-init}",
    ]) + "\n")
    config = load_config(folder / "sweep.yaml")
    summary = run_sweep(config, InProcessExecutor(), progress=False)
    assert summary.exit_code == 0, summary.lines()
    return Path(config.store)


@pytest.mark.parametrize("name", ["vit", "rob"])
def test_model_and_control_see_the_same_inputs_and_token_sets(swept, name):
    root = zarr.open_group(str(swept), mode="r")
    assert root.attrs["models"] == ["vit", "vit@random-init", "rob", "rob@random-init"]
    trained, control = root[name], root[f"{name}@random-init"]
    for array in ("input_id", "n_tokens", "token_kind"):
        np.testing.assert_array_equal(trained[array][:], control[array][:], err_msg=array)
    assert trained.attrs["token_sets"] == control.attrs["token_sets"]
    assert control.attrs["model_spec"] == {**trained.attrs["model_spec"], "random_init": True}
    assert not np.array_equal(trained["attention"][:], control["attention"][:])
    done = control["results"]["status"][:]
    assert (done == trained["results"]["status"][:]).all()


def test_hf_image_checkpoint_control_uses_its_config_and_processor(tmp_path):
    from workers.inputs import DatasetSpec, open_dataset

    tiny = load_extractor(resolve_model("tiny-dinov2-reg"), device="cpu")
    tiny.model.save_pretrained(tmp_path, safe_serialization=True)
    tiny.processor.save_pretrained(tmp_path)
    spec = resolve_model(f"hf:{tmp_path}", image_size=84)
    trained = load_extractor(spec, device="cpu")
    control = load_extractor(replace(spec, random_init=True), device="cpu")
    keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "patch_size", "image_size",
            "num_register_tokens")
    assert [getattr(control.config, k) for k in keys] == [getattr(trained.config, k) for k in keys]
    dataset = open_dataset(DatasetSpec(kind="image", source="sklearn:sample_images", limit=2))
    items = dataset.load(range(2))
    batch, control_batch = trained.prepare(items), control.prepare(items)
    assert torch.equal(batch.inputs["pixel_values"], control_batch.inputs["pixel_values"])
    ours, theirs = trained.extract(items, ["a", "b"]), control.extract(items, ["a", "b"])
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(a.token_kind, b.token_kind)  # CLS, 4 registers, 36 patches
        assert a.attention.shape == b.attention.shape == (2, 41, 41)
        assert np.abs(a.attention - b.attention).max() > 1e-5  # near-uniform both: small logits
    mine, theirs = trained.model.state_dict(), control.model.state_dict()
    matrices = [k for k, v in mine.items() if k.endswith("weight") and v.ndim == 2]
    assert matrices and all(not torch.equal(mine[k], theirs[k]) for k in matrices)

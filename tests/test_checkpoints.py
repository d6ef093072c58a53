"""Checkpoints as a sweep axis: a trained model's epochs (`checkpoints:`) and a Hugging Face
model's revisions (`revision:`), each a model of its own named by rule, on the same inputs."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest
import zarr

from storage.errors import InputError
from storage.query import open_results
from sweep.config.checkpoints import checkpoint_groups
from sweep.config.load import load_config, parse_config
from sweep.driver.runner import InProcessExecutor, run_sweep
from workers.models.extraction import load_extractor
from workers.models.registry import resolve_model

VIT = {"source": "vit-digits", "dataset": "digits",
       "options": {"epochs": 2, "depth": 2, "embed_dim": 16, "num_heads": 2}}


def models_of(**models) -> dict:
    config = parse_config({"store": "s.zarr", "datasets": {
        "digits": {"kind": "image", "source": "sklearn:digits"},
        "photos": {"kind": "image", "source": "sklearn:sample_images"}}, "models": models})
    return {name: entry.options for name, entry in config.models.items()}


def test_epochs_expand_before_the_best_model_and_its_control_each_seed_trains_once():
    models = models_of(vit={**VIT, "seeds": [0, 1], "checkpoints": [2, 0, "best"],
                            "control": "random-init"})
    assert list(models) == [
        "vit@seed0@epoch0", "vit@seed0@epoch2", "vit@seed0", "vit@seed0@random-init",
        "vit@seed1@epoch0", "vit@seed1@epoch2", "vit@seed1", "vit@seed1@random-init"]
    assert models["vit@seed1@epoch2"]["checkpoint"] == 2
    assert "checkpoint" not in models["vit@seed1"]
    assert {tuple(models[n].get("keep_epochs", ())) for n in models if "random" not in n} \
        == {(0, 2)}
    assert checkpoint_groups(models)["vit@seed1"] == [
        ("epoch 0", "vit@seed1@epoch0"), ("epoch 2", "vit@seed1@epoch2"), ("best", "vit@seed1")]


def test_revisions_expand_into_one_model_each_with_one_control():
    hf = {"source": "hf:/nonexistent/model", "dataset": "photos", "options": {"modality": "image"}}
    models = models_of(dino={**hf, "revision": ["v1", "v2"], "control": "random-init"})
    assert list(models) == ["dino@rev-v1", "dino@rev-v2", "dino@random-init"]
    assert models["dino@rev-v2"]["revision"] == "v2"
    assert models["dino@random-init"]["revision"] == "v2"  # built from the last one's config
    assert checkpoint_groups(models) == {"dino": [("rev v1", "dino@rev-v1"),
                                                  ("rev v2", "dino@rev-v2")]}


@pytest.mark.parametrize(("entry", "message"), [
    ({"source": "tiny-vit", "dataset": "photos", "checkpoints": [0, 1]},
     "models.m.checkpoints: only a model the project trains"),
    ({**VIT, "checkpoints": [0, 0]}, "checkpoints repeat a value"),
    ({**VIT, "checkpoints": [9]}, "checkpoint epoch 9 is past the last epoch trained"),
    ({"source": "hf:/x", "dataset": "photos", "revision": ["refs/pr/1"],
      "options": {"modality": "image"}}, "revision 'refs/pr/1': use letters"),
])
def test_misuse_is_a_one_line_error_naming_the_key(entry, message):
    with pytest.raises(InputError, match=message):
        models_of(m=entry)


def git(folder, *args) -> str:
    return subprocess.run(["git", "-C", str(folder), "-c", "user.name=t", "-c",
                           "user.email=t@example.org", *args], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def two_revisions(tmp_path):
    """A local git folder holding a tiny DINOv2 twice: tag v1 (seed 0), tag v2 (seed 1)."""
    folder = tmp_path / "dino"
    folder.mkdir()
    git(folder, "init", "-q")
    for tag, seed in (("v1", 0), ("v2", 1)):
        tiny = load_extractor(resolve_model("tiny-dinov2", seed=seed), device="cpu")
        tiny.model.save_pretrained(folder, safe_serialization=True)
        tiny.processor.save_pretrained(folder)
        git(folder, "add", "-A")
        git(folder, "commit", "-q", "-m", tag)
        git(folder, "tag", tag)
    return folder


def test_a_sweep_measures_each_epoch_and_each_revision_on_the_same_inputs(
        tmp_path, two_revisions, monkeypatch):
    monkeypatch.setenv("DOBRUSHIN_CACHE", str(tmp_path / "cache"))
    options = "{epochs: 2, depth: 2, embed_dim: 16, num_heads: 2}"
    (tmp_path / "sweep.yaml").write_text(
        "store: s.zarr\nshard_size: 4\nbaseline: null\nattention: keep\n"
        "matched_nulls: {nulls: [uniform], trials: 1000, chunk_trials: 1000}\n"
        "datasets:\n  digits: {kind: image, source: 'sklearn:digits', limit: 6}\n"
        "  photos: {kind: image, source: 'sklearn:sample_images', limit: 2}\n"
        f"models:\n  vit: {{source: vit-digits, dataset: digits, seeds: [0], "
        f"checkpoints: [0, 1, best], control: random-init, options: {options}}}\n"
        f"  dino: {{source: 'hf:{two_revisions}', dataset: photos, revision: [v1, v2]}}\n")
    config = load_config(tmp_path / "sweep.yaml")
    assert run_sweep(config, InProcessExecutor(), progress=False).exit_code == 0
    tree, root = open_results(tmp_path / "s.zarr"), zarr.open_group(tmp_path / "s.zarr", mode="r")
    names = ["vit@seed0@epoch0", "vit@seed0@epoch1", "vit@seed0", "vit@seed0@random-init",
             "dino@rev-v1", "dino@rev-v2"]
    assert list(tree.children) == names
    att = {n: root[n]["attention"][:] for n in names}
    ids = {n: tuple(root[n]["input_id"][:]) for n in names}
    assert len({ids[n] for n in names[:4]}) == 1 and ids["dino@rev-v1"] == ids["dino@rev-v2"]
    np.testing.assert_array_equal(att["vit@seed0@epoch0"], att["vit@seed0@random-init"])
    assert not np.array_equal(att["vit@seed0@epoch1"], att["vit@seed0"]) or \
        tree["vit@seed0"].attrs["training"]["best_epoch"] == 1
    assert not np.array_equal(att["dino@rev-v1"], att["dino@rev-v2"])
    # each revision is exactly that commit's model
    v1 = load_extractor(resolve_model("tiny-dinov2", seed=0), device="cpu")
    from workers.inputs import DatasetSpec, open_dataset
    photos = open_dataset(DatasetSpec(kind="image", source="sklearn:sample_images", limit=2))
    direct = v1.extract(photos.load([0, 1]), list(photos.ids))
    t = direct[0].attention.shape[-1]
    np.testing.assert_array_equal(att["dino@rev-v1"][0, :, 0, :t, :t], direct[0].attention)
    # the working tree (v2) is not what v1 loads; a rerun finds everything done
    again = run_sweep(load_config(tmp_path / "sweep.yaml"), InProcessExecutor(), progress=False)
    assert again.exit_code == 0
    root = zarr.open_group(tmp_path / "s.zarr", mode="r")
    for n in names:
        np.testing.assert_array_equal(root[n]["attention"][:], att[n])


def test_an_unknown_revision_of_a_local_folder_is_a_one_line_error(two_revisions, tmp_path,
                                                                    monkeypatch):
    monkeypatch.setenv("DOBRUSHIN_CACHE", str(tmp_path / "cache"))
    spec = resolve_model(f"hf:{two_revisions}", revision="v9")
    with pytest.raises(InputError, match="revision 'v9' is not a commit"):
        load_extractor(spec, device="cpu")


FT = {"n_blocks": 2, "d_block": 8, "max_epochs": 3, "patience": 16}


def test_an_ft_transformer_keeps_its_epochs_and_epoch_0_is_its_control(tmp_path):
    import torch

    from workers.inputs import DatasetSpec, open_dataset
    from workers.models.trained.ft import adapter as ft_transformer

    wine = open_dataset(DatasetSpec(kind="tabular", source="sklearn:wine"))
    best = resolve_model("ft-transformer", **FT)
    plain = ft_transformer.ensure_checkpoint(best, wine, tmp_path / "plain")[0]
    two = resolve_model("ft-transformer", **FT, checkpoint=2, keep_epochs=[0, 2])
    assert ft_transformer.FAMILY.checkpoint_key(two, wine.table) == \
        ft_transformer.FAMILY.checkpoint_key(best, wine.table)
    weights, record = ft_transformer.ensure_checkpoint(two, wine, tmp_path / "kept")
    again = ft_transformer.ensure_checkpoint(best, wine, tmp_path / "kept")[0]
    assert all(torch.equal(plain[k], again[k]) for k in plain)  # keeping epochs changes nothing
    zero = ft_transformer.ensure_checkpoint(
        resolve_model("ft-transformer", **FT, checkpoint=0), wine, tmp_path / "kept")[0]
    initial = ft_transformer.initial_state(best, wine.table)
    assert all(torch.equal(initial[k], zero[k]) for k in initial)
    assert not torch.equal(weights["backbone.blocks.0.attention.W_q.weight"],
                           zero["backbone.blocks.0.attention.W_q.weight"])
    assert record["epochs_run"] == 3


def test_an_ft_epoch_after_early_stopping_is_a_one_line_error(tmp_path, monkeypatch):
    from workers.inputs import DatasetSpec, open_dataset
    from workers.models.trained.ft import adapter as ft_transformer
    from workers.models.trained.ft import training

    wine = open_dataset(DatasetSpec(kind="tabular", source="sklearn:wine"))
    real = training.train

    def stops_after_two(spec, table, keep=(), run=None):  # patience ends it at epoch 2
        state, kept, record = real(resolve_model("ft-transformer", **{**FT, "max_epochs": 2}),
                                   table, keep, run)
        return state, kept, {**record, "stopped_by": "patience"}

    monkeypatch.setattr(training, "train", stops_after_two)
    late = resolve_model("ft-transformer", **FT, checkpoint=3)
    with pytest.raises(InputError, match=r"checkpoint epoch 3 is past the last epoch trained "
                                         r"\(2, stopped by patience\)"):
        ft_transformer.ensure_checkpoint(late, wine, tmp_path)


def test_checkpoints_with_attention_drop_give_the_verdicts_of_keep_and_keep_no_attention(
        tmp_path):
    options = "{epochs: 2, depth: 2, embed_dim: 16, num_heads: 2}"
    stores = {}
    for policy in ("keep", "drop"):
        folder = tmp_path / policy
        folder.mkdir()
        (folder / "sweep.yaml").write_text(
            f"store: s.zarr\nshard_size: 4\nbaseline: null\nmatched_nulls: null\n"
            f"attention: {policy}\ncache_dir: {tmp_path / 'cache'}\n"
            "datasets:\n  digits: {kind: image, source: 'sklearn:digits', limit: 5}\n"
            f"models:\n  vit: {{source: vit-digits, dataset: digits, checkpoints: [0, 2, best], "
            f"options: {options}}}\n")
        run = run_sweep(load_config(folder / "sweep.yaml"), InProcessExecutor(), progress=False)
        assert run.exit_code == 0
        stores[policy] = zarr.open_group(folder / "s.zarr", mode="r")
    for name in ("vit@epoch0", "vit@epoch2", "vit"):
        kept, dropped = stores["keep"][name], stores["drop"][name]
        np.testing.assert_array_equal(kept["results/margin"][:], dropped["results/margin"][:])
        assert attention_chunks(tmp_path / "drop", name) == 0
        assert attention_chunks(tmp_path / "keep", name) == 5


def attention_chunks(folder, model: str) -> int:
    return sum(p.is_file() for p in (folder / "s.zarr" / model / "attention" / "c").rglob("*"))

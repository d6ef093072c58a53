"""The `image_size` option: inputs resized and cropped to it, position embeddings interpolated as
each library does, so T = (size / patch)^2 + prefix tokens; and the study's image presets, checked
against timm's offline registry (no weights here)."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest
import timm
from transformers import AutoConfig, AutoModel, ViTImageProcessor

from storage.errors import InputError
from workers.exact.token_kinds import TokenKind as K
from workers.inputs import DatasetSpec, open_dataset
from workers.models.extraction import load_extractor
from workers.models.hf import sized_processor_kwargs
from workers.models.registry import PRESETS, STUDY_IMAGE_SIZE, resolve_model
from workers.models.timm_ import prefix_kinds
from workers.models.token_layout import token_layout


@cache
def images() -> tuple[list, list[str]]:
    dataset = open_dataset(DatasetSpec(kind="image", source="sklearn:sample_images", limit=2))
    return list(dataset.load(range(2))), list(dataset.ids)


def extract_shape(spec) -> tuple[int, ...]:
    items, ids = images()
    outs = load_extractor(spec, device="cpu").extract(items, ids)
    assert {out.attention.shape for out in outs} == {outs[0].attention.shape}
    return outs[0].attention.shape  # (layer, T, T)


@pytest.mark.parametrize(("name", "size", "tokens"), [
    ("tiny-dinov2", 84, 37),  # (84 / 14)^2 + CLS
    ("tiny-dinov2-reg", 84, 41),  # + 4 registers
    ("tiny-vit", 96, 37),  # (96 / 16)^2 + CLS
])
def test_tokens_follow_the_image_size(name, size, tokens):
    assert extract_shape(resolve_model(name, image_size=size)) == (2, tokens, tokens)


def test_dinov2_at_518_pixels_has_1370_tokens():
    ex = load_extractor(resolve_model("tiny-dinov2", image_size=518), device="cpu")
    assert ex.token_counts(images()[0]) == [(518 // 14) ** 2 + 1] * 2 == [1370] * 2


def test_hf_checkpoint_at_another_size_interpolates_its_positions(tmp_path):
    tiny = load_extractor(resolve_model("tiny-dinov2"), device="cpu")  # positions for 56 px
    tiny.model.save_pretrained(tmp_path, safe_serialization=True)
    tiny.processor.save_pretrained(tmp_path)
    spec = resolve_model(f"hf:{tmp_path}", image_size=84)
    assert extract_shape(spec) == (2, 37, 37)
    assert token_layout(spec).tokens == 37  # the plan sizes it as extraction does
    ex = load_extractor(spec, device="cpu")
    # the processor's ratio kept: shortest edge 64 for a 56 px crop -> 96 for 84
    assert ex.processor_kwargs == {"size": {"shortest_edge": 96},
                                   "crop_size": {"height": 84, "width": 84}}


def test_hf_vit_checkpoint_is_called_with_interpolated_positions(tmp_path):
    config = AutoConfig.for_model("vit", hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=4, intermediate_size=64, image_size=32,
                                  patch_size=8)
    AutoModel.from_config(config).save_pretrained(tmp_path, safe_serialization=True)
    ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(tmp_path)
    assert extract_shape(resolve_model(f"hf:{tmp_path}")) == (2, 17, 17)
    assert extract_shape(resolve_model(f"hf:{tmp_path}", image_size=64)) == (2, 65, 65)


def test_resize_only_processor_resizes_to_the_size():
    assert sized_processor_kwargs(ViTImageProcessor(), 518) == \
        {"size": {"height": 518, "width": 518}}


def test_timm_weights_load_at_another_size_with_resampled_positions(tmp_path):
    from safetensors.torch import save_file

    tiny = load_extractor(resolve_model("tiny-vit"), device="cpu")  # 64 px: 16 patches
    path = tmp_path / "w.safetensors"
    save_file({k: v.contiguous() for k, v in tiny.model.state_dict().items()}, str(path))
    bigger = load_extractor(resolve_model("tiny-vit", image_size=96, weights=str(path)),
                            device="cpu")
    assert tuple(bigger.model.pos_embed.shape) == (1, 37, 32)
    np.testing.assert_array_equal(bigger.model.blocks[0].attn.qkv.weight.detach(),
                                  tiny.model.blocks[0].attn.qkv.weight.detach())
    assert bigger.token_counts(images()[0]) == [37, 37]


@pytest.mark.parametrize(("option", "match"), [
    ({"image_size": 0}, "image_size=0 must be an integer >= 1"),
    ({"image_size": "518"}, "image_size='518' must be an integer >= 1"),
    ({"image_size": 10**9}, r"image_size=1000000000 is above 2048 px, the most a sweep plans"),
])
def test_bad_image_sizes_are_named(option, match):
    with pytest.raises(InputError, match=match):
        resolve_model("dinov2-small", **option)


def test_text_models_take_no_image_size():
    with pytest.raises(InputError, match=r"\['image_size'\] do not apply"):
        resolve_model("tiny-roberta", image_size=224)


# --- presets -------------------------------------------------------------------------------------

STUDY_IMAGE = ["dinov2-small", "dinov2-base", "dinov2-large", "dinov2-small-reg",
               "dinov2-base-reg", "dinov2-large-reg", "deit-base", "deit-base-distilled",
               "vit-base-16", "vit-base-16-orig"]


@pytest.mark.parametrize("name", STUDY_IMAGE)
def test_study_image_presets_default_to_224_pixels_and_take_another(name):
    assert resolve_model(name).options["image_size"] == STUDY_IMAGE_SIZE == 224
    assert resolve_model(name, image_size=518).options["image_size"] == 518


@pytest.mark.parametrize(("name", "tag", "prefix"), [
    ("deit-base", "deit_base_patch16_224.fb_in1k", (K.CLS,)),
    ("deit-base-distilled", "deit_base_distilled_patch16_224.fb_in1k", (K.CLS, K.DIST)),
    ("vit-base-16", "vit_base_patch16_224.augreg2_in21k_ft_in1k", (K.CLS,)),
    ("vit-base-16-orig", "vit_base_patch16_224.orig_in21k_ft_in1k", (K.CLS,)),
])
def test_timm_presets_name_registered_checkpoints_and_their_token_layout(name, tag, prefix):
    spec = PRESETS[name]
    assert spec.source == tag and spec.pretrained
    assert timm.models.get_pretrained_cfg(tag).tag == tag.split(".")[1]
    # the architecture at toy width (no weights): its prefix tokens
    small = timm.create_model(tag, pretrained=False, embed_dim=32, depth=1, num_heads=4)
    assert prefix_kinds(small) == prefix



def test_extract_cli_takes_an_image_size_and_a_random_init_control(tmp_path):
    from sweep.cli.entry import main

    runs = {}
    for name, flags in (("model", []), ("control", ["--random-init"])):
        out = tmp_path / f"{name}.npz"
        assert main(["extract", "tiny-vit", "sklearn:sample_images", "--limit", "1",
                     "--image-size", "96", "--device", "cpu", "--out", str(out), *flags]) == 0
        runs[name] = np.load(out)
    assert runs["model"]["attention_0"].shape == (2, 37, 37)
    np.testing.assert_array_equal(runs["model"]["token_kind_0"], runs["control"]["token_kind_0"])
    assert not np.array_equal(runs["model"]["attention_0"], runs["control"]["attention_0"])

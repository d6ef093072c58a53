"""The model registry: presets, source forms, and specs that are small, hashable and JSON-able."""

from __future__ import annotations

import importlib
import json
import pickle

import pytest

from storage.errors import InputError
from workers.models.registry import FAMILY_MODULES, PRESETS, ModelSpec, resolve_model
from workers.models.token_layout import TokenLayout, token_layout

STUDY = [
    "dinov2-small", "dinov2-base", "dinov2-large", "dinov2-small-reg", "dinov2-base-reg",
    "dinov2-large-reg", "roberta-base", "distilbert-base", "deit-base", "deit-base-distilled",
    "vit-base-16", "vit-base-16-orig", "ft-transformer",
]
TINY = ["tiny-dinov2", "tiny-dinov2-reg", "tiny-roberta", "tiny-distilbert", "tiny-vit",
        "tiny-deit", "tiny-deit-distilled"]


def test_every_study_model_and_tiny_model_is_a_preset():
    assert set(STUDY + TINY) <= set(PRESETS)
    assert PRESETS["deit-base"].source == "deit_base_patch16_224.fb_in1k"  # not distilled
    assert PRESETS["deit-base-distilled"].source == "deit_base_distilled_patch16_224.fb_in1k"
    assert PRESETS["dinov2-base-reg"].source == "facebook/dinov2-with-registers-base"
    assert all(not PRESETS[name].pretrained for name in TINY)


@pytest.mark.parametrize("name", STUDY + TINY)
def test_specs_are_hashable_picklable_and_round_trip_json(name):
    spec = resolve_model(name)
    assert hash(spec) == hash(resolve_model(name))
    assert pickle.loads(pickle.dumps(spec)) == spec
    assert ModelSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


def test_unknown_model_lists_presets_and_source_forms():
    with pytest.raises(InputError, match=r"unknown model 'gpt-9'.*tiny-vit.*hf:<hub id") as error:
        resolve_model("gpt-9")
    assert "\n" not in str(error.value)


def test_source_forms():
    assert resolve_model("timm:vit_small_patch16_224").family == "timm"
    spec = resolve_model("hf:some/id", modality="text")
    assert (spec.family, spec.source, spec.modality) == ("hf", "some/id", "text")


def test_hf_local_directory_modality_comes_from_its_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "dinov2", "image_size": 518}))
    spec = resolve_model(f"hf:{tmp_path}")
    assert spec.modality == "image" and spec.source == str(tmp_path)


def test_hf_local_directory_without_config_is_named(tmp_path):
    with pytest.raises(InputError, match="no config.json"):
        resolve_model(f"hf:{tmp_path}")


def test_timm_weights_must_be_an_existing_safetensors_file(tmp_path):
    with pytest.raises(InputError, match=r"\.safetensors"):
        resolve_model("timm:vit_base_patch16_224", weights=str(tmp_path / "w.pth"))
    with pytest.raises(InputError, match="not found"):
        resolve_model("timm:vit_base_patch16_224", weights=str(tmp_path / "w.safetensors"))


def test_ft_transformer_options_are_part_of_the_spec():
    spec = resolve_model("ft-transformer", max_epochs=3, seed=7)
    assert spec.options["max_epochs"] == 3 and spec.seed == 7
    assert spec != resolve_model("ft-transformer")
    with pytest.raises(InputError, match=r"unknown option\(s\) \['lr_x'\]"):
        resolve_model("ft-transformer", lr_x=1)


@pytest.mark.parametrize(
    ("option", "match"),
    [
        ({"max_epochs": 0}, "max_epochs=0 must be an integer >= 1"),
        ({"n_blocks": 7}, "n_blocks=7 must be an integer >= 1 and <= 6"),
        ({"val_fraction": 0.9}, r"val_fraction=0.9 must be in \(0, 0.5\)"),
    ],
)
def test_ft_transformer_options_are_checked(option, match):
    with pytest.raises(InputError, match=match):
        resolve_model("ft-transformer", **option)


def test_options_that_do_not_apply_are_refused():
    with pytest.raises(InputError, match="do not apply"):
        resolve_model("tiny-roberta", max_epochs=3)
    with pytest.raises(InputError, match=r"\['weights'\] do not apply"):
        resolve_model("dinov2-small", weights="w.safetensors")


@pytest.mark.parametrize("family", sorted(FAMILY_MODULES))
def test_a_family_is_its_module_and_the_planner_sizes_it_through_that_module(family, monkeypatch):
    module = importlib.import_module(FAMILY_MODULES[family])
    assert callable(module.build_extractor) and callable(module.token_layout)
    spec = next(spec for spec in PRESETS.values() if spec.family == family)
    marker = TokenLayout(n_layers=7, n_heads=2, tokens=3)
    monkeypatch.setattr(module, "token_layout", lambda got, _: marker if got == spec else None)
    assert token_layout(spec, dataset=None) is marker

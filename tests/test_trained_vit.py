"""The digits ViT trained by the project (`vit-digits`): the digits as images, a recipe that gives
the same bits on 1 and on 2 torch threads, its cache of kept epochs, and its control."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import load

from storage.errors import InputError
from storage.location import locate
from workers.inputs import DatasetSpec, open_dataset
from workers.inputs.digests import input_digests
from workers.models.extraction import load_extractor, model_dataset, prepare_model
from workers.models.registry import resolve_model
from workers.models.trained.cache import epoch_key, read_record
from workers.models.trained.vit import adapter
from workers.models.trained.vit.data import init_model

TINY = {"depth": 2, "embed_dim": 16, "num_heads": 2, "epochs": 3}


@pytest.fixture(scope="module")
def digits():
    return open_dataset(DatasetSpec(kind="image", source="sklearn:digits"))


def spec(**options):
    return resolve_model("vit-digits", **{**TINY, **options})


def test_the_digits_are_8_by_8_images_with_their_label_in_a_stable_id(digits):
    from sklearn.datasets import load_digits

    raw = load_digits()
    assert len(digits) == len(raw.target) == 1797
    assert digits.ids[:2] == ("digit-0000-label0", "digit-0001-label1")
    image = digits.load([5])[0]
    assert (image.size, image.mode) == ((8, 8), "L")
    expected = np.rint(raw.images[5] * 255 / 16).astype(np.uint8)  # 0..16 -> 0..255
    np.testing.assert_array_equal(np.asarray(image), expected)


def test_each_digits_digest_follows_its_pixels_and_for_a_trained_model_the_table(digits):
    plain, trained = (input_digests(digits, [0, 1], whole_table=w) for w in (False, True))
    assert len(set(plain) | set(trained)) == 4


def test_a_model_is_measured_on_its_seeds_held_out_test_digits(digits):
    one, two = (model_dataset(spec(seed=s), digits) for s in (0, 1))
    assert len(one) == len(two) == round(0.2 * 1797)
    assert one.ids != two.ids
    assert all(digits.ids.index(i) in set(one.rows) for i in one.ids[:5])


def test_training_is_the_same_on_one_and_on_two_threads(tmp_path, digits):
    saved = torch.get_num_threads()
    out = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            folder = tmp_path / str(threads)
            record = prepare_model(spec(keep_epochs=[0, 2]), digits, folder)
            files = {p.name: p.read_bytes() for p in folder.iterdir() if p.suffix != ".json"}
            out.append(({k: v for k, v in record.items() if k not in ("wall_s", "cpu_s")}, files))
            assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(saved)
    assert out[0] == out[1]
    assert len(out[0][1]) == 3  # best, epoch 0, epoch 2
    assert out[0][0]["torch_threads"] == 1 and out[0][0]["epochs_run"] == 3


def test_an_epoch_asked_for_later_is_trained_again_to_the_same_bits(tmp_path, digits):
    best = spec()
    prepare_model(best, digits, tmp_path)
    key = adapter.FAMILY.checkpoint_key(best, digits.table)
    before = (tmp_path / key).read_bytes()
    assert adapter.FAMILY.checkpoint_key(spec(checkpoint=2, keep_epochs=[1, 2]),
                                         digits.table) == key
    weights, _ = adapter.ensure_checkpoint(spec(checkpoint=2), digits, tmp_path)
    assert (tmp_path / key).read_bytes() == before  # the same training, the same best weights
    stored = load((tmp_path / epoch_key(key, 2)).read_bytes())
    assert all(torch.equal(weights[k], stored[k]) for k in stored)
    record = read_record(locate(tmp_path), key)
    assert record["best_epoch"] in (1, 2, 3) and len(record["history"]["val_loss"]) == 3


def test_epoch_0_and_the_control_are_the_initial_weights_training_starts_from(tmp_path, digits):
    measured = model_dataset(spec(), digits)
    items, ids = measured.load([0, 1]), measured.ids[:2]
    epoch0 = load_extractor(spec(checkpoint=0), dataset=measured, cache_dir=tmp_path)
    control = load_extractor(spec(random_init=True), dataset=measured, cache_dir=tmp_path)
    best = load_extractor(spec(), dataset=measured, cache_dir=tmp_path)
    a, b, c = (e.extract(items, ids) for e in (epoch0, control, best))
    np.testing.assert_array_equal(a[0].attention, b[0].attention)
    assert not np.array_equal(a[0].attention, c[0].attention)
    initial = init_model(spec().options, 0, 10).state_dict()
    assert all(torch.equal(initial[k], v) for k, v in epoch0.model.state_dict().items())
    assert a[0].attention.shape == (2, 17, 17)  # 2 blocks; CLS + 16 patches of 2 x 2 px
    assert list(a[0].token_kind[:2]) == [1, 0]


def test_registers_follow_cls_and_bad_options_are_one_line_errors():
    from workers.models.token_layout import token_layout

    assert token_layout(spec(reg_tokens=2)).tokens == 19
    for options, message in (({"patch_size": 3}, "must divide the image side"),
                             ({"checkpoint": 9}, "past the last epoch trained"),
                             ({"embed_dim": 15}, "multiple of num_heads"),
                             ({"lr": 0}, "option lr=0 must be a number > 0"),
                             ({"warmup": 1}, "unknown option")):
        with pytest.raises(InputError, match=message):
            spec(**options)


def test_it_needs_the_digits_as_images(tmp_path):
    wine = open_dataset(DatasetSpec(kind="tabular", source="sklearn:wine"))
    with pytest.raises(InputError, match="needs the digits as images"):
        prepare_model(spec(), wine, tmp_path)


def test_sweep_show_says_which_digit_and_draws_it_with_its_patches(digits):
    from sweep.show.source import describe_input
    from workers.exact.token_kinds import TokenKind

    attrs = {"dataset_spec": DatasetSpec(kind="image", source="sklearn:digits").to_dict(),
             "model_spec": spec().to_dict()}
    kinds = np.array([TokenKind.CLS] + [TokenKind.CONTENT] * 16, dtype=np.int8)
    about = describe_input(attrs, "digit-0005-label5", kinds)
    assert about.line == "image digit-0005-label5 (sklearn:digits) (8×8 px)"
    assert about.picture.shape == (8, 8, 3) and about.patch == 2
    np.testing.assert_array_equal(about.picture[:, :, 0], np.asarray(digits.load([5])[0]))
    assert about.labels[1] == "patch (0, 0)" and about.labels[16] == "patch (3, 3)"


def test_the_two_other_objectives_train_the_same_architecture_and_record_a_linear_probe(
        tmp_path, digits):
    """DINO (no labels: the teacher's ViT is kept, the last epoch) and DeiT (a DIST token after
    CLS, taught by a convnet): each keeps its epochs and scores its features with a probe."""
    tiny = {"depth": 1, "embed_dim": 8, "num_heads": 2, "epochs": 2, "batch_size": 256}
    dino = resolve_model("vit-digits", objective="dino", keep_epochs=[0], **tiny)
    record = prepare_model(dino, digits, tmp_path)
    assert record["objective"] == "dino" and record["best_epoch"] == 2  # the last epoch
    assert set(record["probe"]) == {"kept", "initial"} and record["test_score"] == \
        record["probe"]["kept"]["test"]
    assert set(record["history"]) == {"train_loss", "val_knn_accuracy", "test_knn_accuracy"}
    deit = resolve_model("vit-digits", objective="distilled", **tiny)
    record = prepare_model(deit, digits, tmp_path)
    assert record["hyperparameters"]["teacher"]["test_accuracy"] > 0.5
    measured = model_dataset(deit, digits)
    extractor = load_extractor(deit, dataset=measured, cache_dir=tmp_path)
    item = extractor.extract(measured.load([0]), measured.ids[:1])[0]
    assert item.attention.shape == (1, 18, 18)  # CLS, DIST, 16 patches
    assert list(item.token_kind[:3]) == [1, 4, 0]
    from workers.models.token_layout import token_layout

    assert token_layout(deit).tokens == 18 and token_layout(dino).tokens == 17
    assert spec(objective="supervised") == spec()  # the default, named: the same model
    with pytest.raises(InputError, match="objective distilled reads CLS and DIST"):
        spec(objective="distilled", reg_tokens=1)
    with pytest.raises(InputError, match=r"option objective='mae' must be one of"):
        spec(objective="mae")

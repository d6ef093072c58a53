"""An image folder's files as tensors (`load_pixels`) hold exactly the pixels of its PIL images
(`load`), JPEGs of every kind through torchvision's decoder, and an image processor makes the
same model inputs of both; where the decoders would differ, or a file is not an RGB JPEG, PIL
decodes it; a damaged file is the error `load` gives."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from sklearn.datasets import load_sample_images

from storage.errors import InputError
from workers.inputs import pixels
from workers.inputs.base import DatasetSpec
from workers.inputs.images import ImageFolder, _read_rgb
from workers.inputs.pixels import pil_tensor, rgb_pixels

# (name, size, save options): the JPEG kinds PIL writes, odd sizes for the chroma edges
JPEGS = [
    ("s420.jpg", (201, 133), {"quality": 90, "subsampling": 2}),
    ("s422.jpg", (160, 97), {"quality": 75, "subsampling": 1}),
    ("s444.jpg", (99, 121), {"quality": 95, "subsampling": 0}),
    ("progressive.jpg", (257, 190), {"quality": 85, "progressive": True}),
    ("optimized.jpg", (128, 128), {"quality": 60, "optimize": True}),
    ("q100.jpg", (75, 51), {"quality": 100}),
]


@pytest.fixture(autouse=True)
def fresh_checks():
    pixels.forget_checks()
    yield
    pixels.forget_checks()


def photo(size: tuple[int, int], offset: int = 0) -> Image.Image:
    array = load_sample_images().images[offset % 2]
    width, height = size
    return Image.fromarray(np.ascontiguousarray(array[offset:offset + height,
                                                      offset:offset + width]))


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    for k, (name, size, options) in enumerate(JPEGS):
        photo(size, 3 * k).save(tmp_path / name, **options)
    photo((64, 48)).convert("L").save(tmp_path / "grey.jpg")
    photo((64, 48)).convert("CMYK").save(tmp_path / "cmyk.jpg")
    photo((30, 20)).save(tmp_path / "lossless.png")
    return tmp_path


def test_every_file_gives_its_pil_images_pixels_and_jpegs_come_from_torchvision(folder):
    data = ImageFolder(DatasetSpec(kind="image", path=str(folder)))
    got = data.load_pixels(range(len(data)))
    for name, tensor, image in zip(data.ids, got, data.load(range(len(data))), strict=True):
        assert tensor.dtype == torch.uint8 and tensor.shape == (3, image.height, image.width)
        assert torch.equal(tensor, pil_tensor(image)), name
        assert torch.equal(pil_tensor(image), torch.from_numpy(np.array(image)).permute(2, 0, 1))
        # laid out as a decoder writes them (row, column, channel): no copy before the resize
        assert tensor.permute(1, 2, 0).is_contiguous()
        assert pil_tensor(image).permute(1, 2, 0).is_contiguous()
    # each RGB JPEG kind was checked against PIL once, and agreed: its pixels are the decoder's
    assert len(pixels._AGREES) == len({(o.get("subsampling", 2), o.get("progressive", False))
                                       for _, _, o in JPEGS})
    assert all(pixels._AGREES.values())


def test_an_image_processor_makes_the_same_inputs_of_both(folder):
    from transformers import BitImageProcessor, ViTImageProcessor

    data = ImageFolder(DatasetSpec(kind="image", path=str(folder)))
    everything = range(len(data))
    for processor in (ViTImageProcessor(), BitImageProcessor(
            size={"shortest_edge": 72}, crop_size={"height": 64, "width": 64})):
        assert processor.backend == "torchvision"
        from_pil = processor(images=data.load(everything), return_tensors="pt")
        from_tensors = processor(images=data.load_pixels(everything), return_tensors="pt")
        assert torch.equal(from_pil["pixel_values"], from_tensors["pixel_values"])


def test_the_layout_keeping_processor_gives_the_processors_values_without_copying(folder):
    from transformers import BitImageProcessor, ViTImageProcessor

    from workers.models.hf import sized_processor_kwargs
    from workers.models.image_processing import keep_layout

    data = ImageFolder(DatasetSpec(kind="image", path=str(folder)))
    everything = range(len(data))
    tensors = data.load_pixels(everything)
    processors = (ViTImageProcessor(),  # bilinear, to 224 x 224: up and down
                  BitImageProcessor(size={"shortest_edge": 72},  # bicubic, then a crop
                                    crop_size={"height": 64, "width": 64}))
    for processor in processors:
        kept = keep_layout(processor)
        for kwargs in ({}, sized_processor_kwargs(processor, 40), sized_processor_kwargs(
                processor, 300)):
            expected = processor(images=data.load(everything), return_tensors="pt", **kwargs)
            got = kept(images=tensors, return_tensors="pt", **kwargs)
            assert torch.equal(got["pixel_values"], expected["pixel_values"]), (processor, kwargs)
        # a decoder's tensor is taken as it lies; anything else as the processor takes it
        assert kept.process_image(tensors[0]) is tensors[0]
        image = data.load([0])[0]
        assert torch.equal(kept.process_image(image), processor.process_image(image))
        assert kept.process_image(tensors[0].float()).is_contiguous()


def test_a_kind_the_decoders_disagree_on_goes_through_pil(folder, monkeypatch, caplog):
    real = pixels.decode_jpeg
    monkeypatch.setattr(pixels, "decode_jpeg", lambda data, mode: real(data, mode=mode) ^ 1)
    path = folder / "s420.jpg"
    with caplog.at_level(logging.WARNING, logger=pixels.__name__):
        first = rgb_pixels(path, _read_rgb)
        again = rgb_pixels(path, _read_rgb)
    expected = pil_tensor(_read_rgb(path))
    assert torch.equal(first, expected) and torch.equal(again, expected)
    assert list(pixels._AGREES.values()) == [False]
    assert len(caplog.records) == 1 and "differs from PIL's" in caplog.text


def test_a_damaged_jpeg_is_the_error_load_gives(folder):
    path = folder / "s420.jpg"
    path.write_bytes(path.read_bytes()[:400])
    data = ImageFolder(DatasetSpec(kind="image", path=str(folder)))
    index = data.ids.index("s420.jpg")
    with pytest.raises(InputError) as from_load:
        data.load([index])
    with pytest.raises(InputError) as from_pixels:
        data.load_pixels([index])
    assert str(from_pixels.value) == str(from_load.value)
    assert "s420.jpg" in str(from_pixels.value) and len(str(from_pixels.value).splitlines()) == 1

"""An HF image processor's values made for less CPU (`workers.models.image_processing`): a
decoder's pictures resized as they lie and normalised in the batch's own rows give the
processor's values bit for bit; where the processor's steps are not its backend's own (it pads,
does not normalise, has steps of its own) or the pictures' sizes differ, the caller is told to
take the processor's own route."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from sklearn.datasets import load_sample_images
from transformers import BitImageProcessor, ViTImageProcessor

from workers.inputs import pixels
from workers.inputs.base import DatasetSpec
from workers.inputs.images import ImageFolder
from workers.models.hf import sized_processor_kwargs
from workers.models.image_processing import keep_layout, layout_kept, normalized_into

PROCESSORS = {
    "vit": ViTImageProcessor(),  # bilinear to 224 x 224: up and down
    "bit": BitImageProcessor(size={"shortest_edge": 72},  # bicubic, then a crop
                             crop_size={"height": 64, "width": 64}),
    "unscaled": ViTImageProcessor(do_rescale=False, image_mean=(100.0, 110.0, 120.0),
                                  image_std=(50.0, 60.0, 70.0)),  # normalised, not rescaled
}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> ImageFolder:
    folder: Path = tmp_path_factory.mktemp("pictures")
    photos = load_sample_images().images
    for k, (width, height, subsampling) in enumerate(((201, 133, 2), (160, 97, 1),
                                                      (99, 121, 0), (75, 51, 2))):
        window = np.ascontiguousarray(photos[k % 2][3 * k:3 * k + height, 5 * k:5 * k + width])
        Image.fromarray(window).save(folder / f"p{k}.jpg", quality=90, subsampling=subsampling)
    pixels.forget_checks()
    return ImageFolder(DatasetSpec(kind="image", path=str(folder)))


@pytest.mark.parametrize("name", sorted(PROCESSORS))
def test_pictures_normalised_in_the_batchs_rows_hold_the_processors_values(data, name):
    processor = PROCESSORS[name]
    kept = keep_layout(processor)
    everything = range(len(data))
    tensors = data.load_pixels(everything)
    assert all(map(layout_kept, tensors))
    for kwargs in ({}, sized_processor_kwargs(processor, 40),
                   sized_processor_kwargs(processor, 300)):
        expected = processor(images=data.load(everything), return_tensors="pt",
                             **kwargs)["pixel_values"]  # from PIL images
        rows = torch.full(expected.shape, 7.0)
        got = normalized_into(kept, tensors, rows, **kwargs)
        assert got.data_ptr() == rows.data_ptr() and torch.equal(rows, expected), kwargs
        fresh = normalized_into(kept, tensors, None, **kwargs)
        assert fresh.is_contiguous() and torch.equal(fresh, expected), kwargs
        # rows of another shape are left alone
        other = torch.full((len(tensors) + 1, *expected.shape[1:]), 7.0)
        assert torch.equal(normalized_into(kept, tensors, other, **kwargs), expected)
        assert (other == 7.0).all()


def test_a_processor_whose_steps_are_not_its_backends_takes_its_own_route(data):
    tensors = data.load_pixels(range(len(data)))
    kept = keep_layout(ViTImageProcessor())
    assert normalized_into(kept, tensors, None, do_normalize=False) is None
    assert normalized_into(kept, tensors, None, do_pad=True,
                           pad_size={"height": 240, "width": 240}) is None
    assert normalized_into(kept, tensors, None, do_resize=False) is None  # sizes differ

    class OwnSteps(ViTImageProcessor):
        def _preprocess(self, images, **kwargs):
            return super()._preprocess(images, **kwargs)

    assert normalized_into(OwnSteps(), tensors, None) is None
    assert normalized_into(object(), tensors, None) is None


def test_a_backend_that_calls_its_last_step_otherwise_takes_its_own_route(data, monkeypatch):
    import inspect

    from workers.models import image_processing

    def declared(self, images):  # a backend whose last step takes no settings
        return images

    monkeypatch.setattr(image_processing, "_STEP", inspect.signature(declared))
    tensors = data.load_pixels(range(len(data)))
    assert normalized_into(keep_layout(ViTImageProcessor()), tensors, None) is None

"""An HF image processor's torchvision backend, run for the least CPU with its values kept:
pictures taken as a decoder lays them out (`keep_layout`), and their rescale and normalisation
done where the batch lies (`normalized_into`), not in a tensor of each picture's own that is
then copied into the batch.

Both give the processor's values bit for bit where they apply (tests/test_pixels.py), and the
extractor compares them with the processor's own route on its first picture
(`workers.models.hf.HFExtractor`).
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Sequence
from typing import Any

import torch
from transformers.image_processing_backends import TorchvisionBackend


def layout_kept(image: Any) -> bool:
    """An RGB picture `keep_layout`'s processor takes as it lies: (channel, row, column) uint8
    on the CPU."""
    return (isinstance(image, torch.Tensor) and image.dtype == torch.uint8 and image.ndim == 3
            and image.shape[0] == 3 and image.device.type == "cpu")


def keep_layout(processor: Any) -> Any:
    """A copy of a torchvision-backend image processor that takes each `layout_kept` picture
    as it lies in memory (a JPEG decoder's rows of RGB pixels: `workers.inputs.pixels`), where
    the processor copies it channel-first (all its `process_image` does with such a picture);
    its resize reads either layout and leaves its output in the input's. Other inputs go
    through the processor's own `process_image`."""
    kept = copy.copy(processor)
    own_process = kept.process_image

    def process_image(image: Any, *args: Any, **kwargs: Any) -> Any:
        if layout_kept(image) and kwargs.get("device") is None \
                and kwargs.get("input_data_format") in (None, "channels_first"):
            return image
        return own_process(image, *args, **kwargs)

    kept.process_image = process_image
    return kept


_STEP = inspect.signature(TorchvisionBackend.rescale_and_normalize)
_SETTINGS = ("do_rescale", "rescale_factor", "do_normalize", "image_mean", "image_std")
"""The backend's last step before padding, and the settings it is called with."""


class _Pads(Exception):
    """The processor pads after normalising: its values cannot be normalised afterwards."""


def normalized_into(processor: Any, images: Sequence[Any], out: torch.Tensor | None,
                    **kwargs: Any) -> torch.Tensor | None:
    """`torch.stack(processor(images=images, **kwargs)["pixel_values"])`, the same bits, in
    `out` where it is a contiguous float32 CPU tensor of that shape (else a new one): the
    processor resizes and crops each picture, which is converted to float32 as it is copied
    into its row, and its rescale and normalisation (the backend's own arithmetic: subtract
    the mean, divide by the deviation, each scaled by the rescale factor) then run on the rows
    in place. None where the processor's steps are not the backend's own, it pads or does not
    normalise, or the pictures' sizes differ: the caller takes the processor's own route."""
    if not isinstance(processor, TorchvisionBackend) \
            or type(processor)._preprocess is not TorchvisionBackend._preprocess:
        return None
    deferred, calls = copy.copy(processor), []

    def rescale_and_normalize(pictures: torch.Tensor, *args: Any, **named: Any) -> torch.Tensor:
        try:
            bound = _STEP.bind(processor, pictures, *args, **named)
        except TypeError:  # called otherwise than the backend declares: not its own steps
            calls.append(None)
            return pictures
        bound.apply_defaults()
        calls.append({name: bound.arguments.get(name) for name in _SETTINGS})
        return pictures

    def pad(*args: Any, **pad_kwargs: Any) -> Any:
        raise _Pads

    deferred.rescale_and_normalize, deferred.pad = rescale_and_normalize, pad
    try:
        pictures = deferred(images=list(images), return_tensors=None, **kwargs)["pixel_values"]
    except _Pads:
        return None
    if not calls or calls[0] is None or any(step != calls[0] for step in calls) \
            or not calls[0]["do_normalize"] or any(p.shape != pictures[0].shape for p in pictures):
        return None
    step = calls[0]
    shape = (len(pictures), *pictures[0].shape)
    if out is None or out.device.type != "cpu" or out.dtype != torch.float32 \
            or out.shape != shape or not out.is_contiguous():
        out = torch.empty(shape, dtype=torch.float32)
    for row, picture in zip(out, pictures, strict=True):
        row.copy_(picture)  # to float32 as the backend's `.to(torch.float32)` converts
    mean, std, _ = processor._fuse_mean_std_and_rescale_factor(
        do_normalize=True, image_mean=step["image_mean"], image_std=step["image_std"],
        do_rescale=step["do_rescale"], rescale_factor=step["rescale_factor"], device=out.device)
    return processor.normalize(out, mean, std, inplace=True)

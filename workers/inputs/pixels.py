"""Image files as the (channel, row, column) uint8 tensor an image processor makes of PIL's RGB
decode, without the PIL image: a JPEG goes through torchvision's decoder (libjpeg-turbo) straight
into that tensor, where the two decoders agree bit for bit. The tensor is a view of the decode's
rows of RGB pixels (row, column, channel in memory), not a channel-first copy: an image
processor resizes that layout without converting it
(`workers.models.image_processing.keep_layout`).

They agree where it is checked: per process, the first file of each JPEG kind (its components'
sampling factors, progressive or not, its Adobe colour transform) is decoded by both and
compared, and a kind that differs goes through PIL from then on (with a warning). A file that is
not a three-component JPEG PIL reads as RGB, or that torchvision's decoder refuses, goes through
PIL too, with PIL's errors (`read_pil`). torchvision 0.29 deprecates its image decoders (for
TorchCodec's): their warning is silenced here, and where they are gone every file goes
through PIL.
"""

from __future__ import annotations

import io
import logging
import threading
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from PIL import Image

warnings.filterwarnings("ignore", message="The image decoding and encoding capabilities of "
                        "TorchVision are deprecated", category=DeprecationWarning)
try:
    from torchvision.io import ImageReadMode, decode_jpeg
except ImportError:  # a torchvision without its decoders: PIL decodes everything
    decode_jpeg = None

LOG = logging.getLogger(__name__)
JpegKind = tuple[tuple[tuple[int, int], ...], bool, int | None]

_AGREES: dict[JpegKind, bool] = {}  # per kind: whether both decoders gave the same pixels
_LOCK = threading.Lock()


def pil_tensor(image: Image.Image) -> torch.Tensor:
    """An RGB PIL image as (channel, row, column) uint8, the values an image processor's
    torchvision backend makes of it: a view of its pixels' rows (`np.array`'s copy)."""
    return torch.from_numpy(np.array(image)).permute(2, 0, 1)


def rgb_pixels(path: Path, read_pil: Callable[[Path], Image.Image]) -> torch.Tensor:
    """`pil_tensor(read_pil(path))`, the same bits: from torchvision's decoder where this
    process found it agrees with PIL on the file's JPEG kind, else from `read_pil`."""
    if decode_jpeg is None:
        return pil_tensor(read_pil(path))
    data = path.read_bytes()
    kind = jpeg_kind(data)
    if kind is None or not _AGREES.get(kind, True):
        return pil_tensor(read_pil(path))
    try:
        pixels = decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8),
                             mode=ImageReadMode.RGB)
    except RuntimeError:  # refused: PIL decodes it, or says why not in its words
        return pil_tensor(read_pil(path))
    if kind not in _AGREES:
        with _LOCK:
            if kind not in _AGREES:
                _AGREES[kind] = _check(path, kind, pixels, read_pil)
        if not _AGREES[kind]:
            return pil_tensor(read_pil(path))
    return pixels


def jpeg_kind(data: bytes) -> JpegKind | None:
    """The kind of a three-component JPEG that PIL reads as RGB (from its header), else None."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.format != "JPEG" or image.mode != "RGB":
                return None
            sampling = tuple((int(h), int(v)) for _, h, v, _ in image.layer)
            return (sampling, "progressive" in image.info or "progression" in image.info,
                    image.info.get("adobe_transform"))
    except Exception:  # noqa: BLE001 - not an image PIL knows: PIL's read names the problem
        return None


def _check(path: Path, kind: JpegKind, pixels: torch.Tensor,
           read_pil: Callable[[Path], Image.Image]) -> bool:
    agrees = torch.equal(pixels, pil_tensor(read_pil(path)))
    if not agrees:
        LOG.warning("torchvision's JPEG decoder differs from PIL's on %s (kind %s): PIL decodes "
                    "every such file in this process", path, kind)
    return agrees


def forget_checks() -> None:
    """Check every kind again (tests)."""
    with _LOCK:
        _AGREES.clear()

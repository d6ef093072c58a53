"""Image datasets: a folder of image files (recursive, sorted), scikit-learn's sample photos, or
scikit-learn's 8 x 8 digits as images (what the project's digits ViT is trained and measured on)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from importlib import resources
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from storage.errors import InputError
from workers.inputs.base import Dataset, DatasetSpec, Table, TableRows

SAMPLE_SOURCE = "sklearn:sample_images"
DIGITS_SOURCE = "sklearn:digits"  # with `kind: image`: the 1,797 digits as 8 x 8 greyscale images
DIGIT_LEVELS = 16  # sklearn's digits hold pixel intensities 0..16
# Each sample photo (427 x 640) also yields a 2 x 3 grid of tiles: 14 deterministic inputs.
TILE_GRID = (2, 3)


def open_images(spec: DatasetSpec) -> Dataset:
    """An image folder or the sklearn sample photos; InputError for anything else."""
    if spec.source == DIGITS_SOURCE:
        return DigitImages.open(spec)
    if spec.source is not None:
        if spec.source != SAMPLE_SOURCE:
            raise InputError(
                f"image source {spec.source!r} is unknown: use {SAMPLE_SOURCE!r}, "
                f"{DIGITS_SOURCE!r} or a folder path"
            )
        return SampleImages(spec)
    return ImageFolder(spec)


def _read_rgb(path: Path) -> Image.Image:
    """The decoded picture in RGB: an RGB file's own decode (no copy: `convert` would copy it,
    the pixels the same), anything else converted."""
    try:
        with Image.open(path) as image:
            image.load()
            return image if image.mode == "RGB" else image.convert("RGB")
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as error:
        raise InputError(f"image {path}: cannot be read ({error}); remove or replace it") from error


def check_pixels(path: Path) -> None:
    """InputError (the message a task reading `path` gives) if the file's pixels do not decode
    (an image truncated or damaged past its header): the decode a task does, kept nowhere."""
    try:
        with Image.open(path) as image:
            image.load()
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as error:
        raise InputError(f"image {path}: cannot be read ({error}); remove or replace it") from error


def check_header(path: Path) -> None:
    """InputError (the message a task reading `path` gives) if the file is unreadable or its
    header is not an image PIL knows: one header read, no pixel decoded (a 0-byte file, a
    foreign file under an image suffix). Damage past the header is found by the task."""
    try:
        with Image.open(path):
            pass
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as error:
        raise InputError(f"image {path}: cannot be read ({error}); remove or replace it") from error


class ImageFolder(Dataset):
    """Every file with an image suffix PIL knows, under a folder, sorted by relative path."""

    kind = "image"

    def __init__(self, spec: DatasetSpec) -> None:
        root = Path(spec.path).expanduser()
        if not root.is_dir():
            raise InputError(f"image folder {spec.path!r}: not found (or not a directory)")
        suffixes = {suffix.lower() for suffix in Image.registered_extensions()}
        files = sorted(
            p for p in root.rglob("*") if p.is_file() and p.suffix.lower() in suffixes
        )
        self.root = root
        super().__init__(spec, [p.relative_to(root).as_posix() for p in files])

    def _load_one(self, index: int) -> Image.Image:
        return _read_rgb(self.root / self.ids[index])

    def load_pixels(self, indices: Iterable[int]) -> list:
        """The files at `indices` as (channel, row, column) uint8 tensors: `load`'s pixels, a
        JPEG's from torchvision's decoder where it agrees with PIL (`workers.inputs.pixels`)."""
        from workers.inputs.pixels import rgb_pixels  # torch: extraction's side only

        return [rgb_pixels(self.root / self.ids[index], _read_rgb)
                for index in self.positions(indices)]

    def check_headers(self) -> None:
        """`check_header` of every file (about 0.1 ms each), in id order."""
        for name in self.ids:
            check_header(self.root / name)

    def total_bytes(self) -> int:
        """The files' sizes added up (a stat each)."""
        return sum((self.root / name).stat().st_size for name in self.ids)

    def check_pixels(self) -> None:
        """`check_pixels` of every file (a full decode: 1 to 7 ms for 0.06 to 0.2 MB JPEGs and
        PNGs on the project's loaded 2-core machine), in id order."""
        for name in self.ids:
            check_pixels(self.root / name)


class SampleImages(Dataset):
    """scikit-learn's two bundled photos, then their tiles (row-major), offline."""

    kind = "image"

    def __init__(self, spec: DatasetSpec) -> None:
        # The files `sklearn.datasets.load_sample_images` reads, in its order, without decoding.
        folder = resources.files("sklearn.datasets.images")
        self.files = sorted(Path(str(f)) for f in folder.iterdir()
                            if f.is_file() and f.name.endswith(".jpg"))
        rows, cols = TILE_GRID
        ids = [f.name for f in self.files]
        ids += [
            f"{f.name}#tile-r{r}-c{c}"
            for f in self.files for r in range(rows) for c in range(cols)
        ]
        super().__init__(spec, ids)

    def _load_one(self, index: int) -> Image.Image:
        name, _, tile = self.ids[index].partition("#tile-")
        image = _read_rgb(next(f for f in self.files if f.name == name))
        if not tile:
            return image
        r, c = (int(part[1:]) for part in tile.split("-"))
        rows, cols = TILE_GRID
        height, width = image.height // rows, image.width // cols
        return image.crop((c * width, r * height, (c + 1) * width, (r + 1) * height))


def digit_pixels(row: np.ndarray) -> np.ndarray:
    """One digits row (64 intensities 0..16) as the (8, 8) uint8 image the project reads:
    intensity k becomes round(255 k / 16), so 0 is black and 16 white."""
    levels = np.asarray(row, dtype=np.float64).reshape(8, 8)
    return np.rint(levels * 255.0 / DIGIT_LEVELS).astype(np.uint8)


class DigitImages(TableRows):
    """scikit-learn's digits (offline), each row an 8 x 8 greyscale PIL image; `table` holds every
    row with its label (what a model trained on the digits learns from).

    Ids `digit-<row:04d>-label<k>`: the row of `load_digits()` and its label, stable across
    versions of the data. `rows` picks the rows measured (a model's held-out test rows), as
    `TabularDataset` does.
    """

    kind = "image"

    def __init__(self, spec: DatasetSpec, table: Table, rows: Sequence[int] | None = None) -> None:
        ids = [f"digit-{k:04d}-label{int(y)}" for k, y in enumerate(table.target)]
        super().__init__(spec, ids, table, rows)

    @classmethod
    def open(cls, spec: DatasetSpec) -> DigitImages:
        """Every digit, in `load_digits()` order."""
        from workers.inputs.tabular import open_tabular

        tabular = DatasetSpec(kind="tabular", source=DIGITS_SOURCE)
        return cls(spec, open_tabular(tabular).table)

    def subset(self, rows: Sequence[int]) -> DigitImages:
        """The same digits measured on `rows` only (table rows, in that order; then `limit`)."""
        return DigitImages(self.spec, self._table, rows)

    def _load_one(self, index: int) -> Image.Image:
        return Image.fromarray(digit_pixels(self._table.features[self._rows[index]]), mode="L")

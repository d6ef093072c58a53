"""Datasets: stable ids, deterministic order, `limit`, and one-line errors naming the culprit."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from PIL import Image

from storage.errors import InputError
from workers.inputs import DatasetSpec, infer_kind, open_dataset


def _png(path, color):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("L", (20, 10), color).save(path)


def test_image_folder_is_recursive_sorted_and_rgb(tmp_path):
    _png(tmp_path / "b.png", 10)
    _png(tmp_path / "a" / "z.png", 20)
    _png(tmp_path / "a" / "c.png", 30)
    (tmp_path / "notes.txt").write_text("not an image")
    dataset = open_dataset(DatasetSpec(kind="image", path=str(tmp_path)))
    assert dataset.ids == ("a/c.png", "a/z.png", "b.png")
    images = dataset.load([2, 0])
    assert [im.mode for im in images] == ["RGB", "RGB"]
    assert images[0].getpixel((0, 0)) == (10, 10, 10)
    assert images[1].getpixel((0, 0)) == (30, 30, 30)


def test_every_image_mode_reads_as_pil_converts_it_to_rgb(tmp_path):
    """An RGB file is its own decode (no copy), every other mode converted: the same pixels."""
    pixels = np.random.default_rng(0).integers(0, 256, (30, 40, 3), dtype=np.uint8)
    rgb = Image.fromarray(pixels)
    for name, image in {"a.jpg": rgb, "b.png": rgb, "c.png": rgb.convert("P"),
                        "d.png": rgb.convert("L"), "e.png": rgb.convert("RGBA"),
                        "f.jpg": rgb.convert("CMYK")}.items():
        image.save(tmp_path / name)
    dataset = open_dataset(DatasetSpec(kind="image", path=str(tmp_path)))
    for name, image in zip(dataset.ids, dataset.load(range(len(dataset))), strict=True):
        with Image.open(tmp_path / name) as original:
            expected = np.asarray(original.convert("RGB"))
        assert image.mode == "RGB" and np.array_equal(np.asarray(image), expected), name


def test_image_folder_limit_keeps_the_first(tmp_path):
    for k in range(5):
        _png(tmp_path / f"{k}.png", k)
    assert open_dataset(DatasetSpec(kind="image", path=str(tmp_path), limit=2)).ids == (
        "0.png", "1.png",
    )


def test_corrupt_image_names_the_file(tmp_path):
    _png(tmp_path / "good.png", 1)
    (tmp_path / "broken.jpg").write_bytes(b"\xff\xd8 definitely not a jpeg")
    dataset = open_dataset(DatasetSpec(kind="image", path=str(tmp_path)))
    with pytest.raises(InputError, match="broken.jpg") as error:
        dataset.load([0])
    assert "\n" not in str(error.value)


def test_sample_images_are_offline_and_deterministic():
    dataset = open_dataset(DatasetSpec(kind="image", source="sklearn:sample_images"))
    assert len(dataset) == 14
    assert dataset.ids[:3] == ("china.jpg", "flower.jpg", "china.jpg#tile-r0-c0")
    whole, tile = dataset.load([0, 2])
    assert whole.size == (640, 427) and tile.size == (213, 213)
    assert np.array_equal(np.asarray(tile), np.asarray(whole)[:213, :213])


def test_text_file_one_input_per_line(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("first line\nsecond line\n")
    dataset = open_dataset(DatasetSpec(kind="text", path=str(path)))
    assert dataset.ids == ("line-1", "line-2")
    assert dataset.load([1]) == ["second line"]


def test_blank_line_names_file_and_line(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("one\ntwo\n\nfour\n")
    with pytest.raises(InputError, match=r"in\.txt:3: blank line"):
        open_dataset(DatasetSpec(kind="text", path=str(path)))


def test_pydoc_topics_is_stable_prose():
    first = open_dataset(DatasetSpec(kind="text", source="pydoc:topics", limit=20))
    again = open_dataset(DatasetSpec(kind="text", source="pydoc:topics", limit=20))
    assert first.ids == again.ids and len(first) == 20
    texts = first.load(range(20))
    assert all(8 <= len(t.split()) <= 80 for t in texts)


@pytest.mark.skipif(importlib.util.find_spec("datasets") is not None, reason="datasets installed")
def test_hf_text_source_without_the_library_says_how_to_install():
    with pytest.raises(InputError, match="pip install datasets"):
        open_dataset(DatasetSpec(kind="text", source="hf:imdb"))


def test_csv_features_target_and_task(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("a,label,b\n1.5,yes,2\n-1,no,3e2\n0,yes,4\n")
    dataset = open_dataset(DatasetSpec(kind="tabular", path=str(path), target="label"))
    assert dataset.ids == ("row-0", "row-1", "row-2")
    np.testing.assert_array_equal(dataset.load([1])[0], [-1.0, 300.0])
    table = dataset.table
    assert table.task == "classification" and table.feature_names == ("a", "b")
    np.testing.assert_array_equal(table.target, [1, 0, 1])


def test_csv_numeric_target_with_many_values_is_regression(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("x,target\n" + "".join(f"{k},{k * 0.5}\n" for k in range(30)))
    assert open_dataset(DatasetSpec(kind="tabular", path=str(path))).table.task == "regression"


def test_csv_missing_value_names_the_line(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("a,target\n1,0\n,1\n")
    with pytest.raises(InputError, match=r"t\.csv:3: column 'a' is empty"):
        open_dataset(DatasetSpec(kind="tabular", path=str(path)))


def test_csv_text_column_is_categorical(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("a,colour,target\n1,red,0\n2,blue,1\n3,red,1\n4,7,0\n")
    table = open_dataset(DatasetSpec(kind="tabular", path=str(path))).table
    assert table.categorical == (1,) and table.cardinalities == (3,)  # sorted: 7, blue, red
    assert table.continuous == (0,)
    np.testing.assert_array_equal(table.features[:, 1], [2, 1, 2, 0])


def test_csv_without_the_target_column_lists_the_columns(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(InputError, match=r"no target column 'y'.*\['a', 'b'\]"):
        open_dataset(DatasetSpec(kind="tabular", path=str(path), target="y"))


def test_sklearn_bundled_table_keeps_every_row_for_training():
    dataset = open_dataset(DatasetSpec(kind="tabular", source="sklearn:breast_cancer", limit=3))
    assert dataset.ids == ("breast_cancer-0", "breast_cancer-1", "breast_cancer-2")
    row = dataset.load([0])[0]
    assert row.dtype == np.float64 and row.shape == (30,)
    assert dataset.table.features.shape == (569, 30) and dataset.table.task == "classification"


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        (dict(kind="image", source="sklearn:cats"), "image source 'sklearn:cats' is unknown"),
        (dict(kind="text", source="web:x"), "text source 'web:x' is unknown"),
        (dict(kind="tabular", source="sklearn:nope"), "tabular source 'sklearn:nope' is unknown"),
        (dict(kind="image", path="/no/such/dir"), "not found"),
        (dict(kind="audio", path="x"), "kind 'audio' is unknown"),
        (dict(kind="text"), "exactly one of"),
        (dict(kind="text", source="pydoc:topics", limit=0), "positive integer"),
    ],
)
def test_bad_specs_are_one_line_input_errors(spec, match):
    with pytest.raises(InputError, match=match) as error:
        open_dataset(DatasetSpec(**spec))
    assert "\n" not in str(error.value)


def test_kind_inference(tmp_path):
    assert infer_kind("sklearn:sample_images") == "image"
    assert infer_kind("sklearn:wine") == "tabular"
    assert infer_kind("pydoc:topics") == "text"
    assert infer_kind(str(tmp_path)) == "image"
    assert infer_kind("x.csv") == "tabular" and infer_kind("x.txt") == "text"
    assert infer_kind("x.bin") is None


def test_fetched_table_offline_is_a_clear_input_error(monkeypatch):
    import urllib.error

    import sklearn.datasets

    def offline(*args, **kwargs):
        raise urllib.error.URLError("network is unreachable")

    monkeypatch.setattr(sklearn.datasets, "fetch_california_housing", offline)
    with pytest.raises(InputError, match="sklearn:california_housing.*could not be") as error:
        open_dataset(DatasetSpec(kind="tabular", source="sklearn:california_housing"))
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    "spec",
    [
        DatasetSpec(kind="image", source="sklearn:sample_images", limit=2),
        DatasetSpec(kind="text", source="pydoc:topics", limit=2),
        DatasetSpec(kind="tabular", source="sklearn:iris", limit=2),
    ],
)
def test_datasets_pickle_for_workers(spec):
    import pickle

    dataset = open_dataset(spec)
    again = pickle.loads(pickle.dumps(dataset))
    assert again.ids == dataset.ids and again.kind == dataset.kind
    first, copy = dataset.load([1])[0], again.load([1])[0]
    assert np.array_equal(np.asarray(first), np.asarray(copy))

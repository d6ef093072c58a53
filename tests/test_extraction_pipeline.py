"""The extraction task's pipeline stores what the straightforward path extracts, bit for bit, on
every family, with `heads: each`, on one core or two; its errors are one line, leave no
marker and stop every thread it started."""

from __future__ import annotations

import dataclasses
import errno
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr
from PIL import Image

from storage import markers
from storage.errors import ExtractionError, InputError
from sweep.config.load import parse_config
from sweep.driver.runner import locked, materialise
from workers.models.extraction import ChunkSink, layer_map
from workers.tasks import run_task
from workers.tasks.extract import cached_extractor, fresh_digests
from workers.tasks.pipeline import run_batches
from workers.tasks.threads import worker_cores

DATASETS = {
    "photos": {"source": "sklearn:sample_images", "limit": 7},
    "topics": {"source": "pydoc:topics", "limit": 7},
    "wine": {"kind": "tabular", "source": "sklearn:wine", "limit": 7},
    "digits": {"kind": "image", "source": "sklearn:digits", "limit": 7},
}
MODELS = {  # every family; the trained ones through their random-init controls (no training)
    "vit": {"source": "tiny-vit", "dataset": "photos"},
    "deit-d": {"source": "tiny-deit-distilled", "dataset": "photos"},
    "dino-reg": {"source": "tiny-dinov2-reg", "dataset": "photos"},
    "roberta": {"source": "tiny-roberta", "dataset": "topics"},
    "distilbert": {"source": "tiny-distilbert", "dataset": "topics"},
    "ft": {"source": "ft-transformer", "dataset": "wine", "control": "random-init"},
    "digits-vit": {"source": "vit-digits", "dataset": "digits", "control": "random-init"},
    "vit-each": {"source": "tiny-vit", "dataset": "photos", "options": {"heads": "each"}},
    "roberta-each": {"source": "tiny-roberta", "dataset": "topics",
                     "options": {"heads": "each"}},
    # JPEG files: an HF image processor's pipeline reads them as tensors (`load_pixels`), the
    # straightforward path as PIL images; timm's transform reads PIL images on both
    "vit-jpegs": {"source": "tiny-vit", "dataset": "jpegs"},
    "dino-jpegs": {"source": "tiny-dinov2-reg", "dataset": "jpegs"},
}
UNTRAINED = ["vit", "deit-d", "dino-reg", "roberta", "distilbert", "ft@random-init",
             "digits-vit@random-init", "vit-each", "roberta-each", "vit-jpegs", "dino-jpegs"]


def jpeg_folder(folder: Path) -> Path:
    """Seven JPEGs of the sample photos, of three sampling kinds and odd sizes."""
    from sklearn.datasets import load_sample_images

    folder.mkdir()
    for k in range(7):
        array = load_sample_images().images[k % 2][11 * k:11 * k + 151 + 2 * k, 5 * k:5 * k + 203]
        Image.fromarray(np.ascontiguousarray(array)).save(folder / f"p{k}.jpg", quality=88,
                                                          subsampling=k % 3)
    return folder


def plan_for(folder: Path, models: dict, datasets: dict = DATASETS, **top):
    """A store in `folder` with `models`, shards of 5 inputs in batches of 2 (a short last
    batch; text rows reused by shorter inputs), and its tasks."""
    config = parse_config({"store": str(folder / "s.zarr"), "shard_size": 5, "batch_size": 2,
                           "token_sets": ["all"], "matched_nulls": None,
                           "datasets": datasets,
                           "models": models, **top})
    with locked(config):
        return config, materialise(config)


def stored(store: Path, model: str) -> dict[str, np.ndarray]:
    group = zarr.open_group(str(store), mode="r")[model]
    return {name: np.asarray(group[name][:]) for name in ("attention", "n_tokens", "token_kind")}


def straightforward(task) -> np.ndarray:
    """The shard's padded attention as `Extractor.extract` gives it, batch by batch."""
    extractor, _ = cached_extractor(task)
    dataset, _ = fresh_digests(task)
    group = zarr.open_group(str(task.store), mode="r")[task.model]
    out = np.zeros(group["attention"].shape, np.float32)[task.start:task.stop]
    for first in range(task.start, task.stop, task.batch_size):
        last = min(first + task.batch_size, task.stop)
        for offset, item in enumerate(extractor.extract(dataset.load(range(first, last)),
                                                        dataset.ids[first:last])):
            t = item.attention.shape[-1]
            out[first - task.start + offset, :, :, :t, :t] = item.by_head
    return out


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """Every model's store after its tasks ran on 1 core, then again on 2."""
    folder = tmp_path_factory.mktemp("pipeline")
    jpegs = {"kind": "image", "path": str(jpeg_folder(folder / "jpegs"))}
    config, plan = plan_for(folder, MODELS, {**DATASETS, "jpegs": jpegs})
    runs = {}
    for cores in (1, 2):
        with worker_cores(cores):
            for task in plan.tasks:
                if task.stage == "extract" and task.model in UNTRAINED:
                    run_task(task)
        runs[cores] = {name: stored(config.store, name) for name in UNTRAINED}
    return plan, runs


@pytest.mark.parametrize("model", UNTRAINED)
def test_every_family_stores_the_straightforward_extraction_bit_for_bit(swept, model):
    plan, runs = swept
    tasks = [t for t in plan.tasks if t.stage == "extract" and t.model == model]
    expected = np.concatenate([straightforward(task) for task in tasks])
    for cores, stores in runs.items():
        got = stores[model]
        assert got["attention"].tobytes() == expected.tobytes(), f"{model} on {cores} cores"
        for name in ("n_tokens", "token_kind"):
            np.testing.assert_array_equal(got[name], runs[1][model][name])


def test_text_inputs_of_different_lengths_share_rows_and_leave_zeros(swept):
    _, runs = swept
    got = runs[2]["roberta"]
    assert len(set(got["n_tokens"].tolist())) > 2  # rows reused by shorter inputs
    for attention, t in zip(got["attention"], got["n_tokens"], strict=True):
        assert not attention[..., t:, :].any() and not attention[..., :, t:].any()


def test_the_mean_written_into_the_chunk_equals_the_assembled_mean():
    gen = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(3, 5, 7, 7, generator=gen), dim=-1)  # (b, heads, q, k)
    chunk = torch.full((4, 1, 1, 9, 9), 7.0)  # a buffer holding a previous batch's values
    sink = ChunkSink("m", 1, False, chunk)
    sink.extents = [9, 9, 9, 9]
    sink.start(_batch([7, 4, 7]), ["a", "b", "c"])
    sink(probs)
    sink.finish()
    mean = layer_map(probs, False)
    assert torch.equal(chunk[0, 0, 0, :7, :7], mean[0]) and torch.equal(chunk[1, 0, 0, :4, :4],
                                                                        mean[1, :4, :4])
    assert not chunk[1, 0, 0, 4:].any() and not chunk[1, 0, 0, :, 4:].any()
    assert not chunk[0, 0, 0, 7:].any() and (chunk[3] == 7.0).all()  # row 3: not this batch's


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_one_heads_map_is_its_mean_bit_for_bit(dtype):
    gen = torch.Generator().manual_seed(1)
    probs = torch.softmax(torch.randn(3, 1, 6, 6, generator=gen) * 4, dim=-1).to(dtype)
    probs[0, 0, 0] = torch.tensor([1.0, 0, 0, 0, 0, 0])  # exact zeros and ones too
    got = layer_map(probs, False)
    assert got.dtype == torch.float32
    assert torch.equal(got, probs.mean(dim=1, dtype=torch.float32))


@pytest.mark.parametrize("name", ["tiny-dinov2-reg", "tiny-vit"])  # HF, timm
def test_parts_prepared_into_a_batchs_rows_are_joined_without_a_copy(tmp_path, name):
    from workers.inputs import DatasetSpec, open_dataset
    from workers.models.extraction import join_batches, load_extractor, row_views
    from workers.models.registry import resolve_model

    data = open_dataset(DatasetSpec(kind="image", path=str(jpeg_folder(tmp_path / "j"))))
    extractor = load_extractor(resolve_model(name), device="cpu")
    key = next(iter(extractor.prepare(extractor.read(data, [0])).inputs))
    whole = extractor.prepare(extractor.read(data, range(5)))
    reused = {key: torch.full((6, *whole.inputs[key].shape[1:]), 7.0)}  # a batch k-2's buffer
    parts = [extractor.prepare_into(extractor.read(data, rows), row_views(reused, rows))
             for rows in (range(0, 3), range(3, 5))]
    joined = join_batches(parts, out=reused)
    assert joined.inputs[key].data_ptr() == reused[key].data_ptr()  # the parts lie in it
    assert torch.equal(joined.inputs[key], whole.inputs[key])
    assert (reused[key][5] == 7.0).all()  # beyond this batch's rows: untouched
    # parts prepared elsewhere are copied into the buffer
    apart = [extractor.prepare(extractor.read(data, rows)) for rows in (range(0, 2), range(2, 5))]
    assert torch.equal(join_batches(apart, out=reused).inputs[key], whole.inputs[key])


def test_a_processor_that_resizes_a_decoders_layout_otherwise_gets_channel_first_copies(
        tmp_path, caplog):
    import logging

    from workers.inputs import DatasetSpec, open_dataset
    from workers.models import hf
    from workers.models.extraction import load_extractor
    from workers.models.image_processing import keep_layout
    from workers.models.registry import resolve_model

    data = open_dataset(DatasetSpec(kind="image", path=str(jpeg_folder(tmp_path / "j"))))
    extractor = load_extractor(resolve_model("tiny-dinov2"), device="cpu")
    expected = extractor.prepare(data.load(range(3))).inputs["pixel_values"]  # PIL images
    tensors = extractor.read(data, range(3))
    assert torch.equal(extractor.prepare(tensors).inputs["pixel_values"], expected)
    assert extractor._layout_agrees is True
    real = extractor.layout_processor
    extractor.layout_processor = keep_layout(extractor.processor)
    resize = extractor.layout_processor.resize
    extractor.layout_processor.resize = lambda image, *a, **k: resize(image, *a, **k) ^ 1
    extractor._layout_agrees = None
    with caplog.at_level(logging.WARNING, logger=hf.__name__):
        assert torch.equal(extractor.prepare(tensors).inputs["pixel_values"], expected)
        assert torch.equal(extractor.prepare(tensors).inputs["pixel_values"], expected)
    assert extractor._layout_agrees is False and len(caplog.records) == 1
    assert "copied channel-first" in caplog.text
    extractor.layout_processor = real


def test_pictures_of_different_sizes_get_the_processors_own_error(tmp_path):
    from workers.inputs import DatasetSpec, open_dataset
    from workers.models.extraction import load_extractor
    from workers.models.registry import resolve_model

    data = open_dataset(DatasetSpec(kind="image", path=str(jpeg_folder(tmp_path / "j"))))
    extractor = load_extractor(resolve_model("tiny-dinov2"), device="cpu")
    extractor.processor_kwargs = {"do_center_crop": False}  # sizes follow the pictures
    tensors = extractor.read(data, range(7))
    with pytest.raises(Exception) as own:
        extractor.processor(images=tensors, return_tensors="pt", do_center_crop=False)
    with pytest.raises(type(own.value)) as got:
        extractor.prepare(tensors)
    assert str(got.value) == str(own.value)


@pytest.mark.parametrize("source", ["tiny-roberta", "tiny-distilbert", "minilm-l6"])
def test_a_text_batchs_inputs_are_the_tokenizers_tensors_and_its_kinds_follow_the_mask(source):
    """A text batch's model inputs are the tokenizer's own torch tensors, bit for bit (what
    forward takes of them); each input's positions are its unpadded tokens, and a token's kind
    is CONTENT where the special-tokens mask is 0, else CLS for the CLS (or BOS) id, else SEP."""
    from workers.exact.token_kinds import TokenKind
    from workers.models.extraction import load_extractor
    from workers.models.registry import resolve_model

    extractor = load_extractor(resolve_model(source), device="cpu")
    texts = ["Attention rollout multiplies the layers.", "",
             "A second, much longer sentence of prose, with commas, here and there."]
    batch = extractor.prepare(texts)
    theirs = extractor.tokenizer(texts, truncation=True, max_length=extractor.max_length,
                                 padding=True, return_special_tokens_mask=True,
                                 return_tensors="pt")
    assert set(batch.inputs) == set(theirs) & set(extractor.input_names)
    for name, value in batch.inputs.items():
        assert value.dtype == theirs[name].dtype and torch.equal(value, theirs[name])
    cls = extractor.tokenizer.cls_token_id
    cls = extractor.tokenizer.bos_token_id if cls is None else cls
    for b, (positions, kinds) in enumerate(zip(batch.positions, batch.token_kinds,
                                               strict=True)):
        assert torch.equal(positions, theirs["attention_mask"][b].nonzero().flatten())
        ids = theirs["input_ids"][b, positions].tolist()
        special = theirs["special_tokens_mask"][b, positions].tolist()
        assert kinds.dtype == np.int8 and kinds.tolist() == [
            TokenKind.CONTENT if not s else TokenKind.CLS if i == cls else TokenKind.SEP
            for i, s in zip(ids, special, strict=True)]
    assert batch.token_kinds[1].tolist() == [TokenKind.CLS, TokenKind.SEP]  # the empty text


def _batch(tokens: list[int]):
    from workers.models.extraction import Batch

    return Batch({}, [torch.arange(t) for t in tokens],
                 [np.zeros(t, np.int8) for t in tokens])


def test_a_missing_layer_is_the_straightforward_paths_error():
    sink = ChunkSink("m", 2, False, torch.zeros(1, 2, 1, 3, 3))
    sink.start(_batch([3]), ["x"])
    sink(torch.full((1, 1, 3, 3), 1 / 3))
    with pytest.raises(ExtractionError, match="returned 1 attention layers for its 2 layers"):
        sink.finish()


def test_a_corrupt_image_is_one_line_naming_it_and_leaves_no_marker(tmp_path):
    folder = tmp_path / "images"
    folder.mkdir()
    for k in range(5):
        Image.new("RGB", (40, 30), (40 * k, 10, 10)).save(folder / f"{k}.png")
    config, plan = plan_for(tmp_path, {"vit": {"source": "tiny-vit", "dataset": "imgs"}},
                            {"imgs": {"kind": "image", "path": str(folder)}})
    (folder / "3.png").write_bytes((folder / "3.png").read_bytes()[:60])  # damaged since
    task = next(t for t in plan.tasks if t.stage == "extract")
    task = dataclasses.replace(task, digests=())  # no digest to notice the edit first
    for cores in (1, 2):
        with worker_cores(cores), pytest.raises(InputError, match=r"image .*3\.png: cannot be") \
                as caught:
            run_task(task)
        assert "\n" not in str(caught.value)
        assert not markers.MarkerIndex(config.store_ref).done(task.scope, task.marker)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_attention_names_input_layer_and_row(tmp_path, monkeypatch, value):
    config, plan = plan_for(tmp_path, {"vit": {"source": "tiny-vit", "dataset": "photos"}})
    task = next(t for t in plan.tasks if t.stage == "extract")
    extractor, _ = cached_extractor(task)
    real = extractor.install_hooks

    def poisoned(sink):
        def layer_two_row_one(probs):
            if getattr(sink, "layer", None) == 1:
                probs = probs.clone()
                probs[1, 0, 1, 2] = value  # the batch's second input
            sink(probs)

        return real(layer_two_row_one)

    monkeypatch.setattr(extractor, "install_hooks", poisoned)
    for cores in (1, 2):
        with worker_cores(cores), pytest.raises(
                ExtractionError, match=r"input 'flower\.jpg': non-finite attention at layer 1, "
                                       r"row 1"):
            run_task(task)
        assert not markers.MarkerIndex(config.store_ref).done(task.scope, task.marker)


def _threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name.startswith("extract-")}


def test_a_failing_stage_reaches_the_caller_first_in_batch_order_and_stops_every_thread():
    order = []

    def load(k, parts):
        if k == 3:
            raise ValueError("load 3")
        return parts(lambda x: x, [k])[0]

    def write(k, result, parts):
        time.sleep(0.05)
        order.append(k)
        if k == 2:
            raise OSError("write 2")

    with pytest.raises(OSError, match="write 2"):  # batch 2's write, before batch 3's load
        run_batches(6, load, lambda k, item: item, write, cores=2)
    assert order == [0, 1, 2] and not _threads()
    with pytest.raises(ValueError, match="load 3"):
        run_batches(6, load, lambda k, item: item, lambda k, r, parts: None, cores=2)
    assert not _threads()


def test_ctrl_c_in_the_forward_pass_stops_the_writer_between_chunks():
    stop = threading.Event()
    written = []

    def run(k, item):
        if k == 2:
            raise KeyboardInterrupt
        return item

    def write(k, result, parts):
        for chunk in range(50):
            if stop.is_set():
                return
            written.append((k, chunk))
            time.sleep(0.01)

    with pytest.raises(KeyboardInterrupt):
        run_batches(5, lambda k, parts: k, run, write, cores=2, stop=stop)
    assert stop.is_set() and not _threads()
    assert len([w for w in written if w[0] == 1]) < 50  # batch 1's write cut short


def test_the_last_write_has_the_pool_and_every_other_write_its_own_thread():
    """Batch k's write maps over its parts on the writer's thread while later batches load and
    run; the last batch's write, with nothing left to load, on the pool of the task's cores."""
    seen: dict[int, set[str]] = {}
    together = threading.Barrier(2, timeout=60)  # the last write's first two parts, at once

    def write(k, result, parts):
        def note(part):
            seen.setdefault(k, set()).add(threading.current_thread().name)
            if k == 2 and part < 2:
                together.wait()

        parts(note, range(8))

    run_batches(3, lambda k, parts: k, lambda k, item: item, write, cores=2)
    assert all(len(seen[k]) == 1 and next(iter(seen[k])).startswith("extract-write")
               for k in (0, 1))
    assert len(seen[2]) == 2 and all(name.startswith("extract-part") for name in seen[2])
    assert not together.broken
    assert not _threads()


def test_ahead_readies_each_write_on_the_loaders_thread_beside_the_forward_passes():
    """`ahead(k)` (an extraction makes batch k's chunk folders there) runs on the loader's
    thread after `load(k)` and before `write(k)`; batches 0 and 1 are readied while batch 0
    runs, so batch 0's write finds its folders made and batch 1's is not delayed by it."""
    events: list[tuple[str, int, str]] = []
    readied_one = threading.Event()

    def note(stage, k):
        events.append((stage, k, threading.current_thread().name))

    def load(k, parts):
        note("load", k)
        return k

    def ahead(k):
        note("ahead", k)
        if k == 1:
            readied_one.set()

    def run(k, item):
        if k == 0:
            assert readied_one.wait(timeout=60)  # batch 1 readied while batch 0 runs
        note("run", k)
        return item

    run_batches(4, load, run, lambda k, r, parts: note("write", k), cores=2, ahead=ahead)
    order = [(stage, k) for stage, k, _ in events]
    for k in range(4):
        assert order.index(("load", k)) < order.index(("ahead", k)) < order.index(("write", k))
    assert order.index(("ahead", 1)) < order.index(("run", 0))
    assert {name for stage, _, name in events if stage == "ahead"} == {
        name for stage, _, name in events if stage == "load"} and \
        all(name.startswith("extract-load") for stage, _, name in events if stage == "ahead")
    assert not _threads()


def test_a_failing_ahead_stops_the_batches_in_order():
    written = []

    def ahead(k):
        if k == 2:
            raise OSError(errno.EACCES, "Permission denied: batch 2's folders")

    for cores in (1, 2):
        written.clear()
        with pytest.raises(OSError, match="batch 2's folders"):
            run_batches(5, lambda k, parts: k, lambda k, item: item,
                        lambda k, r, parts: written.append(k), cores=cores, ahead=ahead)
        assert written == [0, 1] and not _threads()


def test_one_core_readies_each_write_on_the_callers_thread_after_its_forward_pass():
    order = []
    run_batches(2, lambda k, parts: order.append(("load", k)),
                lambda k, item: order.append(("run", k)),
                lambda k, r, parts: order.append(("write", k)), cores=1,
                ahead=lambda k: order.append(("ahead", k)))
    assert order == [(stage, k) for k in range(2) for stage in ("load", "run", "ahead", "write")]


def test_one_core_runs_every_stage_on_the_callers_thread():
    seen = set()

    def note(*args):
        seen.add(threading.current_thread().name)
        return args[-1]

    run_batches(3, lambda k, parts: parts(note, [k])[0], note, note, cores=1)
    assert seen == {threading.current_thread().name}


def test_a_load_beside_a_forward_pass_leaves_the_forward_pass_a_core():
    """The first load, with nothing else running, has every core; each later load runs while a
    forward pass does, on one core fewer: with two, its parts one after another on the loader's
    thread; with three, at most two at once."""
    for cores in (2, 3):
        seen: dict[int, set[str]] = {}
        at_once = {"now": 0, "most": {}}
        lock = threading.Lock()

        def load(k, parts, seen=seen, at_once=at_once, lock=lock):
            def part(i):
                with lock:
                    at_once["now"] += 1
                    at_once["most"][k] = max(at_once["most"].get(k, 0), at_once["now"])
                seen.setdefault(k, set()).add(threading.current_thread().name)
                time.sleep(0.02)
                with lock:
                    at_once["now"] -= 1

            parts(part, range(6))
            return k

        run_batches(4, load, lambda k, item: item, lambda k, r, parts: None, cores=cores)
        assert at_once["most"][0] == cores and all(name.startswith("extract-part")
                                                   for name in seen[0])
        for k in (1, 2, 3):
            assert at_once["most"][k] == cores - 1
            if cores == 2:
                assert len(seen[k]) == 1 and next(iter(seen[k])).startswith("extract-load")
        assert not _threads()


def test_the_tail_runs_on_the_callers_thread_while_the_last_batch_is_written():
    caller = threading.current_thread().name
    tail_ran = threading.Event()
    order = []

    def write(k, result, parts):
        if k == 2:  # the last write finishes only once the tail has run beside it
            assert tail_ran.wait(timeout=60)
        order.append(("write", k))

    def tail():
        assert threading.current_thread().name == caller
        order.append(("tail", None))
        tail_ran.set()

    run_batches(3, lambda k, parts: k, lambda k, item: order.append(("run", k)), write,
                cores=2, tail=tail)
    assert order.index(("run", 2)) < order.index(("tail", None)) < order.index(("write", 2))
    assert order.index(("write", 1)) < order.index(("tail", None))
    assert not _threads()
    order.clear()
    run_batches(2, lambda k, parts: k, lambda k, item: order.append(("run", k)),
                lambda k, r, parts: order.append(("write", k)), cores=1,
                tail=lambda: order.append(("tail", None)))
    assert order == [("run", 0), ("write", 0), ("run", 1), ("write", 1), ("tail", None)]


def test_the_last_writes_error_reaches_the_caller_before_the_tails():
    def write(k, result, parts):
        if k == 1:
            time.sleep(0.05)  # still writing when the tail fails
            raise OSError("write 1")

    def tail():
        raise ValueError("tail")

    with pytest.raises(OSError, match="write 1"):
        run_batches(2, lambda k, parts: k, lambda k, item: item, write, cores=2, tail=tail)
    with pytest.raises(ValueError, match="tail"):
        run_batches(2, lambda k, parts: k, lambda k, item: item, lambda k, r, parts: None,
                    cores=2, tail=tail)
    assert not _threads()

"""Issue 34, items 4-11, through the real CLI (`sweep.cli.entry.main` in process, or
`python -m sweep`): metadata damage, an `hf:` text folder without its vocabulary, Ctrl-C while
a store is created, a symlink inside a store, YAML values no config takes, `$` in names,
terminal escapes in a foreign store, a dataset path recorded in a foreign store. Each is one
stderr line and the exit code of its cause, with nothing written outside what the case repairs.
The object-store variants run against the real SeaweedFS (marked `s3`). Item 13 is
tests/test_presets_reproducible.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from sweep.cli.entry import main
from tests.fault_helpers import LINES, one_stderr_line, tree_digest, write_text_sweep
from tests.store_fixtures import stored_arrays
from tests.test_faults_issue28 import saved_model


def refused(capsys, argv: list[str], code: int, *words: str) -> str:
    """`sweep ARGV` in this process: exit `code` and one stderr line holding every word."""
    capsys.readouterr()
    assert main(argv) == code
    line = one_stderr_line(capsys.readouterr().err)
    for word in words:
        assert word in line, line
    return line


# --- 5. an hf: text folder with tokenizer_config.json but no vocabulary ------------------------

def tokenizer_without_vocabulary(folder: Path, model_type: str) -> Path:
    """`folder`: a tiny BERT saved as safetensors and the tokenizer_config.json of a tiny
    `model_type` tokenizer, its vocabulary files (tokenizer.json included) deleted."""
    from workers.models.tiny_text import tiny_tokenizer

    saved_model(folder, "text")
    tiny_tokenizer(model_type, 128).save_pretrained(folder)
    for name in ("tokenizer.json", "vocab.txt", "vocab.json", "merges.txt",
                 "special_tokens_map.json"):
        (folder / name).unlink(missing_ok=True)
    assert (folder / "tokenizer_config.json").is_file()
    return folder


@pytest.mark.parametrize("model_type, missing", [("distilbert", "vocab.txt"),
                                                 ("roberta", "vocab.json, merges.txt")])
def test_an_hf_text_folder_without_its_vocabulary_is_refused_naming_it(
        tmp_path, capsys, model_type, missing):
    model = tokenizer_without_vocabulary(tmp_path / "model", model_type)
    path = write_text_sweep(tmp_path)
    path.write_text(path.read_text().replace("tiny-roberta", f"'hf:{model}'"))
    before = tree_digest(tmp_path)
    refused(capsys, ["run", str(path), "--in-process", "--no-progress"], 2,
            f"{model} holds no {missing}", "vocabulary")
    assert tree_digest(tmp_path) == before
    refused(capsys, ["extract", f"hf:{model}", str(tmp_path / "lines.txt"), "--out",
                     str(tmp_path / "x.npz")], 2, "has no vocabulary", "all special tokens")
    assert tree_digest(tmp_path) == before


# --- 4. metadata damage ----------------------------------------------------------------------

def _dtype(meta: dict) -> None:
    meta["data_type"] = "float64"


def _chunks(meta: dict) -> None:
    meta["chunk_grid"]["configuration"]["chunk_shape"][0] = 3


METADATA_CASES = {  # case -> (the document, the edit: None empties it, the words of the line)
    "dtype": ("rob/attention/zarr.json", _dtype, 'data_type "float64", the layout\'s "float32"'),
    "chunk_shape": ("rob/results/kappa/zarr.json", _chunks,
                    "chunk_shape [3, 2, 1, 2], the compacted layout's [5, 2, 1, 2]"),
    "group": ("rob/zarr.json", None, "empty"),
}


def damaged_metadata(text: bytes | None, edit) -> bytes:
    if edit is None:
        return b""
    meta = json.loads(text)
    edit(meta)
    return json.dumps(meta).encode()


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The folder of a finished run of the tiny text sweep (store sweep.zarr)."""
    folder = tmp_path_factory.mktemp("reference")
    assert main(["run", str(write_text_sweep(folder)), "--in-process", "--no-progress"]) == 0
    return folder


def copy_of(reference: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "copy"
    shutil.copytree(reference, folder)
    path = folder / "sweep.yaml"
    path.write_text(path.read_text().replace("path: lines.txt", f"path: {reference}/lines.txt"))
    return folder


def finds_and_repairs(capsys, store: str, config: Path, options: list[str], key: str, words: str,
                      reference: dict, arrays) -> None:
    """status, status --verify: exit 4, the line naming `key`; report, show: exit 4 and one
    line; run: one line naming it, exit 0, and a store equal to `reference`; status: 0."""
    for verify in ([], ["--verify"]):
        capsys.readouterr()
        assert main(["status", store, *options, *verify]) == 4
        captured = capsys.readouterr()
        assert f"damaged rob metadata {key}: {words}; rerun `sweep run`" in captured.out
        assert captured.err == ""
    for argv in (["report", store, *options], ["show", store, "rob", "line-1", *options]):
        refused(capsys, argv, 4, f"damaged metadata (1 document(s)): {key}: {words}")
    capsys.readouterr()
    assert main(["run", str(config), "--in-process", "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert f"sweep: {key}: {words}; " in err and "Traceback" not in err, err
    assert main(["status", store, *options]) == 0
    after = arrays()
    assert sorted(after) == sorted(reference)
    for name in reference:
        np.testing.assert_array_equal(after[name], reference[name], err_msg=name, strict=True)


@pytest.mark.parametrize("case", sorted(METADATA_CASES))
def test_damaged_metadata_is_found_by_status_and_readers_and_repaired_by_run(
        tmp_path, reference, capsys, case):
    key, edit, words = METADATA_CASES[case]
    folder = copy_of(reference, tmp_path)
    document = folder / "sweep.zarr" / key
    document.write_bytes(damaged_metadata(document.read_bytes(), edit))
    finds_and_repairs(capsys, str(folder / "sweep.zarr"), folder / "sweep.yaml", [], key, words,
                      stored_arrays(reference / "sweep.zarr"),
                      lambda: stored_arrays(folder / "sweep.zarr"))


@pytest.mark.s3
@pytest.mark.parametrize("case", ["dtype", "group"])
def test_damaged_metadata_on_s3_is_found_and_repaired(s3_bucket, tmp_path, reference, capsys,
                                                      case):
    from storage.location import StoreRef
    from tests.s3_fixtures import ENDPOINT, filesystem

    key, edit, words = METADATA_CASES[case]
    store = f"s3://{s3_bucket}/meta.zarr"
    config = write_text_sweep(tmp_path)
    config.write_text(config.read_text().replace(
        "store: sweep.zarr", f"store: {store}\nstorage_options: {{endpoint_url: '{ENDPOINT}'}}"))
    assert main(["run", str(config), "--in-process", "--no-progress"]) == 0
    fs = filesystem()
    fs.pipe(f"{s3_bucket}/meta.zarr/{key}",
            damaged_metadata(fs.cat(f"{s3_bucket}/meta.zarr/{key}"), edit))
    ref = StoreRef.of(store, {"endpoint_url": ENDPOINT})
    finds_and_repairs(capsys, store, config, ["--storage-option", f"endpoint_url={ENDPOINT}"],
                      key, words, stored_arrays(reference / "sweep.zarr"),
                      lambda: stored_arrays(ref))


# --- 6. Ctrl-C while a store is created --------------------------------------------------------

def leftover(reference: Path, folder: Path, state: str) -> Path:
    """A store folder as an interrupted creation leaves it (the config's store, sweep.zarr):
    `group-metadata`: only the model group's zarr.json (what the audit found after a Ctrl-C
    while planning: the cleanup had deleted the rest); `creation-marker`: the creation marker
    and the metadata documents of the model group, no root."""
    store = folder / "sweep.zarr"
    documents = ["rob/zarr.json"] if state == "group-metadata" else \
        [str(p.relative_to(reference / "sweep.zarr"))
         for p in (reference / "sweep.zarr" / "rob").rglob("zarr.json")]
    for name in documents:
        (store / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(reference / "sweep.zarr" / name, store / name)
    if state == "creation-marker":
        (store / ".sweep").mkdir()
        (store / ".sweep" / "creating").write_bytes(b"")
    return store


@pytest.mark.parametrize("state", ["group-metadata", "creation-marker"])
def test_what_an_interrupted_creation_leaves_is_created_again_by_the_rerun(
        tmp_path, reference, capsys, state):
    folder = copy_of(reference, tmp_path)
    shutil.rmtree(folder / "sweep.zarr")
    store = leftover(reference, folder, state)
    assert main(["run", str(folder / "sweep.yaml"), "--in-process", "--no-progress"]) == 0
    assert not (store / ".sweep" / "creating").exists()
    expected, after = stored_arrays(reference / "sweep.zarr"), stored_arrays(store)
    assert sorted(after) == sorted(expected)
    for name in expected:
        np.testing.assert_array_equal(after[name], expected[name], err_msg=name, strict=True)


def test_a_folder_holding_more_than_an_interrupted_creation_is_still_refused(
        tmp_path, reference, capsys):
    folder = copy_of(reference, tmp_path)
    shutil.rmtree(folder / "sweep.zarr")
    store = leftover(reference, folder, "group-metadata")
    (store / "rob" / "notes.txt").write_text("mine")
    before = tree_digest(store)
    refused(capsys, ["run", str(folder / "sweep.yaml"), "--in-process", "--no-progress"], 2,
            "a folder that is not a sweep store")
    assert tree_digest(store) == before


def test_ctrl_c_while_planning_and_again_in_the_cleanup_leaves_a_store_the_rerun_creates(
        tmp_path, reference, capsys, monkeypatch):
    """A Ctrl-C once the first model group exists, and a second one while the lock deletes the
    unfinished store (after its first deletion): exit 130, and the rerun completes."""
    from storage.location import LocalLocation
    from sweep.driver import runner

    folder = copy_of(reference, tmp_path)
    shutil.rmtree(folder / "sweep.zarr")
    real_ensure, real_delete = runner.ensure_model, LocalLocation.delete_prefix

    def ensure_then_ctrl_c(*args, **kwargs):
        real_ensure(*args, **kwargs)
        raise KeyboardInterrupt

    def delete_once_then_ctrl_c(self, prefix):
        real_delete(self, prefix)
        monkeypatch.setattr(LocalLocation, "delete_prefix", real_delete)
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "ensure_model", ensure_then_ctrl_c)
    monkeypatch.setattr(LocalLocation, "delete_prefix", delete_once_then_ctrl_c)
    argv = ["run", str(folder / "sweep.yaml"), "--in-process", "--no-progress"]
    assert main(argv) == 130
    monkeypatch.setattr(runner, "ensure_model", real_ensure)
    monkeypatch.setattr(LocalLocation, "delete_prefix", real_delete)
    assert (folder / "sweep.zarr").exists()  # the cleanup was cut short
    capsys.readouterr()
    assert main(argv) == 0, capsys.readouterr().err
    assert main(["status", str(folder / "sweep.zarr")]) == 0


@pytest.mark.s3
def test_what_an_interrupted_creation_leaves_on_s3_is_created_again(s3_bucket, tmp_path,
                                                                     reference):
    from storage.location import StoreRef
    from tests.s3_fixtures import ENDPOINT, filesystem

    store = f"s3://{s3_bucket}/left.zarr"
    config = write_text_sweep(tmp_path)
    config.write_text(config.read_text().replace(
        "store: sweep.zarr", f"store: {store}\nstorage_options: {{endpoint_url: '{ENDPOINT}'}}"))
    filesystem().pipe(f"{s3_bucket}/left.zarr/rob/zarr.json",
                      (reference / "sweep.zarr" / "rob" / "zarr.json").read_bytes())
    assert main(["run", str(config), "--in-process", "--no-progress"]) == 0
    expected = stored_arrays(reference / "sweep.zarr")
    after = stored_arrays(StoreRef.of(store, {"endpoint_url": ENDPOINT}))
    assert sorted(after) == sorted(expected)
    for name in expected:
        np.testing.assert_array_equal(after[name], expected[name], err_msg=name, strict=True)


# --- 7. a symlink inside a store -------------------------------------------------------------

@pytest.mark.parametrize("linked", ["rob/attention", "rob/results/kappa/c.0.0.0.0"])
def test_a_symlink_inside_a_store_is_refused_and_nothing_is_written_through_it(
        tmp_path, reference, capsys, linked):
    """A folder of the store replaced by a link to an empty folder outside (its chunks look
    deleted, so a run would recompute them into the outside folder), or a chunk replaced by a
    link to a file outside: run and status refuse in one line, exit 4, nothing written."""
    folder = copy_of(reference, tmp_path)
    store = folder / "sweep.zarr"
    outside = tmp_path / "outside"
    outside.mkdir()
    target = store / linked
    if target.is_dir():
        shutil.rmtree(target)
        target.symlink_to(outside, target_is_directory=True)
    else:
        (outside / "chunk").write_bytes(target.read_bytes())
        target.unlink()
        target.symlink_to(outside / "chunk")
    before, outside_before = tree_digest(store), tree_digest(outside)
    for argv in (["run", str(folder / "sweep.yaml"), "--in-process", "--no-progress"],
                 ["status", str(store)]):
        refused(capsys, argv, 4, f"{linked} is a symbolic link (to {outside}",
                "a store holds no links")
        assert tree_digest(store) == before and tree_digest(outside) == outside_before


# --- 8. YAML values no config takes ------------------------------------------------------------

BIG = "9" * 5000


@pytest.mark.parametrize("line, words", [
    ("shard_size: 2001-13-45", "line 2: '2001-13-45' reads as a date in YAML"),
    ("retries: 2001-12-25", "line 3: '2001-12-25' reads as a date in YAML"),
    (f"shard_size: {BIG}", "line 2: an integer of 5,000 digits, more than any setting takes"),
    (f"tol: -{BIG}", "line 4: an integer of 5,000 digits"),
    (f"shard_size: 0x{'f' * 5000}", "line 2: an integer of 5,000 digits"),
    (f"shard_size: '{BIG}'", "shard_size: Unable to parse input string as an integer"),
])
def test_yaml_values_no_setting_takes_are_one_line_exit_2(tmp_path, capsys, line, words):
    config = write_text_sweep(tmp_path)
    key = line.split(":")[0]
    text = config.read_text()
    old = next((held for held in text.splitlines() if held.startswith(f"{key}:")), None)
    config.write_text(text.replace(old, line) if old else text.replace(
        "matched_nulls", f"{line}\nmatched_nulls"))
    before = tree_digest(tmp_path)
    for command in (["run", str(config), "--in-process", "--no-progress"], ["plan", str(config)]):
        refused(capsys, command, 2, f"sweep.yaml: {words}")
        assert tree_digest(tmp_path) == before


@pytest.mark.parametrize("store", ["2001-13-45", "2001-12-25"])
def test_a_date_as_the_store_is_one_line_exit_2(tmp_path, capsys, store):
    config = write_text_sweep(tmp_path)
    config.write_text(config.read_text().replace("store: sweep.zarr", f"store: {store}"))
    before = tree_digest(tmp_path)
    refused(capsys, ["run", str(config), "--in-process", "--no-progress"], 2,
            f"sweep.yaml: line 1: '{store}' reads as a date in YAML", f"quote it ('{store}')")
    assert tree_digest(tmp_path) == before


def test_a_date_in_a_cluster_file_is_one_line_exit_2(tmp_path, capsys):
    config = write_text_sweep(tmp_path)
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("kind: local\nlocal:\n  n_workers: 2001-13-45\n")
    refused(capsys, ["plan", str(config), "--cluster", str(cluster)], 2,
            "cluster.yaml", "line 3", "'2001-13-45' reads as a date in YAML")


# --- 9. `$` in names ---------------------------------------------------------------------------

DOLLARS = "a$^$b"  # invalid mathtext: matplotlib raised ParseSyntaxException drawing it


def test_a_dollar_in_an_image_name_is_drawn_as_text_by_show(tmp_path, capsys):
    from tests.test_faults_tasks import image_sweep

    config = image_sweep(tmp_path, n_images=2)
    (tmp_path / "imgs" / "im0.png").rename(tmp_path / "imgs" / f"{DOLLARS}.png")
    assert main(["run", str(config), "--in-process", "--no-progress"]) == 0
    capsys.readouterr()
    png = tmp_path / "pair.png"
    assert main(["show", str(tmp_path / "s.zarr"), "d", f"{DOLLARS}.png", "--png", str(png)]) == 0
    assert png.stat().st_size > 0 and "Traceback" not in capsys.readouterr().err


def test_a_dollar_in_a_stored_model_name_is_drawn_as_text_by_report(tmp_path, capsys):
    """Someone else's store whose model is named with `$` (a name `sweep run` would refuse):
    --plots and --html draw it."""
    import zarr

    from tests.store_fixtures import hand_store

    store = hand_store(tmp_path / "s.zarr")
    (store / "alpha").rename(store / DOLLARS)
    root = zarr.open_group(str(store), mode="r+", use_consolidated=False)
    root.attrs["models"] = [DOLLARS, "beta"]
    capsys.readouterr()
    assert main(["report", str(store), "--plots", str(tmp_path / "plots"),
                 "--html", str(tmp_path / "r.html")]) == 0
    assert "Traceback" not in capsys.readouterr().err
    assert (tmp_path / "plots" / "depth.png").stat().st_size > 0
    assert DOLLARS in (tmp_path / "r.html").read_text()


# --- 10. terminal escapes in a foreign store -------------------------------------------------

ESC_NAME = "rob\x1b]0;owned\x07\x1b[2J"  # retitles the window, clears the screen
ESC_ID = "line-1\x1b[31m\u202e"  # turns the text red, reverses what follows


def test_control_characters_of_a_foreign_store_are_printed_escaped(tmp_path, reference, capsys):
    import zarr

    folder = copy_of(reference, tmp_path)
    store = folder / "sweep.zarr"
    (store / "rob").rename(store / ESC_NAME)
    marks = store / ".sweep" / "markers"
    (marks / "rob").rename(marks / ESC_NAME)  # its compaction marker says where its results are
    for marker in (marks / ESC_NAME).iterdir():
        marker.write_text(marker.read_text().replace('"rob/', json.dumps(ESC_NAME)[:-1] + "/"))
    root = zarr.open_group(str(store), mode="r+", use_consolidated=False)
    root.attrs["models"] = [ESC_NAME]
    ids = root[ESC_NAME]["input_id"]
    ids[0] = ESC_ID
    failed = store / ".sweep" / "markers" / ESC_NAME / "extract-00001.failed"
    failed.parent.mkdir(parents=True, exist_ok=True)
    failed.write_text("ValueError: \x1b[2Jgone\n")
    runs = [(["status", str(store)], None), (["show", str(store), ESC_NAME, ESC_ID], 0),
            (["show", str(store), ESC_NAME, "nope"], 2)]
    for argv, code in runs:
        capsys.readouterr()
        returned = main(argv)
        assert code is None or returned == code
        captured = capsys.readouterr()
        for text in (captured.out, captured.err):
            assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text, text
        assert "\\x1b" in captured.out + captured.err


# --- 11. a dataset path recorded in a foreign store --------------------------------------------

def test_show_never_opens_a_dataset_path_that_a_store_records(tmp_path, reference, capsys):
    """A store whose model group names a file outside it (a secret) as its text dataset: show
    prints no line of it, and says how to point it at the inputs; --inputs reads the user's."""
    import zarr

    folder = copy_of(reference, tmp_path)
    store = folder / "sweep.zarr"
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET-LINE-ONE\nTOP-SECRET-LINE-TWO\n")
    group = zarr.open_group(str(store / "rob"), mode="r+")
    group.attrs["dataset_spec"] = {**group.attrs["dataset_spec"], "path": str(secret)}
    capsys.readouterr()
    assert main(["show", str(store), "rob", "line-1"]) == 0
    out = capsys.readouterr().out
    assert "TOP-SECRET" not in out
    assert f"input: (dataset {secret} not opened: a store may name any file; pass --inputs" in out
    assert main(["show", str(store), "rob", "line-1", "--inputs",
                 str(reference / "lines.txt")]) == 0
    assert f"input: text {LINES[0]!r}" in capsys.readouterr().out

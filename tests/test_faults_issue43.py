"""Issue 43's audit, replayed: each case is one line with the right exit code, or the right
result, and nothing runs code from a store, a cache or a model folder. Every test drives the
real CLI (`sweep.cli.entry.main` in process) or the function the case names; those marked s3 run
against the SeaweedFS of `.ci/s3-up.sh`."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import zarr

import sweep.driver.compaction
import sweep.report.tables
from storage.compaction.results import (
    compact_model,
    is_compacted,
    per_shard_document,
    result_documents,
)
from storage.errors import InputError
from storage.location import StoreRef, locate
from storage.markers import marker_name
from sweep.cli.entry import main
from sweep.cli.report_cache import MAX_ENTRIES, cache_root, entry_key
from tests.fault_helpers import write_text_sweep
from tests.store_fixtures import OK, FixtureModel, hand_store, stored_arrays, write_store
from tests.test_compaction import RESULTS, assert_same_store, copy_of, files, sweep_into
from workers.models.extraction import load_extractor
from workers.models.hf import checkout, model_folder
from workers.models.registry import resolve_model

HOLDS = f"{RESULTS}/holds"


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """P: a finished store of the tiny text sweep (its results compacted)."""
    return sweep_into(tmp_path_factory.mktemp("finished"))


@pytest.fixture(scope="module")
def before_compaction(tmp_path_factory) -> Path:
    """PRE: the same sweep, stopped before its results were compacted (per shard)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sweep.driver.compaction, "compact", lambda plan: [])
        return sweep_into(tmp_path_factory.mktemp("pre"))


def holds_of(store: Path) -> np.ndarray:
    return zarr.open_array(str(store / HOLDS), mode="r")[...]


# --- 1. a result array's metadata put back in its per-shard form ------------------------------

def test_a_per_shard_document_in_a_compacted_model_is_damage_and_the_run_keeps_the_values(
        tmp_path, finished, before_compaction, capsys):
    store = copy_of(finished, tmp_path)
    expected = holds_of(finished)
    assert expected.sum() > 0
    shutil.copy(before_compaction / HOLDS / "zarr.json", store / HOLDS / "zarr.json")
    for argv in (["status", str(store)], ["status", str(store), "--verify"]):
        assert main(argv) == 4
        out = capsys.readouterr().out
        assert f"damaged rob metadata {HOLDS}/zarr.json: the per-shard layout, but the " \
               "model's compaction marker vouches for compacted objects" in out
    assert main(["report", str(store), "--no-cache"]) == 4
    err = capsys.readouterr().err.strip()
    assert err.startswith("sweep report: damaged store:") and "\n" not in err
    argv = ["run", str(store.parent / "sweep.yaml"), "--in-process", "--no-progress"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert f"{HOLDS}/zarr.json: the per-shard layout, but the model's compaction marker " \
           "vouches for compacted objects; its compacted metadata put back" in captured.err
    assert "0 tasks completed" in captured.out
    np.testing.assert_array_equal(holds_of(store), expected, strict=True)
    assert_same_store(store, finished)
    assert main(["status", str(store), "--verify"]) == 0


def test_a_compacted_document_without_its_marker_is_damage(tmp_path, finished, capsys):
    store = copy_of(finished, tmp_path)
    (store / ".sweep" / "markers" / "rob" / "compact.done").unlink()
    assert main(["status", str(store)]) == 4
    assert f"damaged rob metadata {HOLDS}/zarr.json: the compacted layout, but no compaction " \
           "marker vouches for it" in capsys.readouterr().out


def test_a_model_whose_per_shard_results_are_gone_is_never_compacted_from_fill_values(
        tmp_path, before_compaction):
    store = copy_of(before_compaction, tmp_path)
    chunk = next(p for p in sorted((store / HOLDS / "c").rglob("*")) if p.is_file())
    chunk.unlink()
    before = files(store, RESULTS)
    tests = [marker_name("test", shard) for shard in range(3)]
    assert compact_model(str(store), "rob", 2, tests) is False
    assert files(store, RESULTS) == before  # nothing written, nothing deleted
    assert not any(is_compacted(d) for d in result_documents(str(store), "rob").values())


def test_compacted_objects_no_marker_vouches_for_stay_while_their_shards_are_retested(
        tmp_path, finished, capsys):
    """The compaction marker lost after the per-shard chunks were deleted: the compacted
    objects may be the only copy, so the run leaves them until its tests have run again."""
    store = copy_of(finished, tmp_path)
    (store / ".sweep" / "markers" / "rob" / "compact.done").unlink()
    deleted = []
    original = sweep.driver.compaction.revert_unmarked

    def watched(location, model, shard_size, tests):
        kept = files(store, RESULTS)
        out = original(location, model, shard_size, tests)
        deleted.extend(sorted(set(kept) - set(files(store, RESULTS))))
        return out

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sweep.driver.compaction, "revert_unmarked", watched)
        argv = ["run", str(store.parent / "sweep.yaml"), "--in-process", "--no-progress"]
        assert main(argv) == 0
    assert deleted == []
    assert "3 tasks completed" in capsys.readouterr().out  # the tests of the 3 shards
    assert_same_store(store, finished)


# --- 2, 3. the report cache: data only, authenticated, in a folder of its own ------------------

class Payload:
    """A pickle that, unpickled, creates the file `path`: code run from the cache."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def report_key(store: Path, **options) -> str:
    """The cache key `sweep report STORE` computes (what anyone who can list the store can)."""
    return entry_key(locate(store), {"store": str(store), "tol": None, "ci": "bootstrap",
                                     "resamples": 2000, "seed": 0, **options})


def test_a_pickle_planted_at_a_stores_key_is_never_run(tmp_path, capsys):
    store = hand_store(tmp_path / "s.zarr")
    ran = tmp_path / "the-payload-ran"
    for folder in {cache_root(), cache_root().parent}:  # today's folder, and the one before
        entry = folder / report_key(store)
        entry.mkdir(parents=True, exist_ok=True)
        (entry / "report.pickle").write_bytes(pickle.dumps(Payload(ran)))
        (entry / "report.json").write_text('{"dict": []}')
    assert main(["report", str(store), "--format", "json"]) == 0
    assert not ran.exists()
    assert json.loads(capsys.readouterr().out)["summary"]  # the store's own report


def test_an_entry_copied_from_another_stores_key_is_a_miss(tmp_path, capsys):
    a = hand_store(tmp_path / "a.zarr")
    b = tmp_path / "b.zarr"
    shutil.copytree(a, b)
    zarr.open_array(str(b / "alpha" / "results" / "holds"), mode="r+")[0, 2, 0, 0] = True
    assert main(["report", str(a)]) == 0
    report_a = capsys.readouterr().out
    assert main(["report", str(b), "--no-cache"]) == 0
    report_b = capsys.readouterr().out
    assert report_b != report_a.replace(str(a), str(b))
    for name in ("md", "report.json"):  # a's entry put at b's key
        target = cache_root() / report_key(b) / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(cache_root() / report_key(a) / name, target)
    assert main(["report", str(b)]) == 0
    assert capsys.readouterr().out == report_b
    md = cache_root() / report_key(a) / "md"  # a text of another kind at the Report's name
    shutil.copy(md, md.with_name("report.json"))
    assert main(["report", str(a), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["summary"]


def test_the_cache_deletes_no_folder_it_did_not_create(tmp_path, monkeypatch, capsys):
    home = tmp_path / "cache-home"
    others = [home / f"project-{i:02d}" for i in range(MAX_ENTRIES + 8)]
    for i, folder in enumerate(others):
        folder.mkdir(parents=True)
        (folder / "notes.txt").write_text("keep me\n")
        os.utime(folder, ns=(i * 10**9, i * 10**9))
    monkeypatch.setenv("SWEEP_CACHE_DIR", str(home))
    store = hand_store(tmp_path / "s.zarr")
    for seed in range(3):
        assert main(["report", str(store), "--seed", str(seed)]) == 0
    assert all((folder / "notes.txt").exists() for folder in others)
    own = [p for p in home.iterdir() if p not in others]
    assert [p.name for p in own] == ["dobrushin-sweep-reports"]


def test_a_cache_folder_others_can_write_is_not_used(tmp_path, monkeypatch, capsys):
    home = tmp_path / "shared"
    (home / "dobrushin-sweep-reports").mkdir(parents=True)
    (home / "dobrushin-sweep-reports").chmod(0o777)
    monkeypatch.setenv("SWEEP_CACHE_DIR", str(home))
    store = hand_store(tmp_path / "s.zarr")
    assert main(["report", str(store)]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("#")
    assert "report cache" in captured.err and "nothing is kept or read there" in captured.err
    assert list((home / "dobrushin-sweep-reports").iterdir()) == []


# --- 9. a report while a run compacts ---------------------------------------------------------

def test_a_report_that_a_compaction_overtakes_reads_again(tmp_path, before_compaction,
                                                          monkeypatch, capsys):
    """The run compacts the model after the report opened the store and before it read the
    chunks (the per-shard chunks it meant to read are deleted): it reads again."""
    store = copy_of(before_compaction, tmp_path)
    argv = ["report", str(store), "--format", "json", "--no-cache", "--ci", "wilson"]
    assert main(argv) == 0
    expected = json.loads(capsys.readouterr().out)["summary"]
    build = sweep.report.tables.build_report
    compacted = []

    def overtaken(*args, **kwargs):
        if not compacted:
            tests = [marker_name("test", shard) for shard in range(3)]
            compacted.append(compact_model(str(store), "rob", 2, tests))
        return build(*args, **kwargs)

    monkeypatch.setattr(sweep.report.tables, "build_report", overtaken)
    assert main(argv) == 0
    assert compacted == [True]
    assert json.loads(capsys.readouterr().out)["summary"] == expected


def test_a_report_overtaken_at_every_read_says_so_in_one_line(tmp_path, before_compaction,
                                                               monkeypatch, capsys):
    store = copy_of(before_compaction, tmp_path)
    build = sweep.report.tables.build_report
    document = store / HOLDS / "zarr.json"

    def overtaken(*args, **kwargs):  # the layout changes during every read
        document.write_bytes(document.read_bytes() + b" ")
        return build(*args, **kwargs)

    monkeypatch.setattr(sweep.report.tables, "build_report", overtaken)
    assert main(["report", str(store), "--no-cache"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"sweep report: error: store {store}: its results changed layout while they "
                   "were read, 3 times (a sweep run compacting or expanding a model); rerun "
                   "once that run is done")


# --- 4, 5. `revision:` of a local git folder ----------------------------------------------------

def git(folder: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(folder), "-c", "user.name=t", "-c",
                           "user.email=t@example.org", *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def armed(folder: Path, sentinel: Path) -> None:
    """Give the repository at `folder` a smudge filter on every file that creates `sentinel`
    (what `git archive` and a checkout run)."""
    git(folder, "config", "filter.pwn.smudge", f"touch {sentinel}; cat")
    git(folder, "config", "filter.pwn.clean", "cat")
    (folder / ".git" / "info").mkdir(exist_ok=True)
    (folder / ".git" / "info" / "attributes").write_text("* filter=pwn\n")


def test_a_revision_is_exported_without_running_the_repositorys_filters(tmp_path, monkeypatch,
                                                                        capsys):
    monkeypatch.setenv("DOBRUSHIN_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "dino"
    tiny = load_extractor(resolve_model("tiny-dinov2"), device="cpu")
    tiny.model.save_pretrained(folder, safe_serialization=True)
    tiny.processor.save_pretrained(folder)
    git(folder, "init", "-q")
    git(folder, "add", "-A")
    git(folder, "commit", "-q", "-m", "v1")
    sentinel = tmp_path / "the-filter-ran"
    armed(folder, sentinel)
    (tmp_path / "sweep.yaml").write_text(
        "store: s.zarr\nbaseline: null\nmatched_nulls: null\n"
        "datasets:\n  photos: {kind: image, source: 'sklearn:sample_images', limit: 2}\n"
        f"models:\n  dino: {{source: 'hf:{folder}', dataset: photos, revision: [HEAD]}}\n")
    assert main(["plan", str(tmp_path / "sweep.yaml")]) == 0
    assert not sentinel.exists()
    exported = model_folder(resolve_model(f"hf:{folder}", revision="HEAD"))
    for name in ("model.safetensors", "config.json", "preprocessor_config.json"):
        assert (Path(exported) / name).read_bytes() == (folder / name).read_bytes()
    assert not sentinel.exists()


def test_two_folders_of_one_commit_are_two_exports(tmp_path, monkeypatch):
    monkeypatch.setenv("DOBRUSHIN_CACHE", str(tmp_path / "cache"))
    outer = tmp_path / "outer"
    (outer / "sub").mkdir(parents=True)
    (outer / "weights.bin").write_bytes(b"the outer model")
    (outer / "sub" / "weights.bin").write_bytes(b"the inner model")
    git(outer, "init", "-q")
    git(outer, "add", "-A")
    git(outer, "commit", "-q", "-m", "c1")
    inner = checkout(outer / "sub", "HEAD")
    whole = checkout(outer, "HEAD")
    assert inner != whole
    assert (inner / "weights.bin").read_bytes() == b"the inner model"
    assert (whole / "weights.bin").read_bytes() == b"the outer model"
    assert (whole / "sub" / "weights.bin").read_bytes() == b"the inner model"
    assert checkout(outer / "sub", "HEAD") == inner  # reused


@pytest.mark.parametrize("kind", ["link", "lfs"])
def test_a_revision_holding_a_link_or_an_lfs_pointer_is_refused(tmp_path, monkeypatch, kind):
    monkeypatch.setenv("DOBRUSHIN_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "m"
    folder.mkdir()
    if kind == "link":
        (folder / "model.safetensors").symlink_to("/etc/passwd")
    else:
        (folder / "model.safetensors").write_bytes(
            b"version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 10\n")
    git(folder, "init", "-q")
    git(folder, "add", "-A")
    git(folder, "commit", "-q", "-m", "c1")
    with pytest.raises(InputError, match="symbolic link" if kind == "link" else "LFS pointer"):
        checkout(folder, "HEAD")


# --- 6. a secret in a URL's query string ------------------------------------------------------

QUERY_SECRETS = {
    "endpoint_url": ("http://127.0.0.1:8333/?access_token=S3CRETtok9", "access_token"),
    "presigned": ("http://127.0.0.1:8333/?X-Amz-Credential=AKIAX%2F1&X-Amz-Signature=S3CRETsig9",
                  "X-Amz-Credential, X-Amz-Signature"),
    "store": ("file://localhost{folder}/s.zarr?sig=S3CRETsas9", "sig"),
}


@pytest.mark.parametrize("case", sorted(QUERY_SECRETS))
@pytest.mark.parametrize("argv", [["plan", "--verbose"], ["run", "--in-process",
                                                          "--no-progress"]])
def test_a_secret_in_a_urls_query_is_refused_without_it(tmp_path, capsys, case, argv):
    url, names = QUERY_SECRETS[case]
    url = url.format(folder=tmp_path)
    store, options = ("s.zarr", {"endpoint_url": url}) if case != "store" else (url, {})
    (tmp_path / "sweep.yaml").write_text(f"store: {json.dumps(store)}\nstorage_options: "
                                         f"{json.dumps(options)}\nmatched_nulls: null\n")
    assert main([argv[0], str(tmp_path / "sweep.yaml"), *argv[1:]]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert f"the URL carries credentials (its parameter {names})" in err, err
    assert "S3CRET" not in err and "=***" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.yaml"]  # no store, no lock


def test_query_secrets_are_masked_wherever_a_url_is_redacted():
    from storage.location import has_credentials, redact_url

    assert redact_url("at http://h:1/p?a=1&access_token=tok&b=2 now") == \
        "at http://h:1/p?a=1&access_token=***&b=2 now"
    assert redact_url("https://b.s3.amazonaws.com/k?X-Amz-Signature=ab12&X-Amz-Expires=60") == \
        "https://b.s3.amazonaws.com/k?X-Amz-Signature=***&X-Amz-Expires=60"
    for url in ["s3://bucket/a.zarr?versionId=3", "runs/what?token=x.zarr", "http://h:1/?x="]:
        assert not has_credentials(url) and redact_url(url) == url, url


# --- 8. an address the machine does not have --------------------------------------------------

@pytest.mark.parametrize("command", ["plan", "run"])
def test_an_unbindable_local_host_is_one_line_exit_3_before_the_store(tmp_path, capsys, command):
    config = write_text_sweep(tmp_path)
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text("kind: local\nlocal: {host: 192.0.2.1}\n")  # TEST-NET-1: no one's
    argv = [command, str(config), "--cluster", str(cluster)]
    assert main(argv + (["--no-progress"] if command == "run" else [])) == 3
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith(f"sweep {command}: environment fault: cluster local.host 192.0.2.1: "
                          "this machine cannot listen there (")  # the system's reason
    assert err.strip().endswith("); set local.host to one of its own addresses (127.0.0.1, "
                                "the default, keeps the cluster on this machine)")
    assert not (tmp_path / "sweep.zarr").exists()


# --- 13. a trailing newline in a name ---------------------------------------------------------

@pytest.mark.parametrize(("models", "why"), [
    ('"rob\\n": {source: tiny-roberta, dataset: lines}', "models.'rob\\n': invalid name"),
    ('rob: {source: tiny-roberta, dataset: "lines\\n"}', "datasets.'lines\\n': invalid name"),
    ('rob: {source: "hf:/m", dataset: lines, revision: ["v1\\n"]}', "revision 'v1\\n': use"),
    ('rob: {source: tiny-roberta, dataset: lines, device: "cpu\\n"}', "'cpu\\n'"),
])
def test_a_name_with_a_trailing_newline_is_refused_in_one_line(tmp_path, capsys, models, why):
    config = write_text_sweep(tmp_path)
    text = config.read_text()
    config.write_text(text[:text.index("models:")] + "models:\n  " + models + "\n")
    if '"lines\\n"' in models:
        config.write_text(config.read_text().replace("  lines: {path", '  "lines\\n": {path'))
    assert main(["plan", str(config)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    assert why in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lines.txt", "sweep.yaml"]


# --- 7, 10, 11, 12. `sweep compare` on unlike, damaged and foreign stores ----------------------

def renamed(store: Path, folder: Path, old: str, new: str) -> Path:
    """A copy of `store` in `folder` holding only model `old`, named `new` (its group, its
    markers and the root's list of models)."""
    copy = folder / store.name
    shutil.copytree(store, copy)
    shutil.rmtree(copy / new)
    (copy / old).rename(copy / new)
    marks = copy / ".sweep" / "markers"
    shutil.rmtree(marks / new)
    (marks / old).rename(marks / new)
    for marker in (marks / new).iterdir():
        marker.write_text(marker.read_text().replace(f'"{old}/', f'"{new}/'))
    root = json.loads((copy / "zarr.json").read_text())
    root.pop("consolidated_metadata", None)
    root["attributes"]["models"] = [new]
    (copy / "zarr.json").write_text(json.dumps(root))
    return copy


@pytest.fixture(scope="module")
def mean_and_each(tmp_path_factory) -> tuple[Path, Path]:
    """Two stores of model `vit` (tiny-vit, 3 pictures): head-averaged, and with every head."""
    folder = tmp_path_factory.mktemp("heads")
    (folder / "sweep.yaml").write_text(
        "store: sweep.zarr\nshard_size: 2\nmatched_nulls: null\nbaseline: null\n"
        "datasets:\n  photos: {source: 'sklearn:sample_images', limit: 3}\nmodels:\n"
        "  vit: {source: tiny-vit, dataset: photos}\n"
        "  each: {source: tiny-vit, dataset: photos, options: {heads: each}}\n")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        assert main(["run", "sweep.yaml", "--in-process", "--no-progress"]) == 0
    mean = folder / "sweep.zarr"
    each = renamed(mean, folder / "each", "each", "vit")
    return mean, each


def test_compare_refuses_a_head_averaged_store_against_a_per_head_one(mean_and_each, capsys):
    mean, each = mean_and_each
    assert main(["compare", str(mean), str(each)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip() == (
        "sweep compare: error: model 'vit': store a holds head-averaged verdicts (heads: mean) "
        "and store b the verdicts of 4 heads each (heads: each); its cells are not alike, so "
        "they are not compared (sweep both with the same `heads` option)")
    assert main(["compare", str(each), str(each)]) == 0  # like with like
    assert "vit | all |" in capsys.readouterr().out


def test_compare_on_a_damaged_store_is_one_line_exit_4(mean_and_each, tmp_path, capsys):
    mean, _ = mean_and_each
    damaged = tmp_path / "damaged.zarr"
    shutil.copytree(mean, damaged)
    target = damaged / "vit" / "results" / "holds" / "c.0.0.0.0"
    target.write_bytes(target.read_bytes()[:-3])
    for argv in (["compare", str(mean), str(damaged)], ["compare", str(damaged), str(mean)]):
        assert main(argv) == 4
        out, err = capsys.readouterr()
        assert out == "" and len(err.strip().splitlines()) == 1
        assert err.startswith("sweep compare: damaged store: store ") and \
            "damaged chunks in vit/results/holds" in err


def test_compare_escapes_a_foreign_stores_model_names(tmp_path, capsys):
    name = "al\x1b]0;pwned\x07\x1b[2Jpha"
    model = FixtureModel(np.zeros((2, 1, 1)), np.full((2, 1, 1), OK, np.int8), ("all",))
    a = write_store(tmp_path / "a.zarr", {name: model})
    b = write_store(tmp_path / "b.zarr", {name: model})
    for fmt in ("text", "csv"):
        assert main(["compare", str(a), str(b), "--format", fmt]) == 0
        out = capsys.readouterr().out
        assert "\x1b" not in out and "\x07" not in out
        assert "al\\x1b]0;pwned\\x07\\x1b[2Jpha" in out


@pytest.mark.parametrize(("option", "message"), [
    (["--resamples", "-5"], "--resamples -5: give 1 to 1,000,000"),
    (["--resamples", "0"], "--resamples 0: give 1 to 1,000,000"),
    (["--resamples", "10000000000"], "--resamples 10000000000: give 1 to 1,000,000"),
    (["--seed", "-1"], "--seed -1: give 0 or more"),
])
@pytest.mark.parametrize("command", ["compare", "report"])
def test_compare_and_report_bound_their_options_in_one_line(tmp_path, capsys, option, message,
                                                           command):
    store = hand_store(tmp_path / "s.zarr")
    stores = [str(store)] * (2 if command == "compare" else 1)
    assert main([command, *stores, *option]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip().startswith(f"sweep {command}: error: {message}")
    assert len(err.strip().splitlines()) == 1


def test_compare_says_plainly_when_no_cell_was_compared(tmp_path, capsys):
    a = hand_store(tmp_path / "a.zarr")
    c = tmp_path / "c.zarr"
    shutil.copytree(a, c)
    digests = zarr.open_array(str(c / "alpha" / "input_digest"), mode="r+")
    digests[...] = np.array([f"{i + 100:064x}" for i in range(digests.shape[0])])
    assert main(["compare", str(a), str(c)]) == 0
    out = capsys.readouterr().out
    assert "unpaired | none compared" in out and "0/0" not in out
    assert out.rstrip().endswith("none compared: no input is in both stores with the same "
                                 "content (input id and digest), so no cell was compared one to "
                                 "one; the rates and their unpaired interval are still the "
                                 "stores' own")


def test_compare_help_shows_a_plain_percent(capsys):
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "with its 95% cluster bootstrap interval" in out and "%%" not in out


@pytest.mark.s3
def test_on_s3_a_per_shard_document_in_a_compacted_model_is_damage_and_kept_values(
        tmp_path, finished, s3_bucket, capsys):
    path = write_text_sweep(tmp_path)
    url = f"s3://{s3_bucket}/restored.zarr"
    endpoint = f"http://127.0.0.1:{os.environ.get('DOBRUSHIN_S3_PORT', '8333')}"
    path.write_text(path.read_text().replace(
        "store: sweep.zarr", f"store: {url}\nstorage_options: {{endpoint_url: '{endpoint}'}}"))
    argv = ["run", str(path), "--in-process", "--no-progress"]
    assert main(argv) == 0
    ref = StoreRef.of(url, {"endpoint_url": endpoint})
    location = locate(ref)
    document = json.loads(location.read(f"{HOLDS}/zarr.json"))
    location.write(f"{HOLDS}/zarr.json", json.dumps(per_shard_document(document, 2)).encode())
    option = f"--storage-option=endpoint_url={endpoint}"
    capsys.readouterr()
    assert main(["status", url, option, "--verify"]) == 4
    assert f"damaged rob metadata {HOLDS}/zarr.json: the per-shard layout" in \
        capsys.readouterr().out
    assert main(argv) == 0
    np.testing.assert_array_equal(stored_arrays(ref)[HOLDS], holds_of(finished), strict=True)
    assert main(["status", url, option, "--verify"]) == 0

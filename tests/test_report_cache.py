"""`sweep report`'s cache: a second rendering of an unchanged store reads back what the first
computed; any change to the store, the options or the code is a miss; nothing is ever stale."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

import pandas as pd
import pytest

import sweep.report.tables
from storage.location import locate
from sweep.cli import report_cache
from sweep.cli.commands import report as report_command
from sweep.cli.entry import main
from sweep.cli.report_cache import MAX_ENTRIES, ReportCache, entry_key, store_digest
from sweep.report.intervals import CI_METHODS, DEFAULT_RESAMPLES
from sweep.report.tables import RENDERERS
from tests.store_fixtures import hand_store

OPTIONS = {"store": "s", "tol": None, "ci": "bootstrap", "resamples": 2000, "seed": 0}


@pytest.fixture
def store(tmp_path):
    return hand_store(tmp_path / "sweep.zarr")


def some_chunk(store):
    return next(p for p in sorted(store.rglob("*")) if p.is_file() and "/c/" in p.as_posix())


def test_the_key_is_stable_for_an_unchanged_store(store):
    location = locate(store)
    assert entry_key(location, OPTIONS) == entry_key(locate(store), dict(OPTIONS))


@pytest.mark.parametrize("change", ["add", "delete", "resize", "rewrite"])
def test_any_change_to_the_store_changes_the_key(store, change):
    location = locate(store)
    before = store_digest(location)
    chunk = some_chunk(store)
    stat = chunk.stat()
    if change == "add":
        (store / "extra.txt").write_text("one more object\n")
    elif change == "delete":
        chunk.unlink()
    elif change == "resize":
        chunk.write_bytes(chunk.read_bytes() + b"\0")
    else:  # same size, same bytes, a later mtime
        chunk.write_bytes(chunk.read_bytes())
        os.utime(chunk, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert store_digest(location) != before


def test_options_and_code_are_part_of_the_key(store, monkeypatch):
    location = locate(store)
    key = entry_key(location, OPTIONS)
    assert entry_key(location, {**OPTIONS, "seed": 1}) != key
    assert entry_key(location, {**OPTIONS, "tol": 1e-9}) != key
    monkeypatch.setattr(report_cache, "code_digest", lambda: "edited")
    assert entry_key(location, OPTIONS) != key


@dataclass(frozen=True)
class Kept:
    rates: list
    table: pd.DataFrame


def key(i: int | str) -> str:
    return hashlib.sha256(str(i).encode()).hexdigest()


def test_entries_round_trip_and_a_damaged_one_is_a_miss(tmp_path):
    cache = ReportCache(key("k"), root=tmp_path)
    assert cache.read("md") is None and cache.load("report.json", Kept) is None
    cache.write("md", b"# report\n")
    table = pd.DataFrame({"model": ["a", "b"], "rate": [0.1, float("nan")], "n": [1, 2]})
    assert cache.dump("report.json", Kept([1, 2], table))
    assert cache.read("md") == b"# report\n"
    back = cache.load("report.json", Kept)
    assert back.rates == [1, 2]
    pd.testing.assert_frame_equal(back.table, table, check_exact=True)
    path = tmp_path / key("k") / "report.json"
    path.write_bytes(path.read_bytes().replace(b"0.1", b"0.2"))
    assert cache.load("report.json", Kept) is None  # its HMAC no longer matches


def test_only_the_newest_entries_are_kept(tmp_path):
    for i in range(MAX_ENTRIES + 3):
        ReportCache(key(i), root=tmp_path).write("md", b"x")
        os.utime(tmp_path / key(i), ns=(i * 10**9, i * 10**9))
    ReportCache(key("last"), root=tmp_path).write("md", b"x")
    kept = {p.name for p in tmp_path.iterdir() if p.is_dir()}
    assert len(kept) == MAX_ENTRIES and key("last") in kept and key(0) not in kept


def test_a_second_report_of_an_unchanged_store_is_read_back(store, capsys, monkeypatch):
    calls, checks = [], []
    build, check = sweep.report.tables.build_report, report_command.check_readable

    def counted(*args, **kwargs):
        calls.append(1)
        return build(*args, **kwargs)

    def checked(*args, **kwargs):
        checks.append(1)
        return check(*args, **kwargs)

    monkeypatch.setattr(sweep.report.tables, "build_report", counted)
    monkeypatch.setattr(report_command, "check_readable", checked)
    assert main(["report", str(store)]) == 0
    first = capsys.readouterr().out
    assert main(["report", str(store)]) == 0
    assert capsys.readouterr().out == first and len(calls) == 1  # read back, not rebuilt
    assert main(["report", str(store), "--format", "json"]) == 0
    json_text = capsys.readouterr().out
    assert len(calls) == 1  # another format of the same report: rendered from the kept one
    assert main(["report", str(store), "--format", "json", "--no-cache"]) == 0
    assert capsys.readouterr().out == json_text and len(calls) == 2
    assert main(["report", str(store), "--seed", "1"]) == 0
    assert len(calls) == 3  # other options: another entry
    (store / "extra.txt").write_text("one more object\n")
    capsys.readouterr()
    checked_before = len(checks)
    assert main(["report", str(store)]) == 0
    assert capsys.readouterr().out == first and len(calls) == 4  # the store changed: rebuilt
    assert len(checks) == checked_before + 1  # ... after its damage check, as the first time


def test_the_parsers_choices_are_the_reports():
    assert report_command.FORMATS == tuple(sorted(RENDERERS))
    assert set(report_command.CI_METHODS) == set(CI_METHODS)
    assert report_command.DEFAULT_RESAMPLES == DEFAULT_RESAMPLES

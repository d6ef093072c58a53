"""Compiled kernels are cached per version of the kernel sources: a change in any cached module
(a callee numba would not notice) gives a new cache folder."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import numba
import numpy as np
import pytest

from workers.exact import numba_cache


def copy_sources(folder: Path) -> Path:
    folder.mkdir()
    for name in numba_cache.NUMBA_MODULES:
        shutil.copy(Path(numba_cache.__file__).parent / name, folder / name)
    return folder


def test_a_change_in_any_cached_module_gives_a_new_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("DOBRUSHIN_CACHE", str(tmp_path / "cache"))
    package = copy_sources(tmp_path / "workers")
    before = numba_cache.cache_dir(package)
    assert before.parent == tmp_path / "cache" / "numba"
    assert numba_cache.cache_dir(package) == before
    for name in numba_cache.NUMBA_MODULES:
        (package / name).write_text((package / name).read_text() + "\n# edited\n")
        after = numba_cache.cache_dir(package)
        assert after != before
        before = after


def test_every_module_with_cached_kernels_is_in_the_digest():
    package = Path(numba_cache.__file__).parent
    cached = sorted(path.name for path in package.glob("*.py")
                    if re.search(r"@njit\([^)]*cache=True", path.read_text()))
    assert cached == sorted(numba_cache.NUMBA_MODULES)


def test_compiled_kernels_land_in_the_versioned_folder():
    if os.environ.get("NUMBA_CACHE_DIR"):
        pytest.skip("NUMBA_CACHE_DIR is set: the user's folder decides")
    from workers.exact import kernel  # configures the cache on import

    kernel.row_sum(np.ones(3))
    folder = numba_cache.cache_dir()
    assert numba.config.CACHE_DIR == str(folder)
    assert any(path.name.startswith("kernel.row_sum") for path in folder.rglob("*.nbi"))


def test_configure_leaves_a_users_cache_dir_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(numba.config, "CACHE_DIR", "")
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "mine"))
    numba_cache.configure()
    assert numba.config.CACHE_DIR == ""  # left to the user's NUMBA_CACHE_DIR
    monkeypatch.delenv("NUMBA_CACHE_DIR")
    monkeypatch.setenv("DOBRUSHIN_CACHE", str(tmp_path / "cache"))
    numba_cache.configure()
    assert numba.config.CACHE_DIR == str(numba_cache.cache_dir())
    assert Path(numba.config.CACHE_DIR).is_dir()

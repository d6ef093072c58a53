"""Shared fixtures: the S3 server of the tests marked `s3` (tests/s3_fixtures.py); `sweep
report`'s cache in a folder of the test session, never the user's."""

import pytest

pytest_plugins = ["tests.s3_fixtures"]


@pytest.fixture(autouse=True, scope="session")
def report_cache_folder(tmp_path_factory):
    """SWEEP_CACHE_DIR for the session (subprocesses inherit it)."""
    patch = pytest.MonkeyPatch()
    patch.setenv("SWEEP_CACHE_DIR", str(tmp_path_factory.mktemp("report-cache")))
    yield
    patch.undo()

"""A real S3-compatible object store for the tests marked `s3`: the SeaweedFS that
`.ci/s3-up.sh` starts on 127.0.0.1 (skipped, with the reason, where it is not up).

`s3_store(name)` gives a fresh `s3://<bucket>/<name>.zarr` in a bucket of its own per test, with
the test credentials in the environment (the way a user sets them) and the endpoint in the
storage options (the way a config names it)."""

from __future__ import annotations

import os
import urllib.error
import urllib.request
import uuid

import pytest

PORT = int(os.environ.get("DOBRUSHIN_S3_PORT", "8333"))
ENDPOINT = f"http://127.0.0.1:{PORT}"
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": os.environ.get("DOBRUSHIN_S3_KEY", "sweep-test"),
    "AWS_SECRET_ACCESS_KEY": os.environ.get("DOBRUSHIN_S3_SECRET", "sweep-test-secret"),
}
OPTIONS = {"endpoint_url": ENDPOINT}


def server_answers() -> bool:
    """Whether an S3 server answers on ENDPOINT (403 without credentials counts)."""
    try:
        urllib.request.urlopen(ENDPOINT, timeout=2)
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


def filesystem():
    """An s3fs filesystem with the test credentials (bucket creation and clean-up)."""
    import s3fs

    return s3fs.S3FileSystem(key=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                             secret=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                             client_kwargs={"endpoint_url": ENDPOINT}, skip_instance_cache=True)


@pytest.fixture(scope="session")
def s3_server():
    if not server_answers():
        pytest.skip(f"no S3 server on {ENDPOINT}: `bash .ci/s3-up.sh` starts SeaweedFS there")
    return ENDPOINT


@pytest.fixture(scope="session")
def s3_session_bucket(s3_server):
    """One bucket for the session (SeaweedFS gives each bucket volumes of its own)."""
    bucket = f"dobrushin-tests-{uuid.uuid4().hex[:12]}"
    fs = filesystem()
    fs.mkdir(bucket)
    yield bucket
    fs.rm(bucket, recursive=True)


@pytest.fixture
def s3_bucket(s3_session_bucket, monkeypatch):
    """`bucket/prefix`: an empty place of its own for one test (stores go below it as
    `s3://<s3_bucket>/name.zarr`); the test credentials set in the environment."""
    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    root = f"{s3_session_bucket}/{uuid.uuid4().hex[:12]}"
    yield root
    fs = filesystem()
    if fs.exists(root):
        fs.rm(root, recursive=True)

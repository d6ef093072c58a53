"""Shared fixtures: the S3 server of the tests marked `s3` (tests/s3_fixtures.py)."""

pytest_plugins = ["tests.s3_fixtures"]

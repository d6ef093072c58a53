"""The STORE argument of the commands that read a store (`status`, `report`, `show`): a path or
a URL, with `--storage-option KEY=VALUE` for how to reach it (docs/storage.md)."""

from __future__ import annotations

import argparse

import yaml

from storage.errors import InputError
from storage.location import STORAGE_OPTIONS, StoreRef, check_no_userinfo


def add_store_argument(parser: argparse.ArgumentParser) -> None:
    """Add the positional STORE and the repeatable `--storage-option KEY=VALUE`."""
    parser.add_argument("store", help="the sweep's Zarr store: a folder, or a URL "
                        "(s3://bucket/prefix/study.zarr, gs://, az://)")
    parser.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                        help=f"how to reach an object store ({', '.join(STORAGE_OPTIONS)}); "
                        "credentials come from the environment, never from here")


def store_ref(args: argparse.Namespace) -> StoreRef:
    """The store the arguments name, with its storage options (values read as YAML scalars:
    `anon=true` is a boolean)."""
    check_no_userinfo(args.store, "store")
    options = {}
    for item in args.storage_option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InputError(f"--storage-option {item!r}: write KEY=VALUE")
        options[key] = yaml.safe_load(value)
    try:
        return StoreRef.of(args.store, options)
    except InputError as error:
        raise InputError(f"--storage-option {str(error).removeprefix('storage_options.')}"
                         ) from None

"""The one YAML reader of sweep and cluster configs: UTF-8 checked, duplicate keys refused.

`yaml.safe_load` silently keeps the last of two equal keys; `load_yaml` raises a
`yaml.constructor.ConstructorError` whose `problem_mark` gives the line of the repeat (callers
turn YAML errors into one line with the file and line). `read_text` refuses a file that is not
UTF-8 with the byte offset and line of the first bad byte.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError

from storage.errors import InputError


class UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping holding the same key twice."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: SafeLoader reports it
                break
            if first is not None:
                raise ConstructorError(
                    None, None,
                    f"duplicate key {key!r} (first at line {first}); keep one of them",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str) -> Any:
    """Parse YAML text safely (no tags), refusing duplicate keys."""
    return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass


def read_text(path: Path) -> str:
    """The file's text; InputError naming the line and byte of the first non-UTF-8 byte."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[:error.start].count(b"\n") + 1
        raise InputError(
            f"{path}: line {line}: not UTF-8 (byte {error.start}: "
            f"{data[error.start:error.start + 1]!r}); save the file as UTF-8"
        ) from None

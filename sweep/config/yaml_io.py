"""The one YAML reader of sweep and cluster configs: bounded, UTF-8 checked, duplicate keys refused.

`yaml.safe_load` silently keeps the last of two equal keys; `load_yaml` raises a
`yaml.constructor.ConstructorError` whose `problem_mark` gives the line of the repeat (callers
turn YAML errors into one line with the file and line). `read_text` refuses a file that is not
UTF-8 with the byte offset and line of the first bad byte. A date (`2001-12-25`, YAML 1.1's
timestamp; `2001-13-45` made `datetime` raise) and an integer of more than MAX_INT_DIGITS digits
(Python refuses to convert 4,300) are refused the same way, with their line.

A config is a few KB (the bundled `default.yaml` is 3.5 KB, `cluster.yaml` 4.8 KB), so what a
config file may hold is bounded before it can cost memory or minutes (issue 28): `read_text`
reads at most MAX_CONFIG_BYTES (the size is checked before parsing: a 48 MB config once ran
`sweep plan` past 180 s and 2.7 GB), and `load_yaml` parses with the safe loader (libyaml's
when PyYAML has it: about 10 times faster than the pure-Python one on a 1 MiB list, and it
refuses deep nesting itself), then counts every list and mapping entry, YAML aliases counted at
each use (an alias "bomb" of a few lines would otherwise expand to billions of items in the
validation), at most MAX_ITEMS, and at most MAX_DEPTH levels deep; each refusal is one
`InputError` naming the key path and the bound.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import ConstructorError, SafeConstructor

from storage.errors import InputError

MAX_CONFIG_BYTES = 1 << 20  # 1 MiB: a config is a few KB; 1,000 models take about 60 KB
MAX_ITEMS = 100_000  # list and mapping entries of a whole config, aliases counted at each use
MAX_DEPTH = 32  # nesting levels (a config nests 4 deep: models.<name>.options.<key>)
SHOWN_KEY = 60  # characters of a key quoted in a message


class _UniqueKeys:
    """Constructor mix-in that refuses a mapping holding the same key twice."""

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
        return SafeConstructor.construct_mapping(self, node, deep=deep)


MAX_INT_DIGITS = 30  # digits of an integer a config may hold (a 64-bit count has 19)


def _no_timestamp(loader: SafeConstructor, node: yaml.ScalarNode) -> None:
    """YAML 1.1 reads `2001-12-25` as a date (and `2001-13-45` fails in `datetime`); no
    setting takes a date or a time: refuse it with its line, naming the quoting that makes it
    text."""
    raise ConstructorError(
        None, None, f"{node.value!r} reads as a date in YAML, which no setting takes; quote it "
        f"('{node.value}') if it is a name or a path", node.start_mark)


def _bounded_int(loader: SafeConstructor, node: yaml.ScalarNode) -> int:
    """An integer of at most MAX_INT_DIGITS digits, in any base (Python refuses to convert more
    than 4,300 decimal digits, with a ValueError that would end in a traceback)."""
    digits = sum(ch.isalnum() for ch in str(node.value).lower().removeprefix("0x")
                 .removeprefix("0o").removeprefix("0b"))
    if digits > MAX_INT_DIGITS:
        raise ConstructorError(
            None, None, f"an integer of {digits:,} digits, more than any setting takes (at "
            f"most {MAX_INT_DIGITS})", node.start_mark)
    return SafeConstructor.construct_yaml_int(loader, node)


class UniqueKeyLoader(_UniqueKeys, yaml.SafeLoader):
    """SafeLoader (pure Python) that refuses a mapping holding the same key twice."""


LOADERS: list[type] = [UniqueKeyLoader]
if getattr(yaml, "__with_libyaml__", False):
    class FastUniqueKeyLoader(_UniqueKeys, yaml.CSafeLoader):
        """CSafeLoader (libyaml's parser, the safe constructor) refusing duplicate keys."""

    LOADERS.append(FastUniqueKeyLoader)
LOADER: type = LOADERS[-1]  # libyaml's where PyYAML has it (its Linux and macOS wheels do)
for _loader in LOADERS:  # dates refused, integers bounded (issue 34, item 8)
    _loader.add_constructor("tag:yaml.org,2002:timestamp", _no_timestamp)
    _loader.add_constructor("tag:yaml.org,2002:int", _bounded_int)


def load_yaml(text: str, where: str = "") -> Any:
    """Parse YAML text safely (no tags), refusing duplicate keys, then `check_bounded`;
    `where` (the file's name) starts a bound's message."""
    try:
        data = yaml.load(text, Loader=LOADER)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:  # the pure-Python parser on deep nesting
        raise InputError(f"{where + ': ' if where else ''}nested too deeply (more than "
                         f"{MAX_DEPTH} levels); a config nests a few levels") from None
    check_bounded(data, where)
    return data


def _key(path: str, key: Any) -> str:
    text = str(key)
    text = text if len(text) <= SHOWN_KEY else f"{text[:SHOWN_KEY]}..."
    return f"{path}.{text}" if path else text


def check_bounded(data: Any, where: str = "") -> None:
    """InputError naming the key path if `data` (parsed YAML) holds more than MAX_ITEMS list
    and mapping entries in all (an alias counted at each use: this is the size the validation
    would walk) or nests deeper than MAX_DEPTH. Stops as soon as a bound is passed, so a
    self-referencing alias (`&a [*a]`) ends too."""
    prefix = f"{where}: " if where else ""
    total = 0
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    while stack:
        node, path, depth = stack.pop()
        if isinstance(node, dict):
            children = [(value, _key(path, key)) for key, value in node.items()]
        elif isinstance(node, list):
            children = [(value, f"{path}[{i}]") for i, value in enumerate(node)]
        else:
            continue
        shown = path if len(path) <= 2 * SHOWN_KEY else f"{path[:2 * SHOWN_KEY]}..."
        shown = shown or "(top level)"
        if len(children) > MAX_ITEMS:
            raise InputError(
                f"{prefix}{shown}: {len(children):,} items, more than a whole config may hold "
                f"({MAX_ITEMS:,}); a config is a few KB: put long lists in a data file (datasets "
                f"take a path), or split the sweep over several configs")
        total += len(children)
        if total > MAX_ITEMS:
            raise InputError(
                f"{prefix}{shown}: more than {MAX_ITEMS:,} list and mapping items in the config "
                f"(YAML aliases counted at each use); a config is a few KB: put long lists in a "
                f"data file, or split the sweep over several configs")
        if depth >= MAX_DEPTH and children:
            raise InputError(f"{prefix}{shown}: nested more than {MAX_DEPTH} levels deep; a "
                             f"config nests a few levels")
        stack.extend((value, key, depth + 1) for value, key in children
                     if isinstance(value, dict | list))


def read_text(path: Path, limit: int = MAX_CONFIG_BYTES) -> str:
    """The file's text; InputError if it holds more than `limit` bytes (read no further) or
    naming the line and byte of the first non-UTF-8 byte."""
    with open(path, "rb") as handle:
        data = handle.read(limit + 1)
        if len(data) > limit:
            size = Path(path).stat().st_size
            what = f"{size / (1 << 20):.1f} MiB" if size > limit else f"more than {limit:,} bytes"
            raise InputError(
                f"{path}: {what}, larger than a config may be ({limit / (1 << 20):g} MiB); a "
                f"config is a few KB (the bundled default.yaml 3.5 KB): put long lists in a "
                f"data file (datasets take a path), or split the sweep over several configs")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[:error.start].count(b"\n") + 1
        raise InputError(
            f"{path}: line {line}: not UTF-8 (byte {error.start}: "
            f"{data[error.start:error.start + 1]!r}); save the file as UTF-8"
        ) from None

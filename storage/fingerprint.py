"""Content hashes of what determines results, and a readable account of what differs."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(value: Any) -> str:
    """Sorted-key, whitespace-free JSON: the same data always gives the same text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def fingerprint(value: Any) -> str:
    """sha256 hex digest of `canonical_json(value)`."""
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def stable_int(text: str) -> int:
    """A 64-bit integer from `text` that is the same in every process (sha256, first 8 bytes)."""
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def _flatten(value: Any, prefix: str) -> dict[str, Any]:
    if isinstance(value, dict):
        flat: dict[str, Any] = {}
        for key, item in value.items():
            flat.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return flat
    return {prefix: value}


def describe_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """One `key: old -> new` line per dotted key whose value differs (added/removed included)."""
    before, after = _flatten(old, ""), _flatten(new, "")
    missing = object()
    lines = []
    for key in sorted(set(before) | set(after)):
        a, b = before.get(key, missing), after.get(key, missing)
        if a != b:
            shown_a = "(absent)" if a is missing else canonical_json(a)
            shown_b = "(absent)" if b is missing else canonical_json(b)
            lines.append(f"{key}: {shown_a} -> {shown_b}")
    return lines

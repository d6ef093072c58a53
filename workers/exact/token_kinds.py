"""The kinds of token an attention matrix row can belong to, shared by extraction and storage."""

from __future__ import annotations

from enum import IntEnum

import numpy as np


class TokenKind(IntEnum):
    """Stored as int8; PAD marks the padding of a stored (padded) token axis, never a real token."""

    PAD = -1
    CONTENT = 0
    CLS = 1
    REGISTER = 2
    SEP = 3
    DIST = 4


TOKEN_SETS: dict[str, str] = {
    "all": "every real token (content and special): A itself",
    "content": "content tokens C only (patches, words, features): A[C,C], rows renormalised",
    "content-pairs": "kappa over pairs of content tokens only, on the full rows of the all-token A",
    "content-complement": "the stochastic complement on C: A_CC + A_CS (I - A_SS)^-1 A_SC "
                          "(S: the special tokens)",
}
"""Every token set (reading) a sweep can test, with a one-line description; docs/readings.md
gives their formulas."""

DEFAULT_TOKEN_SETS: tuple[str, ...] = ("all", "content")
"""The token sets a config that names none tests."""

READING_LABELS: dict[str, str] = {
    "all": "all (A)",
    "content": "content (A[C,C], renormalised)",
    "content-pairs": "content-pairs (pairs in C, full rows of A)",
    "content-complement": "content-complement (A[C,C] + A[C,S] (I - A[S,S])^-1 A[S,C])",
}

CONTENT_READINGS: tuple[str, ...] = ("content", "content-pairs", "content-complement")
"""The token sets whose token set is the content tokens C (each a different reading of it)."""


def reading_label(token_set: str) -> str:
    """The token set named with its reading, e.g. 'content (A[C,C], renormalised)'; an unknown
    name is returned as it is."""
    return READING_LABELS.get(token_set, token_set)


def keep_mask(token_kind: np.ndarray, token_set: str) -> np.ndarray:
    """Boolean mask over a real (unpadded) token axis of the tokens `token_set` keeps (the content
    tokens C for every content reading)."""
    kinds = np.asarray(token_kind)
    if token_set == "all":
        return kinds != TokenKind.PAD
    if token_set in CONTENT_READINGS:
        return kinds == TokenKind.CONTENT
    raise ValueError(f"unknown token set {token_set!r}: choose from {sorted(TOKEN_SETS)}")


def special_mask(token_kind: np.ndarray) -> np.ndarray:
    """Boolean mask of the special (non-content, non-padding) tokens."""
    kinds = np.asarray(token_kind)
    return (kinds != TokenKind.CONTENT) & (kinds != TokenKind.PAD)

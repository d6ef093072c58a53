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
    "all": "every real token (content and special)",
    "content": "content tokens only: patches, words, features (no CLS/register/SEP/distillation)",
}


def keep_mask(token_kind: np.ndarray, token_set: str) -> np.ndarray:
    """Boolean mask over a real (unpadded) token axis of the tokens `token_set` keeps."""
    kinds = np.asarray(token_kind)
    if token_set == "all":
        return kinds != TokenKind.PAD
    if token_set == "content":
        return kinds == TokenKind.CONTENT
    raise ValueError(f"unknown token set {token_set!r}: choose from {sorted(TOKEN_SETS)}")


def special_mask(token_kind: np.ndarray) -> np.ndarray:
    """Boolean mask of the special (non-content, non-padding) tokens."""
    kinds = np.asarray(token_kind)
    return (kinds != TokenKind.CONTENT) & (kinds != TokenKind.PAD)

"""Text from a store, a dataset or a message made safe to print on a terminal.

A store is data anyone can hand over: its model names, input ids, failed-marker errors and the
dataset lines it points to may hold terminal control sequences (`ESC [2J` clears the screen,
`ESC ] 0 ; ... BEL` retitles the window, OSC 8 plants links, bidi overrides reorder what is
read). `printable` shows every control and format character as a Python escape (`\\x1b`,
`\\u202e`), keeping newlines and tabs, so what the commands print is what the store holds,
visibly (issue 34, item 10).
"""

from __future__ import annotations

import unicodedata

KEPT = "\n\t"


def _shown(char: str) -> str:
    if char in KEPT or unicodedata.category(char) not in ("Cc", "Cf"):
        return char
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """`text` with every control or format character (Unicode Cc, Cf) but newline and tab
    written as its escape."""
    if text.isprintable():
        return text
    return "".join(_shown(char) for char in text)

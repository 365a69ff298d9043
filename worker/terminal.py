"""Text from the cluster, made safe for a terminal.

Node names, labels, devices, alert examples and timeline reasons come from the cluster or from
whoever sent an alert. Printed raw, a newline forges a table row, an escape sequence moves the
cursor or retitles the window, and a right-to-left override makes `gpu-node-1` read as
something else. `safe` shows every such character as a visible escape instead (`\\n`,
`\\x1b`, `\\u202e`); everything else is left as it is.
"""

from __future__ import annotations

import unicodedata

# Bidirectional controls (embeddings, overrides, isolates, marks): invisible, and they reorder
# the text around them.
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(ch: str) -> str:
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def safe(text: object) -> str:
    """`text` with control characters (C0, C1, DEL), bidirectional controls and other
    format characters (Unicode category Cf: zero-width joiners, BOM) escaped."""
    s = str(text)
    if s.isprintable() and not any(ch in _BIDI for ch in s):
        return s  # the common case: nothing to do
    return "".join(_escape(ch) if _unsafe(ch) else ch for ch in s)


def _unsafe(ch: str) -> bool:
    if ch in _BIDI or unicodedata.category(ch) in ("Cc", "Cf"):
        return True
    return not ch.isprintable() and ch != " "

"""Parsing the product's source in tests, safe beside threads that compile.

CPython 3.11's AST constructor keeps its recursion depth in interpreter-wide state: when another
thread compiles at the same moment (a Temporal worker's sandbox importing workflow modules), a
parse can fail with `SystemError: AST constructor recursion depth mismatch` (CPython issue
106905). That is the interpreter's race, not the source: the parse is made again.
"""

from __future__ import annotations

import ast

ATTEMPTS = 5


def parse(source: str, filename: str = "<unknown>") -> ast.Module:
    for attempt in range(ATTEMPTS):
        try:
            return ast.parse(source, filename)
        except SystemError:
            if attempt == ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")

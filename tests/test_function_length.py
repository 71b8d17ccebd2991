"""No function in testbed/ longer than 80 lines (docstring included): a long function is a run of jobs that each
want a name. Any known exception would be listed with its length (none is); the test fails on any other, and on a
listed one that grew or was split (so the list stays true)."""

from __future__ import annotations

import ast

from tests.conftest import ROOT

MAX_LINES = 80
# (module, function) -> its length now, each to be split; none may grow
KNOWN: dict[tuple[str, str], int] = {}


def long_functions() -> dict[tuple[str, str], int]:
    out = {}
    for path in sorted((ROOT / "testbed").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1  # type: ignore[operator]
                if n > MAX_LINES:
                    out[(path.relative_to(ROOT).as_posix(), node.name)] = n
    return out


def test_no_function_is_over_80_lines_but_the_known_ones():
    found = long_functions()
    new = {k: n for k, n in found.items() if k not in KNOWN}
    assert not new, f"functions over {MAX_LINES} lines: {new}; split them"
    grown = {k: (KNOWN[k], n) for k, n in found.items() if k in KNOWN and n > KNOWN[k]}
    assert not grown, f"known long functions grew (was, now): {grown}"
    gone = sorted(set(KNOWN) - set(found))
    assert not gone, f"no longer over {MAX_LINES} lines, take them off KNOWN: {gone}"

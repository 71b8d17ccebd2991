"""The data flows one way: spec -> plan -> (simulate | emulate). Nothing in plan/ imports the simulator or the
emulator (checked on the source, so a lazy import inside a function counts too)."""

import ast
from pathlib import Path

PLAN = Path(__file__).resolve().parent.parent / "testbed" / "plan"


def test_plan_imports_neither_engine():
    for f in sorted(PLAN.glob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for n in names:
                assert not n.startswith(("testbed.sim", "testbed.emu", "testbed.runs")), f"{f.name} imports {n}"

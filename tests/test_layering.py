"""The data flows one way: spec -> plan -> (simulate | emulate) -> runs. Nothing in plan/ imports the simulator or the
emulator (checked on the source, so a lazy import inside a function counts too)."""

import ast
from pathlib import Path

PLAN = Path(__file__).resolve().parent.parent / "testbed" / "plan"


SIMULATES: dict[str, tuple[str, ...]] = {}  # none: Atlas's choice runs in testbed/sim/choose.py


def test_plan_imports_neither_engine():
    for f in sorted(PLAN.glob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for n in names:
                if n in SIMULATES.get(f.name, ()):
                    continue
                assert not n.startswith(("testbed.sim", "testbed.emu", "testbed.runs")), f"{f.name} imports {n}"


ENGINES = [Path(__file__).resolve().parent.parent / "testbed" / d for d in ("sim", "emu", "runtime", "bubbletea")]


def test_engines_do_not_import_the_runs_layer_or_the_cli():
    """The runs layer (testbed/runs) drives the engines; an engine never calls back up into it or the CLI."""
    for d in ENGINES:
        for f in sorted(d.rglob("*.py")):
            for node in ast.walk(ast.parse(f.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                for n in names:
                    assert not n.startswith(("testbed.runs", "testbed.cli")), f"{d.name}/{f.name} imports {n}"

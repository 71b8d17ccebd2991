"""The package's whole import graph (imports inside functions and under TYPE_CHECKING included, read with ast):
no cycles between modules, and each layer imports only the layers below it (docs/architecture.md, "Layers")."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

PKG = ROOT / "testbed"
# Bottom to top, as docs/architecture.md draws them; a unit is a subpackage or a top-level module.
LAYERS: list[set[str]] = [
    {"testbed", "errors", "net"},  # ground floor: the standard library only
    {"program", "results", "columns", "progress"},  # plain data and how it is written
    {"timeline"},
    {"bubbletea.policy"},  # BubbleTea's policy: traces, bubbles, the scheduler, the online planner
    {"costs"},  # the zoos and cost models: a spec names their GPUs and models, and registers its own there
    {"spec"},
    {"plan"},
    {"sim", "analysis"},
    {"bubbletea"},  # BubbleTea's simulated half
    {"runtime"},  # role processes (BubbleTea's too): they import only ROLE_MAY_IMPORT
    {"emu"},
    {"launch"},
    {"cluster"},  # several machines: placement, the agents, the driver
    {"runs"},
    {"figures", "tables"},
    {"claims", "report", "answer"},
    {"cli"},
    {"__main__"},
]
ROLE_MAY_IMPORT = {"testbed", "errors", "net", "program", "runtime", "bubbletea.policy"}
# BubbleTea's package (testbed/bubbletea/) holds its policy, its simulated half, its role processes and its emulated
# half: each module sits in the layer of what it is, so the policy stays below everything that runs it.
BUBBLETEA = {
    "bubbletea.policy": {"trace", "bubbles", "pool", "scheduler", "online", "knee"},
    "bubbletea": {"fill", "run", "realised", "without_prefill"},  # the simulated half
    # role processes: the service, the worker's side and its KV sender, decoders
    "runtime": {"service", "worker_side", "decode", "kvsend"},
    "emu": {"emulated", "kvdelay"},  # the emulated half: the service's configuration, the KV caches' delay line
}
# Known arrows that break the rules, each kept until a move that touches many files: the test fails on any other.
ALLOWED = {
    # the BubbleTea service predicts a prefill's time with the simulator's cost model (costs/prefill.py)
    ("testbed.bubbletea.service", "testbed.costs.prefill"),
    ("testbed.bubbletea.service", "testbed.costs.prefill_model"),  # ops or curve (bubbletea.prefill_model)
    ("testbed.bubbletea.service", "testbed.costs.gpu_specs"),  # registers the GPUs as the orchestrator has them
    # the role processes' models take their shapes from the model zoo (costs/models.py, standard library only)
    ("testbed.bubbletea.service", "testbed.costs.models"),
    ("testbed.bubbletea.decode", "testbed.costs.models"),
    ("testbed.bubbletea.worker_side", "testbed.costs.models"),
    ("testbed.runtime.tiny_llama", "testbed.costs.models"),
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PKG.rglob("*.py")}


def imports(name: str) -> set[str]:
    """The package's modules that module `name` imports anywhere in its file."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names}
    return {m for m in found if m in MODULES and m != name}


GRAPH = {m: imports(m) for m in MODULES}


def unit(module: str) -> str:
    parts = module.split(".")
    if len(parts) > 2 and parts[1] == "bubbletea":
        return next((u for u, names in BUBBLETEA.items() if parts[2] in names), f"bubbletea.{parts[2]} (BUBBLETEA)")
    return parts[1] if len(parts) > 1 else module


def layer(module: str) -> int:
    return next(i for i, units in enumerate(LAYERS) if unit(module) in units)


def test_every_module_has_a_layer():
    missing = sorted({unit(m) for m in MODULES} - set().union(*LAYERS))
    assert not missing, f"give {missing} a layer in LAYERS and in docs/architecture.md"


def test_the_graph_sees_imports_inside_functions():
    assert "testbed.emu.scale" in GRAPH["testbed.emu.build"]  # imported at the top
    assert "testbed.emu.attach" in GRAPH["testbed.cli"]  # imported inside a command


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while (w := stack.pop()) != v:
                comp.append(w)
            if comp:
                out.append(sorted([v, *comp]))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    assert cycles(GRAPH) == []


def test_cycle_detection_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def violations(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    bad = set()
    for m, targets in graph.items():
        for t in targets:
            if unit(m) == unit(t):
                continue
            if layer(t) >= layer(m) or (unit(m) == "runtime" and unit(t) not in ROLE_MAY_IMPORT):
                bad.add((m, t))
    return bad


def test_each_layer_imports_only_layers_below_it():
    new = sorted(violations(GRAPH) - ALLOWED)
    assert not new, "imports against the layers (docs/architecture.md): " + ", ".join(f"{a} -> {b}" for a, b in new)


def test_the_allow_list_holds_only_arrows_that_exist():
    assert violations(GRAPH) >= ALLOWED, f"remove from ALLOWED: {sorted(ALLOWED - violations(GRAPH))}"


def test_bubbleteas_policy_is_below_what_runs_it():
    assert unit("testbed.bubbletea.online") == "bubbletea.policy" and unit("testbed.bubbletea.service") == "runtime"
    assert layer("testbed.bubbletea.online") < layer("testbed.sim.executor") < layer("testbed.bubbletea.run")
    assert ("testbed.bubbletea.online", "testbed.bubbletea.run") in violations(
        {"testbed.bubbletea.online": {"testbed.bubbletea.run"}})  # the policy importing its simulated half
    assert ("testbed.bubbletea.service", "testbed.bubbletea.emulated") in violations(
        {"testbed.bubbletea.service": {"testbed.bubbletea.emulated"}})  # a role importing the emulator


def test_an_upward_arrow_is_a_violation():
    assert ("testbed.plan.build", "testbed.runtime.htb") in violations({"testbed.plan.build": {"testbed.runtime.htb"}})
    assert ("testbed.runtime.worker", "testbed.plan.turns") in violations(
        {"testbed.runtime.worker": {"testbed.plan.turns"}})

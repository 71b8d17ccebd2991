"""Regenerate every simulated number the docs mark and fail on any that differs (`make check-docs`).

The simulator is deterministic, so a number in README.md or docs/*.md that came from it can be checked
by running its command again. Two kinds of HTML comment, invisible on GitHub, tie a number to its run:

    <!-- check-run paper: sim experiments/paper-3dc.yaml -->
    | 5 ms | 3.46<!-- check: paper; scheduler=atlas wan_latency_ms=5; iteration_s --> s |

`check-run NAME: ARGS` defines a run: `testbed ARGS --out DIR` (`$AZURE` is the Azure trace folder:
the AZURE environment variable, else ../shared/data/azure-llm-inference-2023 beside the repository).
`check: NAME[/FILE]; FILTER; EXPR[; FORMAT]` follows the number it checks: FILTER (`column=value`, space
separated) picks exactly one row of the run's FILE (default summary.csv), EXPR is a column or arithmetic
over columns (`100*gpu_util`); the value, rounded to as many decimals as the text shows (or formatted
with the %-FORMAT given), must equal the number in the text (thousands separators and a leading +
ignored). Parts are separated by `;`, not `|`, so that an anchor may sit inside a Markdown table. Each
run happens once however many numbers it checks. Emulated numbers carry no anchor: they keep the command
and date that gave them.

`--fix` rewrites each number that differs in place (keeping its '+' and thousands commas); the prose around
it is still the writer's to re-read.

Run: .venv/bin/python bench/check_docs.py [--runs paper,bubbletea] [--list] [--fix] [FILES...]
"""

from __future__ import annotations

import argparse
import ast
import csv
import operator
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUN_RE = re.compile(r"<!--\s*check-run\s+([\w-]+)\s*:\s*(.+?)\s*-->")
ANCHOR_RE = re.compile(r"<!--\s*check:\s*(.+?)\s*-->")
NUMBER_RE = re.compile(r"([-+]?\d[\d,]*(?:\.\d+)?)[\s*]*$")
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


@dataclass(frozen=True)
class Anchor:
    """One checked number: where it is, what the text says, and which cell gives it."""
    where: str
    text: str
    run: str
    file: str
    filters: tuple[tuple[str, str], ...]
    expr: str
    fmt: str
    line: int = 0  # where it is, for --fix: the line's index and the anchor's index on that line
    index: int = 0
    path: str = ""


def default_docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def parse(text: str, name: str) -> tuple[dict[str, str], list[Anchor]]:
    """The runs a document defines and the numbers it anchors; a malformed anchor raises ValueError."""
    runs: dict[str, str] = {}
    anchors: list[Anchor] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        where = f"{name}:{lineno}"
        for m in RUN_RE.finditer(line):
            runs[m.group(1)] = m.group(2)
        for k, m in enumerate(ANCHOR_RE.finditer(line)):
            anchors.append(replace(_anchor(where, line[:m.start()], m.group(1)), line=lineno - 1, index=k))
    return runs, anchors


def _anchor(where: str, before: str, body: str) -> Anchor:
    parts = [p.strip() for p in body.split(";")]
    if len(parts) not in (3, 4) or not parts[0]:
        raise ValueError(f"{where}: anchor '{body}' must read 'RUN[/FILE]; col=value ...; EXPR[; %FORMAT]'")
    number = NUMBER_RE.search(re.sub(r"<!--.*?-->", "", before))
    if number is None:
        raise ValueError(f"{where}: no number right before the anchor '{body}'; put the anchor after the number")
    run, _, file = parts[0].partition("/")
    text = number.group(1)
    decimals = len(text.partition(".")[2])
    fmt = parts[3] if len(parts) == 4 else f"%.{decimals}f"
    filters = tuple(tuple(f.split("=", 1)) for f in parts[1].split())
    if any(len(f) != 2 for f in filters):
        raise ValueError(f"{where}: filter '{parts[1]}' must be space-separated column=value pairs")
    return Anchor(where, text, run, file or "summary.csv", filters, parts[2], fmt)


def evaluate(expr: str, row: dict[str, str]) -> float:
    """EXPR over one CSV row: numbers, column names, + - * / and parentheses, nothing else."""
    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return float(node.value)
        if isinstance(node, ast.Name):
            if node.id not in row:
                raise ValueError(f"no column '{node.id}'")
            return float(row[node.id])
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            return OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        raise ValueError(f"'{expr}' may use only numbers, columns, + - * / and parentheses")
    return ev(ast.parse(expr, mode="eval"))


def _matches(cell: str, want: str) -> bool:
    try:
        return float(cell) == float(want)
    except ValueError:
        return cell == want


def pick_row(rows: list[dict[str, str]], filters: tuple[tuple[str, str], ...]) -> dict[str, str]:
    hits = [r for r in rows if all(_matches(r.get(k, ""), v) for k, v in filters)]
    if len(hits) != 1:
        wanted = " ".join(f"{k}={v}" for k, v in filters)
        raise ValueError(f"filter '{wanted}' matches {len(hits)} rows, not one")
    return hits[0]


def regenerate(anchor: Anchor, rows: list[dict[str, str]]) -> str:
    """The anchored number as the run gives it, in the anchor's format; ValueError when it cannot."""
    try:
        return anchor.fmt % evaluate(anchor.expr, pick_row(rows, anchor.filters))
    except (TypeError, ZeroDivisionError) as e:
        raise ValueError(str(e)) from e


def check(anchor: Anchor, rows: list[dict[str, str]]) -> str | None:
    """None when the text equals the regenerated value, else a one-line reason."""
    try:
        value = regenerate(anchor, rows)
    except ValueError as e:
        return f"{anchor.where}: {anchor.run}/{anchor.file}: {e}"
    if value.replace(",", "").lstrip("+") == anchor.text.replace(",", "").lstrip("+"):
        return None
    return f"{anchor.where}: the text says {anchor.text}, {anchor.run}/{anchor.file} gives {value} ({anchor.expr})"


def as_written(value: str, like: str) -> str:
    """`value` written as the text wrote the number it replaces: its explicit '+' and its thousands commas."""
    if "," in like:
        whole, dot, frac = value.lstrip("+-").partition(".")
        sign = value[: len(value) - len(value.lstrip("+-"))]
        value = f"{sign}{int(whole):,}{dot}{frac}"
    if like.startswith("+") and not value.startswith(("+", "-")):
        value = "+" + value
    return value


def fix_line(line: str, values: dict[int, str]) -> str:
    """The line with the number before its k-th anchor replaced by values[k] (as the text wrote it)."""
    out, prev = [], 0
    for k, m in enumerate(ANCHOR_RE.finditer(line)):
        segment = line[prev:m.start()]
        if k in values:
            n = NUMBER_RE.search(segment)
            if n is not None:
                segment = segment[:n.start(1)] + as_written(values[k], n.group(1)) + segment[n.end(1):]
        out.append(segment + m.group(0))
        prev = m.end()
    return "".join(out) + line[prev:]


def fix_docs(fixes: dict[str, dict[int, dict[int, str]]]) -> None:
    """Rewrite each document's mismatching numbers in place: {path: {line index: {anchor index: value}}}."""
    for path, lines in fixes.items():
        p = Path(path)
        text = p.read_text().split("\n")
        for i, values in lines.items():
            text[i] = fix_line(text[i], values)
        tmp = p.with_suffix(p.suffix + ".tmp")
        tmp.write_text("\n".join(text))
        tmp.replace(p)


def azure_dir() -> str:
    return os.environ.get("AZURE") or str(ROOT.parent / "shared" / "data" / "azure-llm-inference-2023")


class MissingInput(Exception):
    """A run needs a data set this machine does not have (the Azure traces)."""


class Runner:
    """Runs each distinct command once, in a scratch folder, and reads its CSVs."""

    def __init__(self, scratch: Path, log: Callable[[str], None] = print):
        self.scratch, self.log = scratch, log
        self.done: dict[str, Path] = {}

    def rows(self, args: str, file: str) -> list[dict[str, str]]:
        if args not in self.done:
            if "$AZURE" in args and not Path(azure_dir()).is_dir():
                raise MissingInput(f"no Azure trace in {azure_dir()} (set AZURE to its folder)")
            out = self.scratch / f"run{len(self.done)}"
            cmd = [sys.executable, "-m", "testbed", *shlex.split(args.replace("$AZURE", azure_dir())),
                   "--out", str(out)]
            t0 = time.monotonic()
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            if proc.returncode != 0:
                tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
                raise RuntimeError(f"'testbed {args}' failed: {tail[0]}")
            self.log(f"ran testbed {args} in {time.monotonic() - t0:.1f} s")
            self.done[args] = out
        with open(self.done[args] / file, newline="") as f:
            return list(csv.DictReader(f))


def collect(paths: list[Path]) -> tuple[dict[str, str], list[Anchor]]:
    """Every run and anchor of the documents; a name defined twice with different commands is an error."""
    runs: dict[str, str] = {}
    anchors: list[Anchor] = []
    for p in paths:
        doc_runs, doc_anchors = parse(p.read_text(), str(p.relative_to(ROOT) if p.is_relative_to(ROOT) else p))
        for name, args in doc_runs.items():
            if runs.setdefault(name, args) != args:
                raise ValueError(f"{p}: run '{name}' is defined twice with different commands")
        anchors += [replace(a, path=str(p)) for a in doc_anchors]
    for a in anchors:
        if a.run not in runs:
            raise ValueError(f"{a.where}: no '<!-- check-run {a.run}: ... -->' defines run '{a.run}'")
    return runs, anchors


def check_docs(paths: list[Path], only: set[str] | None = None, log: Callable[[str], None] = print,
               fix: bool = False) -> tuple[list[str], int]:
    """The failures, one line each, and how many numbers were checked, over every anchored number (of the runs
    in `only` if given); a run whose input is missing here is logged and its numbers left unchecked. `fix`:
    rewrite each number that differs to what its run gives (the prose around it is the reader's to re-read)."""
    runs, anchors = collect(paths)
    failures: list[str] = []
    skipped: dict[str, str] = {}
    checked = 0
    fixes: dict[str, dict[int, dict[int, str]]] = {}
    with tempfile.TemporaryDirectory(prefix="check-docs-") as tmp:
        runner = Runner(Path(tmp), log)
        for a in anchors:
            if (only is not None and a.run not in only) or a.run in skipped:
                continue
            try:
                rows = runner.rows(runs[a.run], a.file)
                reason = check(a, rows)
                if reason and fix and not reason.startswith(f"{a.where}: {a.run}/"):
                    fixes.setdefault(a.path, {}).setdefault(a.line, {})[a.index] = regenerate(a, rows)
            except MissingInput as e:
                skipped[a.run] = str(e)
                log(f"skipped run '{a.run}' and its numbers: {e}")
                continue
            except (RuntimeError, OSError) as e:
                reason = f"{a.where}: {e}"
            checked += 1
            if reason:
                failures.append(reason)
    fix_docs(fixes)
    return failures, checked


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", type=Path, help="documents (default: README.md and docs/*.md)")
    ap.add_argument("--runs", help="check only these runs (comma-separated names)")
    ap.add_argument("--list", action="store_true", help="list the runs and how many numbers each checks")
    ap.add_argument("--fix", action="store_true",
                    help="rewrite every number that differs to what its run gives (then re-read the prose around it)")
    a = ap.parse_args()
    paths = [p.resolve() for p in a.files] or default_docs()
    try:
        runs, anchors = collect(paths)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.list:
        for name, args in runs.items():
            print(f"{name}: testbed {args} ({sum(x.run == name for x in anchors)} numbers)")
        return 0
    only = set(a.runs.split(",")) if a.runs else None
    if only and only - set(runs):
        print(f"error: --runs: no run named {', '.join(sorted(only - set(runs)))}; see --list", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    failures, n = check_docs(paths, only, fix=a.fix)
    for f in failures:
        print(f, file=sys.stderr)
    print(f"{n - len(failures)} of {n} numbers checked match ({time.monotonic() - t0:.0f} s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

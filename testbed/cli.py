"""The `testbed` command line. Every command turns bad input into one line naming the field."""

from __future__ import annotations

import functools
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from testbed.errors import NotYetError, SpecError

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
console = Console(width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True)


def friendly(fn):
    """Bad input -> one red line and exit 2, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*a, **k):
        try:
            return fn(*a, **k)
        except SpecError as e:
            err_console.print(f"[red]error:[/red] {e}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except NotYetError as e:
            err_console.print(f"[yellow]not yet:[/yellow] {e}", highlight=False, soft_wrap=True)
            raise typer.Exit(3) from None

    return wrapper


SetOpt = Annotated[list[str] | None, typer.Option("--set", help="Override a field: dotted.key=value")]
SweepOpt = Annotated[list[str] | None, typer.Option("--sweep", help="Sweep a field: dotted.key=v1,v2,...")]


def print_summary(rows: list[dict], title: str) -> None:
    t = Table(title=title)
    cols = ["run_id", "scheduler", "gpus", "tp", "pp", "dp", "wan_latency_ms", "tcp_connections", "iteration_s",
            "lower_bound_s", "tokens_per_s", "gpu_util", "bubble_frac"]
    for c in cols:
        t.add_column(c, justify="left" if c in ("run_id", "scheduler") else "right")
    for r in rows:
        t.add_row(*[f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]) for c in cols])
    console.print(t)


@app.command()
@friendly
def sim(
    experiment: Annotated[Path, typer.Argument(help="Experiment YAML")],
    out: Annotated[Path, typer.Option(help="Output folder")] = Path("results/sim"),
    set_: SetOpt = None,
    sweep: SweepOpt = None,
    jobs: Annotated[int | None, typer.Option(help="Processes for sweep points (default: CPU count)")] = None,
) -> None:
    """Simulate every scheduler of an experiment (and every sweep point); write summary/timeline/trace."""
    from testbed.sim.run import run_experiment, write_outputs
    from testbed.spec.load import load_experiment

    points = load_experiment(experiment, set_, sweep)
    t0 = time.perf_counter()
    with console.status(f"simulating {len(points)} point(s) x {len(points[0][0].schedulers)} scheduler(s)"):
        results = run_experiment(points, jobs)
    paths = write_outputs(out, results)
    print_summary([r.summary for r in results], f"{points[0][0].name}: simulated")
    console.print(f"wrote {', '.join(str(p) for p in paths)} in {time.perf_counter() - t0:.1f} s")


@app.command()
@friendly
def figures(
    folder: Annotated[Path, typer.Argument(help="A results folder with summary.csv (and timeline.csv)")],
    out: Annotated[Path | None, typer.Option(help="Where PNGs go (default: FOLDER/figures)")] = None,
) -> None:
    """Draw every figure the CSVs in FOLDER support."""
    from testbed.figures.draw import draw_all

    paths = draw_all(folder, out or folder / "figures")
    for p in paths:
        console.print(f"wrote {p}")
    if not paths:
        err_console.print(f"no figures: {folder} has no summary.csv with data")
        raise typer.Exit(1)


def main() -> None:  # pragma: no cover
    sys.exit(app())


@app.command()
@friendly
def plan(
    topology: Annotated[Path, typer.Argument(help="Topology YAML with the candidate DCs")],
    model: Annotated[str, typer.Option(help="Model from the zoo")] = "gpt3-175b",
    global_batch: Annotated[int, typer.Option(help="Sequences per iteration")] = 1728,
    microbatch: Annotated[int, typer.Option()] = 1,
    tp: Annotated[int, typer.Option()] = 8,
    pp: Annotated[int, typer.Option()] = 12,
    set_: SetOpt = None,
    top: Annotated[int, typer.Option(help="Candidates scored by the simulator")] = 8,
    out: Annotated[Path, typer.Option(help="CSV of every candidate")] = Path("results/plan/plan.csv"),
) -> None:
    """DC selection what-if: which DCs, in which order, with how many stages and replicas each."""
    from testbed.plan.select import select_dcs
    from testbed.results import write_csv
    from testbed.spec.experiment import Experiment
    from testbed.spec.load import _read_yaml, parse_value, set_dotted, split_assignment, validate

    data = {"topology": _read_yaml(topology), "schedulers": ["atlas"],
            "workload": {"model": model, "global_batch": global_batch, "microbatch": microbatch, "tp": tp, "pp": pp}}
    for s in set_ or []:
        k, v = split_assignment(s)
        set_dotted(data, k, parse_value(v))
    exp = validate(Experiment, data)
    with console.status("enumerating and simulating candidate DC chains"):
        cands = select_dcs(exp, top)
    cols = ["order", "stages", "dp", "gpus", "iteration_s", "lower_bound_s", "tokens_per_s", "tokens_per_s_per_gpu",
            "estimate_s", "status"]
    rows = [[" > ".join(c.order) if k == "order" else getattr(c, k) for k in cols] for c in cands]
    write_csv(out, cols, rows)
    for title, sel in (("best plans (simulated)", [r for r in rows if r[-1] in ("best", "simulated")][:5]),
                       ("alternatives rejected", [r for r in rows if r[-1].startswith("rejected")][:8])):
        t = Table(title=title)
        for c in cols:
            t.add_column(c.replace("tokens_per_s", "tok/s"), justify="left" if c in ("order", "stages", "status")
                         else "right")
        for r in sel:
            t.add_row(*[f"{v:,.3f}" if isinstance(v, float) else str(v) for v in r])
        console.print(t)
    console.print(f"{len(rows)} candidates; wrote {out}")

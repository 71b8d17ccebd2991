"""The `testbed` command line. Every command turns bad input into one line naming the field."""

from __future__ import annotations

import functools
import os
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from testbed.emu.health import DEFAULT_BUDGET
from testbed.emu.sh import EmuError
from testbed.errors import NotYetError, SpecError, one_line

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
# A terminal's own width; elsewhere $COLUMNS, else 160 (rich's 80 would split most tables in a log).
console = Console(width=None if sys.stdout.isatty() or os.environ.get("COLUMNS", "").isdigit() else 160)
err_console = Console(stderr=True)


def friendly(fn):
    """Bad input -> one red line and exit 2, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*a, **k):
        try:
            return fn(*a, **k)
        except SpecError as e:
            err_console.print(f"[red]error:[/red] {escape(str(e))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except NotYetError as e:
            err_console.print(f"[yellow]not yet:[/yellow] {escape(one_line(e))}", highlight=False, soft_wrap=True)
            raise typer.Exit(3) from None
        except EmuError as e:
            err_console.print(f"[red]emulation error:[/red] {escape(one_line(e))}", highlight=False, soft_wrap=True)
            raise typer.Exit(1) from None

    return wrapper


SetOpt = Annotated[list[str] | None, typer.Option("--set", help="Override a field: dotted.key=value")]
SweepOpt = Annotated[list[str] | None, typer.Option("--sweep", help="Sweep a field: dotted.key=v1,v2,...")]


ColumnsOpt = Annotated[str | None, typer.Option(
    "--columns", help="Columns to print, comma-separated (a swept key by its short name), or `all`")]


def print_table(path: Path, title: str, columns: list[str] | None = None) -> None:
    """A results CSV as the console shows every table: sweep-aware, fitted to the width in blocks."""
    from testbed.tables import read_view, rich_tables

    for t in rich_tables(read_view(path, columns, title), console.width):
        console.print(t)


def print_summary(folder: Path, title: str, columns: list[str] | None = None) -> None:
    print_table(folder / "summary.csv", title, columns)


def print_notes(notes: list[str]) -> None:
    for n in notes:
        console.print(f"[yellow]note:[/yellow] {n}", highlight=False, soft_wrap=True)


def point_text(point: dict) -> str:
    from testbed.analysis.sweep import short_names

    short = short_names(list(point))
    return ", ".join(f"{short[k]}={v}" for k, v in point.items()) or "the only point"


def print_knees(folder: Path) -> None:
    """BubbleTea's knee per scheduler (knee.csv): the highest offered rate meeting the SLO and slowdown criteria."""
    from testbed.bubbletea.knee import SLO_TARGET, SLOWDOWN_MAX

    if (folder / "knee.csv").exists():
        print_table(folder / "knee.csv", f"BubbleTea knee: highest offered rate with >= {SLO_TARGET:.0%} of requests "
                                         f"within the SLO and training slowed by < {SLOWDOWN_MAX:.0%}")


@app.command()
@friendly
def sim(
    experiment: Annotated[Path, typer.Argument(help="Experiment YAML")],
    out: Annotated[Path, typer.Option(help="Output folder")] = Path("results/sim"),
    set_: SetOpt = None,
    sweep: SweepOpt = None,
    jobs: Annotated[int | None, typer.Option(help="Processes for sweep points (default: CPU count)")] = None,
    engine: Annotated[str, typer.Option(help="process (a local pool) | ray (a local Ray, or --address)")]
    = "process",
    address: Annotated[str | None, typer.Option(help="An existing Ray cluster, e.g. 10.0.0.5:6379 (--engine ray)")]
    = None,
    calibration: Annotated[Path | None, typer.Option(help="Operator calibration (bench/gpu_profile.py writes one); "
                                                          "the same as --set costs.calibration=FILE")] = None,
) -> None:
    """Simulate every scheduler of an experiment (and every sweep point); write summary/timeline/trace."""
    from testbed.progress import Progress
    from testbed.results import write_spec
    from testbed.runs.simulated import ENGINES, run_experiment, write_outputs
    from testbed.spec.load import load_experiment, resolved_spec

    if engine not in ENGINES:
        raise SpecError("--engine", f"unknown engine {engine!r}", f"use one of {', '.join(ENGINES)}")
    if address and engine != "ray":
        raise SpecError("--address", "only Ray connects to a cluster", "add --engine ray")
    if calibration is not None:
        set_ = [*(set_ or []), f"costs.calibration={calibration.resolve()}"]
    points = load_experiment(experiment, set_, sweep)
    exp0 = points[0][0]
    what = f"{escape(exp0.name)}: simulating {len(points)} point(s) x {len(exp0.schedulers)} scheduler(s)"
    with Progress(console, len(points), what) as prog:
        def done(i: int, res: list) -> None:
            its = ", ".join(f"{r.summary['scheduler']} " + ("infeasible" if r.error else
                                                            f"{float(r.summary['iteration_s']):.4g} s") for r in res)
            prog.step(f"point {i} ({point_text(points[i][1])}) done: {its}")

        results = run_experiment(points, jobs, on_point=done, engine=engine, address=address)
        failed = [r for r in results if r.error is not None]
        if len(failed) == len(results):  # nothing could run: the spec itself is the problem
            raise failed[0].error  # type: ignore[misc]
        prog.line(f"writing {out}")
        paths = write_outputs(out, results)
        paths.append(write_spec(out, resolved_spec(experiment, set_, sweep), sys.argv[1:]))
    print_summary(out, f"{escape(exp0.name)}: simulated")
    print_knees(out)
    for r in failed:  # the sweep went on around them; summary.csv's status column says the same
        where = f" ({r.summary['sweep']})" if r.summary["sweep"] else ""
        console.print(f"[yellow]infeasible:[/yellow] {r.summary['run_id']}{escape(where)}: {escape(str(r.error))}",
                      highlight=False, soft_wrap=True)
    console.print(f"wrote {', '.join(str(p) for p in paths)} in {prog.elapsed:.1f} s")


@app.command()
@friendly
def figures(
    folder: Annotated[Path, typer.Argument(help="A results folder with summary.csv (and timeline.csv)")],
    out: Annotated[Path | None, typer.Option(help="Where PNGs go (default: FOLDER/figures)")] = None,
) -> None:
    """Draw every figure the CSVs in FOLDER support (and say why any other is not drawn)."""
    from testbed.figures.draw import draw_all

    notes: list[str] = []
    paths = draw_all(folder, out or folder / "figures", notes)
    for p in paths:
        console.print(f"wrote {p}")
    print_notes(notes)
    if not paths:
        err_console.print(f"no figures: {folder} has no summary.csv with data")
        raise typer.Exit(1)


RESULT_CSVS = ("summary.csv", "validation.csv", "links.csv", "plan.csv", "backends.csv")


@app.command()
@friendly
def show(
    folder: Annotated[Path, typer.Argument(help="A results folder (or one of its CSVs)")],
    columns: ColumnsOpt = None,
) -> None:
    """Print a results folder's tables as the run printed them: summary (swept keys, serving metrics for
    +bubbletea), then validation.csv, links.csv, plan.csv, backends.csv where present."""
    files = [folder] if folder.is_file() else [folder / f for f in RESULT_CSVS if (folder / f).exists()]
    if not files:
        raise SpecError(str(folder), f"no {', '.join(RESULT_CSVS)} here", "give a folder a run wrote (--out)")
    cols = [c.strip() for c in columns.split(",") if c.strip()] if columns else None
    for i, f in enumerate(files):
        print_table(f, f"{f.parent.name}/{f.name}", cols if i == 0 else None)


@app.command()
@friendly
def report(
    folders: Annotated[list[Path] | None, typer.Argument(help="Results folders")] = None,
    figures: Annotated[Path | None, typer.Option(help="Where PNGs go (default: FOLDER/figures); one FOLDER")] = None,
    index: Annotated[Path | None, typer.Option(help="Write DIR/index.html, a link to every report.html under DIR")
                     ] = None,
) -> None:
    """Write FOLDER/report.html: the spec, the tables, every figure embedded, Gantt charts, trace links."""
    from testbed.report import has_results, write_index, write_report

    folders = folders or []
    if not folders and index is None:
        raise SpecError("report", "nothing to do", "give a results FOLDER, or --index DIR")
    if figures is not None and len(folders) > 1:
        raise SpecError("--figures", "one figures folder for several results folders", "give one FOLDER")
    for folder in folders:
        if not has_results(folder):
            raise SpecError(str(folder), "no summary.csv, links.csv, plan.csv, backends.csv or scale.csv here",
                            "give a folder a run wrote (--out)")
        notes: list[str] = []
        console.print(f"wrote {write_report(folder, figures, notes)}")
        print_notes(notes)
    if index is not None:
        console.print(f"wrote {write_index(index)}")


@app.command()
@friendly
def plan(
    topology: Annotated[Path, typer.Argument(help="Topology YAML with the candidate DCs")],
    model: Annotated[str, typer.Option(help="Model from the zoo")] = "gpt3-175b",
    global_batch: Annotated[int, typer.Option(help="Sequences per iteration")] = 1728,
    tp: Annotated[list[int] | None, typer.Option(help="Only these tp (repeat the option); default: search")] = None,
    pp: Annotated[list[int] | None, typer.Option(help="Only these pp; default: search")] = None,
    microbatch: Annotated[list[int] | None, typer.Option(help="Only these microbatch sizes; default: 1, 2, 4, 8")
                          ] = None,
    sequence_parallel: Annotated[bool, typer.Option(help="Megatron sequence parallelism")] = True,
    scheduler: Annotated[str, typer.Option(help="The pipeline family's scheduler: atlas, or pp-wan+greedy (+mtcp, "
                                                "...)")] = "atlas",
    families: Annotated[str | None, typer.Option(help="Families compared, comma-separated: pipeline, dp-wan, "
                                                      "diloco, streaming-diloco, hybrid (default: all)")] = None,
    set_: SetOpt = None,
    sweep: SweepOpt = None,
    top: Annotated[int, typer.Option(help="Layouts per family and DC set scored by the simulator")] = 2,
    jobs: Annotated[int | None, typer.Option(help="Processes for the simulations (default: CPU count)")] = None,
    out: Annotated[Path, typer.Option(help="Output folder (plan.csv, answer.html, answer.png); a path ending in "
                                           ".csv names plan.csv itself")] = Path("results/plan"),
) -> None:
    """Which family, which DCs (one site or several), in which order, with which tp, pp, dp and microbatch size."""
    from testbed.answer import write_answer
    from testbed.results import write_csv
    from testbed.runs.families import parse_families
    from testbed.runs.plan_sweep import search_points
    from testbed.runs.select import PLAN_HEADER, plan_rows
    from testbed.spec.experiment import Experiment
    from testbed.spec.load import _read_yaml, apply_set, expand_sweep, resolve_traces, validate

    topo_data = _read_yaml(topology)
    resolve_traces(topo_data, topology.parent)
    data = {"topology": topo_data, "schedulers": [scheduler],
            "workload": {"model": model, "global_batch": global_batch, "sequence_parallel": sequence_parallel}}
    for s in set_ or []:
        apply_set(data, s)
    fams = parse_families(families)
    points = []
    for d, point in expand_sweep(data, sweep):
        try:
            points.append((validate(Experiment, d), point))
        except SpecError as e:
            raise SpecError(e.field.replace("schedulers", "--scheduler"), e.problem, e.fix) from None
    for exp, _ in points:
        check_pins(exp, tp, pp, microbatch)
    csv_path, folder = (out, out.parent) if out.suffix == ".csv" else (out / "plan.csv", out)

    def on_point(i: int, res) -> None:
        where = ", ".join(f"{k}={v}" for k, v in points[i][1].items())
        if len(points) > 1:
            console.print(f"[bold]point {i + 1} of {len(points)}: {where}[/bold]")
        print_plan(res, points[i][0])

    with console.status("searching families, DC sets, tp, pp, dp, microbatch; simulating the best of each"):
        found = search_points(points, scheduler, top, tp, pp, microbatch, jobs, fams, on_point)
    swept = len(points) > 1 or bool(points[0][1])
    header = (("sweep",) if swept else ()) + PLAN_HEADER
    rows = [((";".join(f"{k}={v}" for k, v in point.items()),) if swept else ()) + tuple(r)
            for point, res in found for r in plan_rows(res)]
    write_csv(csv_path, header, rows)
    console.print(f"wrote {csv_path} (every layout; columns in docs/planner.md)")
    note = f"{model}, {global_batch} sequences per iteration, candidate DCs of {topology}"
    console.print(f"wrote {write_answer(csv_path, folder, note)}")


def print_plan(res, exp) -> None:
    """The best row of every (family, DC set), the best plan and the command that reproduces it."""
    best = res.best
    if best is None:
        why = next((s.problem for s in res.sets if s.problem), "the topology has no chain of linked DCs")
        raise SpecError("workload", f"no layout fits on any DC set ({res.layouts:,} searched): {why}",
                        "pin other --tp/--pp/--microbatch, --set workload.recompute=full, or add GPUs")
    from testbed.runs.select import order_text, per_dc

    t = Table(title="Which family, one site or several? The best layout of every family and DC set (simulated)")
    for c in ("family", "DCs", "order", "tp", "pp", "dp", "mb", "stages / replicas", "GPUs", "iteration_s", "tok/s",
              "efficiency", "effective tok/s", "vs best"):
        t.add_column(c, justify="left" if c in ("family", "DCs", "order", "stages / replicas") else "right")
    for sr in res.sets:
        c = sr.best
        if c is None:
            t.add_row(sr.family, sr.dcs.replace("|", " + "), f"[red]nothing fits: {sr.problem}[/red]", *[""] * 11)
            continue
        lay = c.layout
        stages, replicas = per_dc(c)
        ratio = (best.effective_tokens_per_s or 0) / (c.effective_tokens_per_s or 1)
        t.add_row(c.family, sr.dcs.replace("|", " + "), order_text(lay), str(lay.tp), str(lay.pp),
                  str(lay.dp), str(lay.microbatch), replicas or stages, f"{c.gpus:,}", f"{c.iteration_s:.3f}",
                  f"{c.tokens_per_s:,.0f}", f"{c.token_efficiency:.2f}", f"{c.effective_tokens_per_s:,.0f}",
                  "best" if c is best else f"{ratio:.2f}x slower")
    console.print(t)
    console.print(f"searched {res.layouts:,} layouts ({res.fit:,} fit in memory) over {len(res.sets)} family x DC "
                  f"sets, simulated {res.simulated}; {res.estimate_wall_s:.1f} s estimating; "
                  f"planner wall time {res.wall_s:.1f} s")
    lay = best.layout
    console.print(f"[bold]best plan[/bold]: the {best.family} family ({best.scheduler}), {order_text(lay)}, "
                  f"tp {lay.tp}, pp {lay.pp}, dp {lay.dp}, microbatch {lay.microbatch}: {best.iteration_s:.3f} s "
                  f"per iteration (lower bound {best.lower_bound_s:.3f} s), {best.tokens_per_s:,.0f} tokens/s x "
                  f"token efficiency {best.token_efficiency:.2f} = {best.effective_tokens_per_s:,.0f} effective, "
                  f"{best.tokens_per_s_per_gpu:,.1f} per GPU, {best.gpus:,} GPUs, {best.idle_gpus:,} idle",
                  highlight=False)
    console.print(f"simulate it: {sim_command(best, exp)}", soft_wrap=True, highlight=False, markup=False)


def sim_command(c, exp) -> str:
    """A `testbed sim` command line that reproduces a planner candidate."""
    from testbed.runs.select import group_spec

    lay = c.layout
    if lay.groups:
        pin, pins = "groups", ", ".join(f"{g}: [{', '.join(d)}]" for g, d in group_spec(lay).items())
    else:
        pins = ", ".join(f"{d}: {n}" for d, n in zip(lay.order, lay.counts, strict=True))
        pin = "stages_per_dc" if c.family == "pipeline" else "replicas_per_dc"
    return (f"testbed sim EXP.yaml --set 'schedulers=[{c.scheduler}]' --set workload.tp={lay.tp} "
            f"--set workload.pp={lay.pp} --set workload.dp={lay.dp} --set workload.microbatch={lay.microbatch} "
            f"--set workload.sequence_parallel={str(exp.workload.sequence_parallel).lower()} "
            + (f"--set workload.virtual_stages={exp.workload.virtual_stages} " if exp.workload.virtual_stages > 1
               else "")
            + f"--set 'workload.{pin}={{{pins}}}'")


@app.command()
@friendly
def claims(
    cards: Annotated[list[Path] | None, typer.Argument(help="Claim cards (default: experiments/claims/*.yaml)")] = None,
    out: Annotated[Path, typer.Option(help="Output folder")] = Path("results/claims"),
    set_: SetOpt = None,
    jobs: Annotated[int | None, typer.Option(help="Processes for points (default: CPU count)")] = None,
) -> None:
    """Check every published claim we can express: claims.csv (published, ours, verdict) and claims.png."""
    from testbed.claims import run_claims

    paths = cards or sorted(Path("experiments/claims").glob("*.yaml"))
    if not paths:
        raise SpecError("cards", "no claim cards given and none in experiments/claims", "name card files")
    t0 = time.perf_counter()
    written = run_claims(paths, out, jobs, progress=lambda msg: console.print(msg, highlight=False),
                         extra=set_)
    console.print(f"wrote {', '.join(map(str, written))} in {time.perf_counter() - t0:.0f} s")


def check_pins(exp, tps: list[int] | None, pps: list[int] | None, microbatches: list[int] | None) -> None:
    """`testbed plan`'s --tp/--pp/--microbatch, checked against the model and batch before any search."""
    from testbed.costs.models import resolve_model

    model = resolve_model(exp.workload.model, exp.workload.seq_len)
    for opt, values, ok, fix in (
            ("--tp", tps, lambda t: t >= 1 and model.heads % t == 0 and model.kv_heads % t == 0,
             f"use a divisor of the model's {model.heads} heads and {model.kv_heads} key/value heads"),
            ("--pp", pps, lambda p: 1 <= p <= model.layers, f"use 1 to {model.layers} (the model's layers)"),
            ("--microbatch", microbatches, lambda b: b >= 1 and exp.workload.global_batch % b == 0,
             f"use a divisor of --global-batch {exp.workload.global_batch}")):
        for v in values or []:
            if not ok(v):
                raise SpecError(opt, f"{v} does not fit {model.name}", fix)


def _raise_interrupt(*_: object) -> None:
    raise KeyboardInterrupt


topology_app = typer.Typer(no_args_is_help=True, help="Emulated WAN topologies: up, check, status, exec, down.")
app.add_typer(topology_app, name="topology")
PrefixOpt = Annotated[str, typer.Option(help="Name prefix of everything this topology creates (gdtb<id>)")]
ClusterOpt = Annotated[Path | None, typer.Option(help="cluster.yaml: spread the emulation over a Ray cluster's "
                                                     "machines (docs/cluster.md)")]


def _run_check(emu, streams: int, seconds: float, out: Path) -> None:
    from testbed.emu.check import LINKS_HEADER, below_model, check_links
    from testbed.results import write_csv

    with console.status("measuring every WAN pair (ping; iperf3 and the workers' transport, 1 and n streams)"):
        rows = check_links(emu, streams=streams, seconds=seconds)
    write_csv(out, LINKS_HEADER, ([r[c] for c in LINKS_HEADER] for r in rows))
    print_table(out, f"{emu.prefix}: configured vs measured")
    for line in below_model(rows):
        console.print(f"[yellow]warning:[/yellow] {escape(line)}")
    console.print(f"wrote {out}")


@topology_app.command("up")
@friendly
def topology_up(
    topology: Annotated[Path, typer.Argument(help="Topology YAML")],
    backend: Annotated[str, typer.Option(help="netns | docker | mininet | containernet")] = "netns",
    scale: Annotated[float, typer.Option(help="Divide link rates and TCP windows by K (latency stays real)")] = 0.0,
    prefix: PrefixOpt = "gdtb0",
    delay: Annotated[str, typer.Option(help="auto | netem | nfqueue | none")] = "auto",
    set_: SetOpt = None,
    check: Annotated[bool, typer.Option(help="Measure every WAN pair once it is up")] = False,
    out: Annotated[Path, typer.Option(help="links.csv from --check")] = Path("results/topology/links.csv"),
    cluster: ClusterOpt = None,
    hold: Annotated[bool, typer.Option(help="With --cluster: keep the network up until Ctrl-C (--no-hold: tear it "
                                            "down after --check)")] = True,
) -> None:
    """Build the emulated network; it stays up (netns and docker backends) until `testbed topology down`."""
    import signal

    from testbed.emu.backends import BACKENDS
    from testbed.emu.build import host_names, up
    from testbed.emu.names import check_prefix
    from testbed.emu.scale import auto_scale, check_scale
    from testbed.spec.load import load_topology

    check_prefix(prefix)
    if backend not in BACKENDS:
        raise SpecError("--backend", f"unknown backend {backend!r}", f"use one of {', '.join(BACKENDS)}")
    if delay not in ("auto", "netem", "nfqueue", "none"):
        raise SpecError("--delay", f"unknown delay method {delay!r}", "use auto, netem, nfqueue or none")
    signal.signal(signal.SIGTERM, _raise_interrupt)
    topo = load_topology(topology, set_)
    k = scale or auto_scale(topo)
    check_scale(topo, k, field="--scale")
    if cluster is not None:
        if backend != "netns":
            raise NotYetError(f"--cluster with --backend {backend}: not yet; a cluster builds netns on each machine")
        return _cluster_up(topo, cluster, prefix, k, delay, check, out, hold)
    t0 = time.perf_counter()
    with console.status(f"building {escape(topo.name)} ({backend}, scale {k:g})"):
        emu = up(topo, backend=backend, prefix=prefix, scale=k, delay=delay)
    console.print(f"[green]{escape(topo.name)} is up[/green] in {time.perf_counter() - t0:.1f} s: prefix {prefix}, "
                  f"backend {backend}, delay by [bold]{emu.delay}[/bold], scale k={k:g}; "
                  f"hosts: {', '.join(host_names(emu))}")
    for n in emu.notes:
        console.print(f"[yellow]note:[/yellow] {n}")
    try:
        if check:
            _run_check(emu, 8, 3.0, out)
        if not emu.backend.persistent:
            console.print("this backend lives in this process: press Ctrl-C to tear it down")
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        if not emu.backend.persistent:
            from testbed.emu.build import down

            down(emu)


def _cluster_up(topo, cluster_path: Path, prefix: str, k: float, delay: str, check: bool, out: Path,
                hold: bool) -> None:
    """`topology up --cluster`: each machine builds its part; the network lives while this command runs."""
    from testbed.cluster import driver
    from testbed.spec.load import load_cluster

    spec = load_cluster(cluster_path)
    t0 = time.perf_counter()
    with console.status(f"building {escape(topo.name)} on the cluster (scale {k:g})"):
        emu = driver.up(topo, spec, prefix, k, delay)
    plan = emu.cluster_plan
    where = ", ".join(f"{dc} on {m}" for dc, m in plan.dc_machine.items())
    console.print(f"[green]{escape(topo.name)} is up[/green] on {len(plan.parts)} machine(s) in "
                  f"{time.perf_counter() - t0:.1f} s: prefix {prefix}, delay by [bold]{emu.delay}[/bold], scale "
                  f"k={k:g}; {where}")
    failed: EmuError | None = None
    try:
        if check:
            _run_check(emu, 8, 3.0, out)
        if hold:
            console.print("the cluster's network lives in this process: press Ctrl-C to tear it down")
            while True:
                time.sleep(5)
                emu.backend.agents.check_alive()
    except KeyboardInterrupt:
        pass
    except EmuError as e:  # a machine died or a measurement failed: every other machine still tears down
        failed = e
    finally:
        errors = driver.down(emu)
        driver.shutdown()
    if failed is not None or errors:
        first = str(failed) if failed is not None else errors.pop(0)
        rest = [e for e in errors if e.split(" (")[0] not in first]  # one line per machine
        raise EmuError(first + "".join(f"; {e}" for e in rest) + "; the other machines tore their part down")
    console.print(f"torn down on {len(plan.parts)} machine(s)")


@topology_app.command("check")
@friendly
def topology_check(
    prefix: PrefixOpt = "gdtb0",
    streams: Annotated[int, typer.Option(help="Parallel TCP streams for the n-stream measurement")] = 8,
    seconds: Annotated[float, typer.Option(help="Seconds per iperf3 run")] = 3.0,
    out: Annotated[Path, typer.Option(help="Where links.csv goes")] = Path("results/topology/links.csv"),
) -> None:
    """Measure RTT and TCP throughput of every WAN pair; print configured vs measured; write links.csv."""
    from testbed.emu.attach import attach

    _run_check(attach(prefix), streams, seconds, out)


@topology_app.command("status")
@friendly
def topology_status(prefix: PrefixOpt = "gdtb0") -> None:
    """What is up: namespaces, the delay-line processes and their counters."""
    import json

    from testbed.emu import state
    from testbed.emu.attach import attach
    from testbed.emu.clean import our_namespaces

    emu = attach(prefix)
    alive = set(our_namespaces(prefix))
    t = Table(title=f"{prefix}: {escape(emu.topo.name)} ({emu.backend.name}, delay {emu.delay}, scale {emu.scale:g})")
    for c in ("node", "role", "up", "delay line"):
        t.add_column(c)
    for n in emu.backend.nodes.values():
        dl = ""
        f = state.STATE_DIR / prefix / f"{n.name}.delay.json"
        if f.exists():
            st = json.loads(f.read_text())
            dl = f"pid {st['pid']}: " + ", ".join(f"q{q}: {v['packets']} pkts, lag {v['lag_avg_us']:.0f} us"
                                                   for q, v in st["queues"].items())
        t.add_row(n.name, n.role, "yes" if n.ns in alive else "[red]no[/red]", dl)
    console.print(t)


@topology_app.command("exec", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@friendly
def topology_exec(
    ctx: typer.Context,
    host: Annotated[str, typer.Argument(help="An emulated host, e.g. useast-h0")],
    prefix: PrefixOpt = "gdtb0",
) -> None:
    """Run a command (default: a shell) inside an emulated host: `testbed topology exec useast-h0 -- ping ...`."""
    import os

    from testbed.emu.attach import attach

    emu = attach(prefix)
    argv = emu.backend.argv(emu.host_node(host), ctx.args or [os.environ.get("SHELL", "/bin/bash")])
    os.execvp(argv[0], argv)


@topology_app.command("capture")
@friendly
def topology_capture(
    prefix: PrefixOpt = "gdtb0",
    seconds: Annotated[float, typer.Option(help="How long to capture (bounded; Ctrl-C stops it early)")] = 10.0,
    max_packets: Annotated[int, typer.Option(help="Stop after this many packets per WAN link")] = 2_000_000,
    out: Annotated[Path, typer.Option(help="Where flows.csv goes")] = Path("results/capture/flows.csv"),
) -> None:
    """Capture packet headers on every WAN link of a topology that is up; write flows.csv (bytes per flow
    per millisecond, each address mapped to its DC and host)."""
    import signal

    from testbed.analysis.flows import FLOWS_HEADER
    from testbed.emu.attach import attach
    from testbed.emu.capture import Capture, host_flows
    from testbed.results import write_csv

    emu = attach(prefix)
    signal.signal(signal.SIGTERM, _raise_interrupt)
    cap = Capture(emu, seconds=seconds + 5, max_packets=max_packets).start()
    try:
        with console.status(f"capturing on {len(emu.addr.wans)} WAN link(s) for {seconds:g} s (Ctrl-C stops)"):
            time.sleep(seconds)
    except KeyboardInterrupt:
        pass
    res = cap.stop()
    rows = host_flows(emu, res)
    write_csv(out, FLOWS_HEADER, rows)
    console.print(res.summary())
    console.print(f"wrote {out} ({len(rows)} rows)")


ForceOpt = Annotated[bool, typer.Option(help="Also remove a prefix another live process is using")]


@topology_app.command("down")
@friendly
def topology_down(prefix: PrefixOpt = "gdtb0", force: ForceOpt = False) -> None:
    """Tear the topology down: processes, namespaces, links, rules, state (refused while another live
    process owns the prefix, e.g. a running experiment, unless --force)."""
    from testbed.emu.clean import clean
    from testbed.emu.names import check_prefix

    removed = clean(check_prefix(prefix), force=force)
    console.print(f"removed {len(removed)} item(s)" if removed else f"nothing of {prefix} was up")


@app.command("clean")
@friendly
def clean_cmd(
    prefix: Annotated[str | None, typer.Option(help="Only this prefix (default: every gdtb* prefix)")] = None,
    images: Annotated[bool, typer.Option(help="Also remove the testbed's Docker images (kept otherwise)")] = False,
    force: ForceOpt = False,
    cluster: ClusterOpt = None,
) -> None:
    """Remove leftovers of any earlier run (like `mn -c`, but only what carries the testbed's prefix).
    A prefix whose owner is another live process (a running experiment) is kept unless --force."""
    from testbed.emu.clean import clean
    from testbed.emu.kernel import require_root
    from testbed.emu.names import check_prefix

    if cluster is not None:
        return _cluster_clean(cluster, check_prefix(prefix) if prefix else None, force, images)
    require_root()
    kept: list[str] = []
    removed = clean(check_prefix(prefix) if prefix else None, force=force, kept=kept)
    for k in kept:
        console.print(f"[yellow]kept[/yellow] {k} (--force removes it)", highlight=False)
    if images:
        from testbed.emu.containers import remove_images

        removed += remove_images()
    for r in removed:
        console.print(f"removed {r}")
    console.print("clean" if not removed else f"removed {len(removed)} item(s)")


def _cluster_clean(cluster_path: Path, prefix: str | None, force: bool, images: bool) -> None:
    """`testbed clean --cluster`: the same clean on every machine of the cluster."""
    from testbed.cluster import driver
    from testbed.spec.load import load_cluster

    if images:
        raise NotYetError("--images with --cluster: not yet; remove images on each machine")
    try:
        warnings: list[str] = []
        removed, errors = driver.clean(load_cluster(cluster_path), prefix, force, warnings)
    finally:
        driver.shutdown()
    for w in warnings:
        _warn(w)
    for machine, items in removed.items():
        for r in items:
            console.print(f"{machine}: removed {r}", highlight=False)
    total = sum(len(v) for v in removed.values())
    console.print(f"clean on {len(removed)} machine(s)" if not total else f"removed {total} item(s) on "
                  f"{len(removed)} machine(s)")
    if errors:
        raise EmuError(f"not cleaned: {errors[0]}" + (f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""))


def _warn(text: str) -> None:
    err_console.print(f"[yellow]warning:[/yellow] {escape(text)}", highlight=False, soft_wrap=True)


def _training_run(points: list, out: Path, check: bool, spec: dict, capture: bool = False, strict: bool = False,
                  timing_budget: float = DEFAULT_BUDGET, cluster=None) -> None:
    from testbed.progress import Progress
    from testbed.results import write_spec
    from testbed.runs.emulated import run_experiment, write_experiment

    exp0 = points[0][0]
    n_s, n_i = len(exp0.schedulers), exp0.iterations
    total = len(points) * n_s * n_i
    what = f"{escape(exp0.name)} on prefix {exp0.emulation.prefix}: emulated iterations"
    with Progress(console, total, what) as prog:
        def step() -> None:  # points, then schedulers, then iterations: the step count says which one ended
            k = prog.done
            p, sc, it = k // (n_s * n_i), k // n_i % n_s, k % n_i
            where = f"point {p} ({point_text(points[p][1])}), {exp0.schedulers[sc]}"
            prog.step(f"{where}: iteration {it + 1}/{n_i} done")

        try:
            run = run_experiment(points, check, capture, step, prog.line, timing_budget, cluster)
        finally:
            if cluster is not None:
                from testbed.cluster.driver import shutdown

                shutdown()
    paths = [*write_experiment(out, run), write_spec(out, spec, sys.argv[1:])]
    print_summary(out, f"{escape(exp0.name)}: emulated and simulated")
    print_knees(out)
    if run.validation:
        print_table(out / "validation.csv", "simulator vs emulator (rel_error: (sim - emu) / emu)")
    if run.links:
        print_table(out / "links.csv", "the emulated WAN: configured vs measured")
    for run_id, _sched, k, loss in run.losses:
        console.print(f"{run_id}: iteration {k} loss {loss:.4f}")
    console.print(f"wrote {', '.join(str(p) for p in paths)}")
    degraded = [r.summary for r in run.results if r.summary.get("degraded")]
    for r in degraded:
        _warn(f"{r['run_id']} degraded: {r['degraded']}")
    if strict and degraded:
        raise EmuError(f"{len(degraded)} run(s) degraded (--strict), first {degraded[0]['run_id']}: "
                       f"{degraded[0]['degraded']}")


def _cluster_training_run(points: list, experiment: Path, sets: list[str], sweep, out: Path, check: bool,
                          strict: bool, timing_budget: float, cluster_path: Path, capture: bool = False) -> None:
    from testbed.spec.load import load_cluster, resolved_spec

    if points[0][0].multitcp is not None or len(points) > 1:
        raise NotYetError("on a cluster: one training point for now (no multitcp experiment, no sweep)")
    held = points[0][0].emulation.prefix or "gdtb0"
    points = [(exp.model_copy(update={"emulation": exp.emulation.model_copy(update={"prefix": held})}), pt)
              for exp, pt in points]
    spec = resolved_spec(experiment, [*sets, f"emulation.prefix={held}"], sweep)
    _training_run(points, out, check, spec, capture, strict, timing_budget, load_cluster(cluster_path))


experiment_app = typer.Typer(no_args_is_help=True, help="Experiments on the emulated WAN (and the simulator).")
app.add_typer(experiment_app, name="experiment")


@experiment_app.command("run")
@friendly
def experiment_run(
    experiment: Annotated[Path, typer.Argument(help="Experiment YAML")],
    out: Annotated[Path, typer.Option(help="Output folder")] = Path("results/experiment"),
    backend: Annotated[str | None, typer.Option(help="netns | docker | mininet | containernet")] = None,
    prefix: Annotated[str | None, typer.Option(help="Emulation prefix gdtb<id> (default: the experiment's "
                                                    "emulation.prefix, else the first free gdtb<N>)")] = None,
    check: Annotated[bool, typer.Option(help="Measure every WAN pair before training (links.csv)")] = False,
    set_: SetOpt = None,
    sweep: SweepOpt = None,
    capture: Annotated[bool, typer.Option(help="Capture WAN packet headers for the whole run into flows.csv")]
    = False,
    strict: Annotated[bool, typer.Option(help="Fail (exit 1) if a run is degraded, e.g. over its timing budget; "
                                              "the CSVs are still written")] = False,
    timing_budget: Annotated[float, typer.Option(help="The iteration-time error (share) a run's timing health may "
                                                      "cause before it is marked degraded (docs/reliability.md)")]
    = DEFAULT_BUDGET,
    probe: Annotated[bool, typer.Option(help="Measure the machine's headroom first (about a second) and size k to "
                                             "it (an explicit emulation.scale is kept)")] = True,
    cluster: ClusterOpt = None,
) -> None:
    """Bring the topology up, run the experiment on it, tear it down (also on error and Ctrl-C). The prefix
    is held for the whole run: no other run can take it, and `testbed clean` leaves it alone."""
    import signal

    from testbed.emu import owner
    from testbed.emu.kernel import require_root
    from testbed.emu.names import check_prefix
    from testbed.results import write_spec
    from testbed.spec.load import load_experiment, resolved_spec

    sets = list(set_ or []) + ([f"emulation.backend={backend}"] if backend else [])
    if prefix is not None:
        sets.append(f"emulation.prefix={check_prefix(prefix)}")
    if not 0 <= timing_budget < 1:
        raise SpecError("--timing-budget", f"{timing_budget:g} is not a share of the iteration time",
                        "use e.g. 0.05 for 5 %")
    points = load_experiment(experiment, sets, sweep)  # every point validated before anything is built
    if points[0][0].multitcp is None:
        from testbed.runs.emulated import preflight, size_to_machine

        preflight(points)  # every point planned and its scale checked, before anything is built
        if probe:  # k and the workers sized to this machine's headroom (an explicit k is kept, with a warning)
            auto = any(not exp.emulation.scale for exp, _ in points)
            points, lines = size_to_machine(points, timing_budget)
            for ln in lines:
                (console.print if ln.startswith(("headroom", "k =")) else _warn)(ln)
            if auto:
                preflight(points)  # the k the probe chose, checked as a user's would be
    else:
        from testbed.emu.scale import auto_scale, check_scale

        for exp, _ in points:
            check_scale(exp.topology, exp.emulation.scale or auto_scale(exp.topology))
    require_root()
    signal.signal(signal.SIGTERM, _raise_interrupt)  # `kill` tears down like Ctrl-C does
    asked = points[0][0].emulation.prefix
    if cluster is not None:  # each machine's agent holds the prefix there (docs/cluster.md)
        return _cluster_training_run(points, experiment, sets, sweep, out, check, strict, timing_budget, cluster,
                                     capture)  # refused there: a capture on a cluster is not yet
    with owner.owned(check_prefix(asked) if asked else None) as held:
        if not asked:
            console.print(f"emulation prefix: {held} (free; --prefix picks one)")
        sets.append(f"emulation.prefix={held}")
        points = [(exp.model_copy(update={"emulation": exp.emulation.model_copy(update={"prefix": held})}), pt)
                  for exp, pt in points]
        spec = resolved_spec(experiment, sets, sweep)  # written next to the results, once they exist
        exp0 = points[0][0]
        if exp0.multitcp is None:
            return _training_run(points, out, check, spec, capture, strict, timing_budget)
        from testbed.progress import Progress
        from testbed.runs.multitcp import measurements, run_experiment, write_experiment

        with Progress(console, len(points) * measurements(exp0), f"{escape(exp0.name)} on prefix {held}") as prog:
            rows = run_experiment(points, lambda d: prog.step(f"measuring {d}"))
    summary = write_experiment(out, rows)
    spec_path = write_spec(out, spec, sys.argv[1:])
    print_summary(out, f"{escape(exp0.name)}: throughput (Mbit/s) vs TCP connections, emulated and modelled")
    console.print(f"wrote {summary}, {spec_path}")


@app.command("launch", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@friendly
def launch_cmd(
    ctx: typer.Context,
    spec: Annotated[Path, typer.Argument(help="Topology or experiment YAML")],
    backend: Annotated[str | None, typer.Option(help="netns | docker | containernet (default: the spec's, or netns)")]
    = None,
    nproc_per_host: Annotated[int, typer.Option(help="Ranks per emulated host")] = 1,
    prefix: Annotated[str | None, typer.Option(help="Prefix of the WAN to use or build (default: spec's or gdtb0)")]
    = None,
    scale: Annotated[str | None, typer.Option(help="auto (default: the smallest k this machine carries, probed) or K: "
                                               "divide link rates and windows by K when building the WAN")]
    = None,
    master_port: Annotated[int, typer.Option(help="MASTER_PORT on the first host")] = 29500,
    sharing: Annotated[str, typer.Option(help="fair | temporal: replicas take turns on the WAN (fixed order)")]
    = "fair",
    capture: Annotated[bool, typer.Option(help="Capture WAN packet headers into flows.csv")] = False,
    capture_seconds: Annotated[float, typer.Option(help="Upper bound of the capture")] = 600.0,
    check: Annotated[bool, typer.Option(help="Capture, and compare each WAN transfer with the simulator's model "
                                             "(check.csv)")] = False,
    out: Annotated[Path, typer.Option(help="Folder for the job (TESTBED_OUT), ranks.csv, launch.log, flows.csv")]
    = Path("results/launch"),
    set_: SetOpt = None,
    cluster: ClusterOpt = None,
) -> None:
    """Run your torch.distributed script on every emulated host with torchrun's environment:
    `testbed launch topologies/3dc.yaml -- python train.py ARGS`."""
    import os
    import signal

    from testbed.emu.kernel import require_root
    from testbed.launch.wan import bring_up, connections, load_spec, parse_scale

    if not ctx.args:
        raise SpecError("command", "nothing to launch", "add the command after --, e.g. -- python train.py")
    if sharing not in ("fair", "temporal"):
        raise SpecError("--sharing", f"{sharing!r} is not a sharing mode", "use fair or temporal")
    if nproc_per_host < 1:
        raise SpecError("--nproc-per-host", f"{nproc_per_host} is not a process count", "use 1 or more")
    sp = load_spec(spec, set_, backend, prefix, parse_scale(scale))
    if cluster is not None:
        from testbed.launch.wan import refuse_on_cluster

        refuse_on_cluster(sp.backend, capture, check, sharing)
    require_root()
    signal.signal(signal.SIGTERM, _raise_interrupt)
    cwd, out = os.getcwd(), out.resolve()
    out.mkdir(parents=True, exist_ok=True)

    def say(line: str) -> None:
        console.print(line, highlight=False)

    with console.status(f"bringing up {escape(sp.topology.name)} ({sp.backend}, prefix {sp.prefix}"
                        f"{', on the cluster' if cluster else ''})"):
        if cluster is not None:
            from testbed.cluster.launch import bring_up_cluster

            emu, built = bring_up_cluster(sp, nproc_per_host, say, cluster)
        else:
            emu, built = bring_up(sp, [cwd, str(out)], nproc_per_host, say)
    if cluster is not None:
        where = ", ".join(f"{dc} on {m}" for dc, m in emu.cluster_plan.dc_machine.items())
        say(f"up on {len(emu.cluster_plan.parts)} machine(s): {where}")
    code = 0
    try:
        code = _launch(emu, built, ctx.args, nproc_per_host, master_port, connections(emu, sp.max_connections), sharing,
                       capture or check, capture_seconds, out, cwd, check,
                       machine_k=emu.scale if built and not sp.scale else None, on_cluster=cluster is not None)
    except KeyboardInterrupt:
        err_console.print("interrupted: every rank stopped", highlight=False)
        code = 130
    finally:
        if built:
            _launch_down(emu, cluster is not None)
    raise typer.Exit(code)


def _launch_down(emu, on_cluster: bool) -> None:
    """Tear the launch's WAN down; on a cluster every machine's part, each machine that fails named."""
    if not on_cluster:
        from testbed.emu.build import down

        return down(emu)
    from testbed.cluster import driver

    try:
        errors = driver.down(emu)
    finally:
        driver.shutdown()
    if errors:
        raise EmuError("; ".join(errors) + "; the other machines tore their part down")


def _announce_scale(emu, conns: int, out: Path, machine_k: float | None) -> tuple[list, Path]:
    """Print, before the job starts, what k does to each WAN link; write the link table (TESTBED_LINKS)."""
    import json

    from testbed.launch.dilation import SCALE_HEADER, emulation_lans, emulation_scales, floor_warnings, links_table
    from testbed.launch.dilation import describe as describe_link
    from testbed.results import write_csv

    scales = emulation_scales(emu, conns)
    console.print(f"WAN at k={emu.scale:,.6g}: rates and windows divided by k, latencies as the spec's. A job that "
                  f"divides its message sizes by k (TESTBED_SCALE) gets real-world transfer times; one that sends "
                  f"its real bytes gets them stretched:", highlight=False)
    for ls in scales:
        console.print("  " + describe_link(ls), highlight=False)
    for line in floor_warnings(scales, machine_k):
        err_console.print(f"[yellow]window floor:[/yellow] {line}", highlight=False, soft_wrap=True)
    links_path = out / "links.json"
    links_path.write_text(json.dumps(links_table(scales, emu.scale, emulation_lans(emu)), indent=1) + "\n")
    write_csv(out / "scale.csv", SCALE_HEADER, [tuple(ls.row()[c] for c in SCALE_HEADER) for ls in scales])
    return scales, links_path


def _launch(emu, built: bool, argv: list[str], nproc: int, master_port: int, conns: int, sharing: str, capture: bool,
            capture_s: float, out: Path, cwd: str, check: bool = False, machine_k: float | None = None,
            on_cluster: bool = False) -> int:
    from testbed.launch import sharing as atlas
    from testbed.launch import windows
    from testbed.launch.ranks import nccl_striping
    from testbed.launch.run import run_job

    if on_cluster:
        from testbed.cluster.launch import run_cluster_job as run_job

    nt, ns = nccl_striping(conns)
    console.print(f"{escape(emu.topo.name)} on {emu.backend.name} (prefix {emu.prefix}, k={emu.scale:g}"
                  f"{', built for this launch' if built else ', already up'}): {len(emu.addr.hosts) * nproc} ranks, "
                  f"{sharing} sharing; NCCL sockets {nt} x {ns} (plan: {conns} connection(s) per transfer)",
                  highlight=False)
    scales, links_path = _announce_scale(emu, conns, out, machine_k)
    classes: dict = {}
    cap = None
    try:
        ranges = atlas.pin_ports(emu)
        windows.apply(emu)
        if sharing == "temporal":
            classes = atlas.temporal_classes(emu, ranges)
        if capture:
            from testbed.emu.capture import Capture

            cap = Capture(emu, seconds=capture_s).start()
        t0 = time.monotonic()
        res = run_job(emu, argv, nproc=nproc, master_port=master_port, connections=conns, out_dir=out, cwd=cwd,
                      echo=lambda line: print(line, flush=True), capture=cap,
                      on_failure=lambda m: err_console.print(f"[red]launch:[/red] {m}", highlight=False,
                                                             soft_wrap=True), links_file=str(links_path))
        cap = None
    finally:
        if cap is not None:
            cap.stop()
        if classes:
            atlas.remove_classes(emu, classes)
        if not built:
            windows.restore(emu)
    prio = atlas.turn_priorities(emu) if sharing == "temporal" else None
    paths = [*_write_launch(res, scales, out, check, prio), links_path, out / "scale.csv"]
    verdict = "[green]every rank exited 0[/green]" if res.code == 0 else f"[red]exit status {res.code}[/red]"
    console.print(f"{verdict} after {time.monotonic() - t0:.1f} s; wrote {', '.join(str(p) for p in paths)}")
    return res.code


def _write_launch(res, scales: list, out: Path, check: bool, prio: dict[str, int] | None = None) -> list[Path]:
    """ranks.csv and flows.csv with k and each link's dilation; with `check`, check.csv and its table."""
    from testbed.analysis.flows import FLOWS_HEADER
    from testbed.launch.dilation import FLOWS_SCALE_COLUMNS
    from testbed.launch.run import RANKS_HEADER
    from testbed.results import write_csv

    k = scales[0].scale if scales else 1.0
    worst = max((ls.dilation_1 for ls in scales), default=1.0)
    write_csv(out / "ranks.csv", RANKS_HEADER,
              [(e.slot.rank, e.slot.host, e.slot.dc, e.slot.replica, e.code, round(e.wall_s, 3), int(e.stopped),
                k, round(worst, 4)) for e in res.exits])
    paths = [out / "ranks.csv", out / "launch.log"]
    if not res.flows:
        return paths
    by_link = {ls.link: ls for ls in scales}
    link_col = FLOWS_HEADER.index("link")
    write_csv(out / "flows.csv", (*FLOWS_HEADER, *FLOWS_SCALE_COLUMNS),
              [(*r, k, round(by_link[r[link_col]].dilation_1, 4), round(by_link[r[link_col]].window_distortion, 4))
               for r in res.flows])
    paths.append(out / "flows.csv")
    console.print(res.capture_summary, highlight=False)
    if check:
        paths.append(_check_transfers(res.flows, scales, out, prio))
    return paths


def _check_transfers(flows: list[tuple], scales: list, out: Path, prio: dict[str, int] | None) -> Path:
    from testbed.analysis.flows import FLOWS_HEADER
    from testbed.launch.check import CHECK_HEADER, check
    from testbed.results import write_csv

    rows = [dict(zip(FLOWS_HEADER, r, strict=True)) for r in flows]
    links = {ls.link: (ls.emulated_mbps * 1e6 / 8, ls.emulated_window_bytes, ls.rtt_s) for ls in scales}
    per_link, _ = check(rows, links, prio=prio)
    console.print("WAN transfers against the simulator's model (measured / modelled - 1):", highlight=False)
    for c in per_link:
        console.print(f"  {c.link} towards {c.towards}: {c.transfers} transfers, {c.mbytes:,.2f} MB, median "
                      f"{c.median_error:+.1%}, worst {c.worst_error:+.1%}", highlight=False)
    if not per_link:
        console.print("  no WAN transfer of 256 KiB or more was captured", highlight=False)
    write_csv(out / "check.csv", CHECK_HEADER, [c.row() for c in per_link])
    return out / "check.csv"

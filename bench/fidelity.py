"""Simulator vs emulator on random topologies nobody tuned anything to: the error of the simulated
iteration time per scheduler (median, p90 and worst |error|), `fidelity.csv` (one row per run) and
`fidelity.png` (simulated vs emulated, one point per run, with the y = x line).

Each topology (`--draw users`, the default: what users run): 3-5 DCs, every pair linked (1-20 Gbit/s, log-uniform,
2-60 ms one way), one TCP window for the whole topology (1-16 MiB, a host's receive buffer is per host), tp 1, 2 or 4,
pp 2-6, dp 1-8 (pp x dp at most 16 GPU groups: dp 8 only at pp 2), 1F1B or GPipe, and in half the topologies the
spec's default two emulated hosts per DC, in the other half one per group (an emulated training run gives each group a
host of its own either way: runs/emulated.py host_per_group). `--draw wide` is the same with tp 1-2 and dp 1-4 (the
seeds of the rounds that first widened the draw); `--draw narrow` is the earlier rounds' draw (links 1-10 Gbit/s, tp
1, dp 1-3, one host per group), the same cases per seed as then. The model (hidden 1024, 4096 tokens, 4 layers per
stage) runs at an MFU chosen so that one microbatch's forward and backward on a stage take between half and twice the
geometric mean of pp-wan's and multi-TCP's activation transfer time on the median link: neither compute nor the WAN
dominates. `--schedulers families` runs dp-wan, dp-wan-overlap, diloco and streaming-diloco at dp 2 and up (H = 4 inner
steps: an iteration is one sync period).

The emulation scale k brings the fastest link to 200 Mbit/s (testbed/emu/scale.py), and in the users draw up to
twice that k where one DC can hold more than 8 GPU groups (FABRIC_MBPS: the same links and fabric in real units, its
emulated fabric within what two vCPUs carry in time); where that takes the
window under the emulator's 64 KiB floor (testbed/emu/build.py: MIN_WINDOW), both engines run the floored
window. Each (topology, scheduler) runs `--iterations` iterations (5) and the first (connection set-up) is
left out.
Needs root. Emulated timings on a shared machine are noisy: `emu_min_s`/`emu_max_s` give the spread
of the steady iterations, and repeating a seed shows the run-to-run spread.

`--load N[,N...]` runs every case again beside N CPU-bound processes (each a busy loop), load by load: each
emulated run measures its own timing health (testbed/emu/health.py) and is flagged (marked degraded) when the
error its timing can cause exceeds `--timing-budget`; per load the bench prints the error's median and worst, the
runs flagged, and the unflagged runs whose error exceeds 8 % (docs/reliability.md); `health.csv` holds each
emulated run's timing-health columns (as in summary.csv) beside its error.

`--sidecar predictive` runs Atlas's turns with the predictive sidecar in both engines (workers announce each WAN
send as its compute starts, testbed/runtime/announce.py); `reactive` (the default) is what `network.sidecar: auto`
runs on the emulated WAN (docs/training.md, "Predictive vs reactive"); `--turn-order` pins the order turns go in.

Run: sudo .venv/bin/python bench/fidelity.py --seed 1 --topologies 10 [--draw users|wide|narrow] [--schedulers families]
     [--load 0,1,2] [--sidecar reactive|predictive] [--prefix gdtbN] [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

from testbed.analysis.metrics import HEALTH_COLUMNS
from testbed.columns import FIDELITY
from testbed.costs.gpus import GPUS
from testbed.costs.models import resolve_model
from testbed.emu.health import DEFAULT_BUDGET
from testbed.emu.scale import TARGET_MBPS
from testbed.spec.experiment import EmulationOptions, Experiment

SCHEDULERS = ("pp-wan", "pp-wan+mtcp", "atlas")
FAMILIES = ("dp-wan", "dp-wan-overlap", "diloco", "streaming-diloco")  # `--schedulers families`
DILOCO_INNER_STEPS = 4  # H of the DiLoCo families: an emulated iteration is one sync period of H inner steps
HEADER = tuple(c.name for c in FIDELITY.columns)  # fidelity.csv, documented in testbed/columns.py
HIDDEN, SEQ, LAYERS_PER_STAGE, VOCAB = 1024, 4096, 4, 1024
FLAG_ERROR = 0.08  # an unflagged run whose error exceeds this is a miss of the timing health (issue 30's target)
LAN_MBPS = 400.0  # a host's emulated NIC into its DC fabric (the DC's intra_gbps is k / tp x this), at least
# twice the fastest emulated WAN link: the simulator does not bound a WAN transfer by the sender's NIC


@dataclass(frozen=True)
class Case:
    """One random topology and workload, and the experiment that runs it."""

    index: int
    params: dict[str, object]  # the CSV's topology columns
    experiment: Experiment


def pipe_rate_bps(gbps: float, latency_ms: float, window_bytes: float, connections: int) -> float:
    """Bytes/s one stage boundary's transfer gets alone on a link: min(C, n W / RTT)."""
    return min(gbps * 1e9 / 8, connections * window_bytes / (2 * latency_ms / 1e3))


def choose_scale(fastest_gbps: float) -> float:
    """k: the fastest link at TARGET_MBPS, as the emulator's own auto scale does (testbed/emu/scale.py). Where
    that takes the window under the 64 KiB floor, both engines run the floored window (plan/network.py
    lower_network): holding k lower to keep the drawn window ran the fastest link at up to twice the rate the
    emulator is sized for, and every host's LAN at twice that (docs/fidelity.md, the scale rule)."""
    return float(f"{max(1.0, fastest_gbps * 1e3 / TARGET_MBPS):.3g}")


DRAWS = ("users", "wide", "narrow")  # users: what users run (issue 27's tp 1-4, dp 1-8); wide: its first widening
# (tp 1-2, dp 1-4, the seeds 20261206-20261277 of the README); narrow: the draw of the rounds before it


@dataclass(frozen=True)
class Draw:
    """The ranges one draw takes its topologies and jobs from."""

    max_gbps: float  # links 1 Gbit/s to this, log-uniform
    tps: tuple[int, ...]
    max_dp: int
    default_hosts: bool  # half the topologies keep the spec's default hosts per DC (several groups share one)
    max_groups: int  # pp x dp at most (GPU groups, one worker process each): what two vCPUs keep in time
    fabric_mbps: float | None = None  # the most one emulated DC's hosts send at once (None: no bound)


# What one emulated DC fabric carried in time on the 2-vCPU VM: 8 hosts at 400 Mbit/s. Seed 20261301 topology 0
# (pp 2, dp 8, all 16 groups in one DC under Atlas) at 400 Mbit/s each: its two 8-member ring all-reduces took
# 25 % over their shaped time, flagged (slow DC fabric), Atlas -9.9 / -7.0 %; at k twice as large (hosts at
# 200 Mbit/s, the same links and fabric in real units) -2.8 %, unflagged.
FABRIC_MBPS = 8 * LAN_MBPS
DRAW = {"users": Draw(20.0, (1, 2, 4), 8, True, 16, FABRIC_MBPS), "wide": Draw(20.0, (1, 2), 4, True, 16),
        "narrow": Draw(10.0, (1,), 3, False, 18)}


def fabric_factor(groups_per_dc: int, fabric_mbps: float | None) -> float:
    """How much larger k (and slower every emulated host's NIC) a draw runs so that one DC's `groups_per_dc` hosts
    at LAN_MBPS stay within `fabric_mbps`: the links and fabric in real units are unchanged (a window the 64 KiB
    floor binds grows with k, in both engines), only the emulation slower."""
    if fabric_mbps is None:
        return 1.0
    return max(1.0, groups_per_dc * LAN_MBPS / fabric_mbps)


def random_case(rng: random.Random, index: int, seed: int, prefix: str | None, iterations: int,
                schedulers: tuple[str, ...] = SCHEDULERS, draw: str = "users") -> Case:
    """One topology and job from the draw's ranges: 3-5 DCs, every pair linked, pp 2-6, 1F1B or GPipe, one TCP
    window of 1-16 MiB; users: links 1-20 Gbit/s, tp 1-4, dp 1-8 (pp x dp at most 16 groups), the spec's default
    hosts or one per group; wide: the same with tp 1-2, dp 1-4."""
    d = DRAW[draw]
    n_dcs = rng.randint(3, 5)
    low_dp = 2 if all(x in FAMILIES for x in schedulers) else 1  # a data-parallel family at dp 1 is one pipeline
    pp, dp = rng.randint(2, 6), rng.randint(low_dp, d.max_dp)
    if draw != "narrow":
        while pp * dp > d.max_groups:
            pp, dp = rng.randint(2, 6), rng.randint(low_dp, d.max_dp)
    tp = rng.choice(d.tps) if len(d.tps) > 1 else d.tps[0]
    schedule = rng.choice(["1f1b", "gpipe"])
    window_mb = round(2 ** rng.uniform(0, 4), 3)  # log-uniform 1-16 MiB
    m = rng.randint(pp, min(2 * pp, 10))
    names = [f"dc{i}" for i in range(n_dcs)]
    top = math.log10(d.max_gbps)
    links = [{"between": [a, b], "gbps": round(10 ** rng.uniform(0, top), 3),
              "latency_ms": round(rng.uniform(2, 60), 2)} for a, b in combinations(names, 2)]
    default_hosts = d.default_hosts and rng.random() < 0.5
    share = math.ceil(pp / n_dcs)  # pp-wan's stages per DC; Atlas fills the DCs with the most free GPUs first
    stages = [share + rng.randint(0, 1) for _ in names]
    base = choose_scale(max(lk["gbps"] for lk in links))
    fabric = fabric_factor(min(max(stages), pp) * dp, d.fabric_mbps)  # the most groups one DC can hold
    scale = float(f"{base * fabric:.3g}")
    # the host's NIC in real units as at k = base (LAN_MBPS there), emulated at LAN_MBPS / fabric
    lan_mbps = max(LAN_MBPS * base / scale, 2 * max(lk["gbps"] for lk in links) * 1e3 / scale)
    # a host's NIC stands for its group's tp GPUs' NICs (intra_gbps is per GPU): the host at lan_mbps whatever tp,
    # so the emulated DC fabric carries what the emulator can with tp 2 as with tp 1
    dcs = [{"name": n, "gpu": "H100", "gpus": c * dp * tp, "gpus_per_node": tp,
            "intra_gbps": round(lan_mbps * scale / tp / 1e3, 6),
            **({} if default_hosts else {"hosts": min(16, c * dp)})}
           for n, c in zip(names, stages, strict=True)]
    mfu = choose_mfu(rng, links, window_mb, pp, tp)
    model = {"name": "fidelity", "layers": LAYERS_PER_STAGE * pp, "hidden": HIDDEN, "heads": 8, "vocab": VOCAB,
             "seq_len": SEQ}
    spec = {
        "name": f"fidelity-{seed}-{index}",
        "topology": {"name": f"random{index}", "tcp_window_mb": window_mb, "dcs": dcs, "links": links},
        "workload": {"model": model, "global_batch": m * dp, "microbatch": 1, "tp": tp, "pp": pp, "dp": dp,
                     "schedule": schedule, "mfu": mfu, "recompute": "none",
                     **({"diloco": {"inner_steps": DILOCO_INNER_STEPS}} if any("diloco" in x for x in schedulers)
                        else {})},
        "schedulers": list(schedulers),
        "iterations": iterations,
        "seed": seed,
        "timeline": "none",
        "emulation": {"backend": "netns", "scale": scale, "prefix": prefix},
    }
    params = {"topology": index, "seed": seed, "draw": draw, "dcs": n_dcs,
              "latency_ms": "|".join(f"{lk['latency_ms']:g}" for lk in links),
              "wan_gbps": "|".join(f"{lk['gbps']:g}" for lk in links), "tcp_window_mb": window_mb, "tp": tp, "pp": pp,
              "dp": dp, "hosts": "default" if default_hosts else "per-group", "schedule": schedule,
              "microbatches": m, "mfu": mfu, "scale": scale}
    return Case(index, params, Experiment.model_validate(spec))


def choose_mfu(rng: random.Random, links: list[dict], window_mb: float, pp: int, tp: int) -> float:
    """The MFU that makes one microbatch's forward and backward on a stage take between half and twice the
    geometric mean of pp-wan's (two NCCL channels, window-bound) and multi-TCP's (link-bound) activation transfer
    on the median link: neither compute nor the WAN dominates. A tp group's GPUs split the compute."""
    act = SEQ * HIDDEN * 2
    median = sorted(links, key=lambda lk: pipe_rate_bps(lk["gbps"], lk["latency_ms"], window_mb * 2**20, 2))
    lk = median[len(median) // 2]
    t_pp = act / pipe_rate_bps(lk["gbps"], lk["latency_ms"], window_mb * 2**20, 2)
    t_mtcp = act / (lk["gbps"] * 1e9 / 8)
    target = math.sqrt(t_pp * t_mtcp) * 2 ** rng.uniform(-1, 1)  # forward + backward of one microbatch
    model = {"name": "fidelity", "layers": LAYERS_PER_STAGE * pp, "hidden": HIDDEN, "heads": 8, "vocab": VOCAB,
             "seq_len": SEQ}
    flops = LAYERS_PER_STAGE * resolve_model(model_spec(model)).layer_fwd_flops(SEQ, SEQ) / tp
    return float(f"{min(1.0, 3 * flops / (GPUS['H100'].peak_tflops * 1e12 * target)):.4g}")


def model_spec(d: dict):
    from testbed.spec.workload import CustomModel

    return CustomModel.model_validate(d)


def cases(seed: int, n: int, prefix: str | None, iterations: int, schedulers: tuple[str, ...],
          draw: str = "users") -> list[Case]:
    """n random cases that every scheduler can place (a draw that cannot be planned is drawn again)."""
    from testbed.errors import NotYetError, SpecError
    from testbed.runs.emulated import preflight

    rng = random.Random(seed)
    out: list[Case] = []
    while len(out) < n:
        case = random_case(rng, len(out), seed, prefix, iterations, schedulers, draw)
        try:
            preflight([(case.experiment, {})])
        except (SpecError, NotYetError) as e:
            print(f"(topology {case.index} redrawn: {e})", file=sys.stderr)
            continue
        out.append(case)
    return out


def run_case(case: Case, timelines: Path | None = None, load: int = 0,
             timing_budget: float = DEFAULT_BUDGET) -> list[dict[str, object]]:
    """Emulate and simulate every scheduler of one case (one network for all of them), beside `load` CPU-bound
    processes; with `timelines`, both engines' timelines go to timelines/<topology>.csv."""
    from testbed.runs.emulated import run_point

    before = cpu_times()
    point = run_point(case.experiment, case.index, {}, timing_budget=timing_budget)
    results, validation = point.results, point.validation
    steal = steal_share(before, cpu_times())
    if timelines is not None:
        from testbed.timeline import write_timelines

        timelines.mkdir(parents=True, exist_ok=True)
        write_timelines(timelines / f"{case.index}.csv", [r.timeline for r in results if r.timeline is not None])
    emu = {str(r.summary["scheduler"]): r for r in results if r.summary["source"] == "emu"}
    rows = []
    for _run_id, sched, metric, sim, emu_s, err, note in validation:
        if metric != "iteration_s":
            continue
        its = emu[sched].timeline.iteration_s
        per = emu_s / (sum(its) / len(its))  # 1, or 1 / H where an emulated iteration is a sync period of H steps
        its = [t * per for t in its]
        rows.append({**case.params, "scheduler": sched, "sim_s": round(sim, 6), "emu_s": round(emu_s, 6),
                     "emu_min_s": round(min(its), 6), "emu_max_s": round(max(its), 6), "error": err,
                     "steal_share": steal, "load": load, "timing_error": emu[sched].summary.get("timing_error", ""),
                     "flagged": int(bool(note)), "degraded": note,
                     "health": {c: emu[sched].summary.get(c, "") for c in HEALTH_COLUMNS}})
    return rows


def cpu_times() -> list[int]:
    """The machine's CPU time counters (/proc/stat's `cpu` line, in clock ticks)."""
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:]]


def steal_share(before: list[int], after: list[int]) -> float:
    """The share of the VM's CPU time its hypervisor gave to someone else between two `cpu_times` (the 8th field,
    steal): an emulated run on a VM whose host is busy runs slow without anything in the testbed being slow."""
    d = [a - b for a, b in zip(after, before, strict=True)]
    total = sum(d[:8])  # guest time is counted in user time already
    return round(d[7] / total, 4) if total > 0 and len(d) > 7 else 0.0


@contextlib.contextmanager
def cpu_load(n: int):
    """`n` CPU-bound processes (busy loops) beside whatever runs inside the block; stopped after it."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def by_load(rows: list[dict[str, object]]) -> list[tuple[int, int, float, float, int, int]]:
    """Per load: (load, runs, median |error|, worst error (signed), runs flagged, unflagged runs over FLAG_ERROR)."""
    out = []
    for load in dict.fromkeys(int(r["load"]) for r in rows):  # type: ignore[call-overload]
        rs = [r for r in rows if int(r["load"]) == load]  # type: ignore[call-overload]
        errs = [float(r["error"]) for r in rs]  # type: ignore[arg-type]
        missed = sum(1 for r, e in zip(rs, errs, strict=True) if abs(e) > FLAG_ERROR and not int(r["flagged"]))
        out.append((load, len(rs), statistics.median(map(abs, errs)), max(errs, key=abs),
                    sum(int(r["flagged"]) for r in rs), missed))  # type: ignore[call-overload]
    return out


def quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    i = q * (len(xs) - 1)
    lo = math.floor(i)
    return xs[lo] if lo + 1 >= len(xs) else xs[lo] + (i - lo) * (xs[lo + 1] - xs[lo])


def summary(rows: list[dict[str, object]]) -> list[tuple[str, int, float, float, float, float]]:
    """(scheduler, runs, median |error|, p90 |error|, worst error (signed), median signed error) per scheduler."""
    out = []
    for sched in dict.fromkeys(str(r["scheduler"]) for r in rows):
        errs = [float(r["error"]) for r in rows if r["scheduler"] == sched]
        worst = max(errs, key=abs)
        out.append((sched, len(errs), statistics.median(map(abs, errs)), quantile([abs(e) for e in errs], 0.9), worst,
                    statistics.median(errs)))
    return out


def figure(rows: list[dict[str, object]], path: Path) -> None:
    from testbed.figures.style import colour, new, save

    fig, ax = new((5.2, 5))
    for sched in dict.fromkeys(str(r["scheduler"]) for r in rows):
        pts = [(float(r["emu_s"]), float(r["sim_s"])) for r in rows if r["scheduler"] == sched]
        ax.scatter(*zip(*pts, strict=True), s=22, label=sched, color=colour(sched), edgecolor="k", linewidth=0.4)
    hi = max(max(float(r["emu_s"]), float(r["sim_s"])) for r in rows) * 1.08
    ax.plot([0, hi], [0, hi], "k-", lw=0.8, label="y = x")
    for f in (0.95, 1.05):
        ax.plot([0, hi], [0, hi * f], "k:", lw=0.6)
    ax.set_xlim(0, hi)
    ax.set_ylim(0, hi)
    ax.set_xlabel("emulated iteration time (s)")
    ax.set_ylabel("simulated iteration time (s)")
    ax.set_title("simulator vs emulator (dotted: +-5 %)", fontsize=10)
    ax.legend(fontsize=8)
    save(fig, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--topologies", type=int, default=10)
    ap.add_argument("--iterations", type=int, default=5, help="per run; the first is left out (connection set-up)")
    ap.add_argument("--prefix", default=None, help="emulation prefix gdtb<id> (default: the first free one)")
    ap.add_argument("--realtime", choices=("auto", "on", "off"), default=EmulationOptions().realtime,
                    help="emulation.realtime of every run: the CPU class of its time-critical processes "
                         "(testbed/runtime/cpuclass.py)")
    ap.add_argument("--schedulers", default=",".join(SCHEDULERS),
                    help=f"comma list; `families` stands for {','.join(FAMILIES)} (DiLoCo with H = "
                         f"{DILOCO_INNER_STEPS}: an iteration is one sync period)")
    ap.add_argument("--draw", choices=DRAWS, default="users",
                    help="users: tp 1-4, dp 1-8, links 1-20 Gbit/s, default hosts or one per group; wide: the same at "
                         "tp 1-2, dp 1-4 (earlier seeds); narrow: the earlier "
                         "rounds' tp 1, dp 1-3, 1-10 Gbit/s, one host per group (their seeds draw the same cases)")
    ap.add_argument("--only", type=int, nargs="*", help="run only these topology indices (of the seed's draw)")
    ap.add_argument("--out", type=Path, default=Path("results/fidelity"))
    ap.add_argument("--timelines", action="store_true", help="also write both engines' timelines (OUT/timelines/)")
    ap.add_argument("--tcp-initial-window", choices=("auto", "window", "kernel"), default="auto",
                    help="network.tcp_initial_window of every case (kernel: Linux's 10 segments, docs/fidelity.md)")
    ap.add_argument("--load", default="0", help="CPU-bound processes beside the runs: N, or a comma list (each in "
                                                "turn, every case at each)")
    ap.add_argument("--sidecar", choices=("reactive", "predictive"), default="reactive",
                    help="network.sidecar of every case: how Atlas's turns hand over, in both engines")
    ap.add_argument("--turn-order", choices=("auto", "replica", "fcfs", "microbatch"), default="auto",
                    help="network.turn_order of every case (auto: the plan's choice)")
    ap.add_argument("--timing-budget", type=float, default=DEFAULT_BUDGET,
                    help="a run whose timing can cause more iteration-time error than this is flagged")
    args = ap.parse_args(argv)
    try:
        loads = [int(x) for x in args.load.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--load {args.load!r}: give process counts, e.g. 0,1,2")
    if not loads or min(loads) < 0:
        ap.error(f"--load {args.load!r}: give process counts of 0 or more, e.g. 0,1,2")
    from testbed.emu import owner
    from testbed.emu.sh import EmuError
    from testbed.results import write_csv

    t0 = time.monotonic()
    scheds = tuple(x for s in args.schedulers.split(",") if s for x in (FAMILIES if s == "families" else (s,)))
    todo = cases(args.seed, args.topologies, args.prefix, args.iterations, scheds, args.draw)
    if args.only:
        todo = [c for c in todo if c.index in args.only]
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, object]] = []
    failed: list[str] = []
    with owner.owned(args.prefix) as held:
        for load, case in ((n, c) for n in loads for c in todo):
            exp = case.experiment
            c = exp.model_copy(update={"emulation": exp.emulation.model_copy(update={"prefix": held,
                                                                                      "realtime": args.realtime}),
                                       "network": exp.network.model_copy(
                                           update={"tcp_initial_window": args.tcp_initial_window,
                                                   "sidecar": args.sidecar, "turn_order": args.turn_order})})
            case = Case(case.index, case.params, c)
            p = case.params
            loadavg = os.getloadavg()[0]
            print(f"load {load} (load average {loadavg:.2f}), {args.sidecar} sidecar, topology {case.index}: "
                  f"{p['dcs']} DCs, tp {p['tp']}, "
                  f"pp {p['pp']}, dp {p['dp']}, hosts {p['hosts']}, {p['schedule']}, "
                  f"m {p['microbatches']}, window {p['tcp_window_mb']} MiB, k {p['scale']}, "
                  f"links {p['wan_gbps']} Gbit/s, {p['latency_ms']} ms", flush=True)
            t1 = time.monotonic()
            try:
                with cpu_load(load):
                    new_rows = run_case(case, args.out / "timelines" if args.timelines else None, load,
                                        args.timing_budget)
            except EmuError as e:  # one case's failure (said, and counted at the end) leaves the others to run
                print(f"  FAILED: {e}", flush=True)
                failed.append(f"load {load}, topology {case.index}: {e}")
                continue
            for r in new_rows:
                r["loadavg"] = round(loadavg, 2)
            for r in new_rows:
                flag = f"  flagged: {r['degraded']}" if r["flagged"] else ""
                print(f"  {r['scheduler']:<12} sim {float(r['sim_s']):7.3f} s  emu {float(r['emu_s']):7.3f} s "
                      f"({float(r['emu_min_s']):.3f}-{float(r['emu_max_s']):.3f})  error {float(r['error']):+.1%}  "
                      f"timing {float(r['timing_error'] or 0):.1%}{flag}", flush=True)
            steal = f", {new_rows[0]['steal_share']:.1%} of the CPU time stolen by the hypervisor" if new_rows else ""
            print(f"  ({time.monotonic() - t1:.0f} s{steal})", flush=True)
            rows += new_rows
            write_csv(args.out / "fidelity.csv", HEADER, ([r[h] for h in HEADER] for r in rows))
            write_csv(args.out / "health.csv", ("topology", "load", "scheduler", "error", *HEALTH_COLUMNS),
                      ([r["topology"], r["load"], r["scheduler"], r["error"], *r["health"].values()] for r in rows))
    for f in failed:
        print(f"failed: {f}")
    if not rows:
        return 1
    figure(rows, args.out / "fidelity.png")
    print(f"\n{'scheduler':<18}{'runs':>5}{'median |err|':>14}{'p90 |err|':>11}{'worst':>9}{'median signed':>15}")
    for sched, n, med, p90, worst, signed in summary(rows):
        print(f"{sched:<18}{n:>5}{med:>14.1%}{p90:>11.1%}{worst:>+9.1%}{signed:>+15.1%}")
    loads = [float(r["loadavg"]) for r in rows]
    print(f"load average as the cases started: {min(loads):.2f}-{max(loads):.2f} "
          f"(median {statistics.median(loads):.2f})")
    for load, n, med, worst, flagged, missed in by_load(rows):
        print(f"load {load}: {n} runs, error median {med:.1%}, worst {worst:+.1%}, flagged {flagged} of {n}, "
              f"unflagged runs over {FLAG_ERROR * 100:g} %: {missed}")
    print(f"wrote {args.out / 'fidelity.csv'}, {args.out / 'fidelity.png'}; "
          f"total wall time {time.monotonic() - t0:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

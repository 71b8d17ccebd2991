"""Claim cards: a published number, the setting we assume where its source is silent, and the range we
accept, checked by the simulator (`testbed claims`, `make claims`).

A card (experiments/claims/*.yaml) names an experiment, a search space over any of its dotted keys
(every combination, or a seeded random sample of them), and a metric computed per point:

- `speedup`: the baseline's iteration time over the scheduler's (`baseline: best` is the fastest
  baseline at that point: any scheduler that is neither Atlas nor takes turns, see mechanisms.is_baseline,
  of any family). Iteration times are compared per token of synchronous training: a family that needs more
  tokens for the same loss (DiLoCo, Streaming DiLoCo: the summary's token_efficiency < 1) counts its
  iteration time over its token efficiency;
- `value`: one summary column of the scheduler;
- `gain`: the scheduler's column over the baseline's, minus one;
- `efficiency`: the scheduler's iteration time with the same GPUs in one DC over its time across the DCs (a
  cross-DC scaling efficiency, or a compute utilisation where the only loss is waiting on the WAN): each point
  is simulated twice, the second time on `one_site` of its topology.

Points may be filtered (`where: ["train_slowdown < 0.02"]`). An "up to" claim (`aggregate: max`) is
met by the best point; `first` takes the first point. The verdict is `reproduced` when ours falls in
`accept`, `different regime` when the card says its setting cannot be the source's (`regime:
different`, with the reason in its assumptions), and `not reproduced` otherwise.
"""

from __future__ import annotations

import itertools
import operator
import random
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, model_validator

from testbed.errors import SpecError
from testbed.spec.load import _read_yaml, experiment_data, set_dotted, validate
from testbed.spec.mechanisms import is_baseline
from testbed.spec.topology import Strict, Topology

CLAIMS_HEADER = ("claim", "source", "published", "ours", "unit", "accept", "verdict", "where", "baseline",
                 "baseline_family", "points", "settings", "assumptions")
POINTS_HEADER = ("claim", "point", "value", "scheduler_s", "baseline", "baseline_family", "baseline_s", "kept")
# the family of each scheduler base (docs/families.md): a claim names its baseline's
FAMILIES = {"pp-wan": "pipeline across DCs", "pp-1tcp": "pipeline across DCs", "atlas": "pipeline across DCs (Atlas)",
            "dp-wan": "DP across DCs", "diloco": "DiLoCo", "streaming-diloco": "Streaming DiLoCo"}
ONE_SITE = " in one DC"  # the efficiency metric's reference: the scheduler on one_site's topology
OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq}


class Metric(Strict):
    kind: Literal["speedup", "value", "gain", "efficiency"]
    scheduler: str
    baseline: str = "best"  # a scheduler of the experiment, or `best`
    column: str = "iteration_s"


class ClaimCard(Strict):
    name: str
    claim: str  # the published sentence, quoted
    source: str  # paper, venue, year
    published: float
    unit: Literal["x", "fraction", "relative"]  # x: a ratio; fraction: 0..1; relative: a gain (0.63 = +63 %)
    accept: tuple[float, float]  # the range we accept as reproducing it
    regime: Literal["same", "different"] = "same"
    assumptions: Annotated[list[str], Field(min_length=1)]  # what we assume where the source is silent
    experiment: str  # path relative to the card
    set: list[str] = []  # dotted overrides, as --set
    space: dict[str, list[Any]] = {}  # dotted key -> values searched (as --sweep)
    samples: Annotated[int, Field(gt=0)] | None = None  # a seeded random sample of the space's points
    # then climb from the best point: move one coordinate at a time while the metric improves, at most
    # this many moves (0: no climbing)
    refine: Annotated[int, Field(ge=0, le=50)] = 0
    # give each DC just enough free GPUs for its share of the job's stages, so that every scheduler's
    # pipeline must span every DC (a job that fits in one DC would not be trained across DCs)
    span_dcs: bool = False
    seed: int = 0
    metric: Metric
    where: list[str] = []  # "column op number" on the scheduler's row
    aggregate: Literal["max", "min", "first"] = "max"

    @model_validator(mode="after")
    def _accept(self) -> ClaimCard:
        if self.accept[0] > self.accept[1]:
            raise ValueError("accept: the low end is above the high end; write [low, high]")
        for w in self.where:
            _parse_where(w)
        return self


def _parse_where(text: str) -> tuple[str, Any, float]:
    parts = text.split()
    if len(parts) != 3 or parts[1] not in OPS:
        raise ValueError(f"where: {text!r} is not `column op number`; use one of {', '.join(OPS)}")
    try:
        return parts[0], OPS[parts[1]], float(parts[2])
    except ValueError:
        raise ValueError(f"where: {text!r}: {parts[2]!r} is not a number") from None


def load_card(path: str | Path) -> ClaimCard:
    return validate(ClaimCard, _read_yaml(Path(path)), f"{Path(path).name}")


def space_combos(card: ClaimCard) -> list[tuple]:
    """The space's points to start from: every combination, or a seeded random sample of them."""
    combos = list(itertools.product(*card.space.values()))
    if card.samples is not None and card.samples < len(combos):
        combos = sorted(random.Random(card.seed).sample(combos, card.samples), key=combos.index)
    return combos


def neighbours(card: ClaimCard, combo: tuple) -> list[tuple]:
    """Every point that differs from `combo` in one coordinate of the space."""
    values = list(card.space.values())
    return [combo[:i] + (v,) + combo[i + 1:] for i, vs in enumerate(values) for v in vs if v != combo[i]]


def card_points(card: ClaimCard, path: Path, extra: list[str] | None = None,
                combos: list[tuple] | None = None) -> list[tuple[dict, dict]]:
    """(experiment data, point) for each of `combos` (default: space_combos), in order."""
    from testbed.spec.load import apply_set

    base = experiment_data((path.parent / card.experiment).resolve())
    base.pop("sweep", None)
    keys = list(card.space)
    combos = space_combos(card) if combos is None else combos
    out = []
    for combo in combos:
        d = yaml.safe_load(yaml.safe_dump(base))  # a deep copy
        for k, v in zip(keys, combo, strict=True):
            if k == "topology" and isinstance(v, str):  # a topology file, relative to the card
                d["topology"] = _read_yaml((path.parent / v).resolve())
            else:
                set_dotted(d, k, v)
        for s in [*card.set, *(extra or [])]:  # after the space: a card's settings hold at every point
            apply_set(d, s)
        if card.span_dcs:
            w, dcs = d["workload"], d["topology"]["dcs"]
            share = -(-int(w["pp"]) // len(dcs))  # stages per DC, rounded up
            for dc in dcs:
                dc["gpus"] = share * int(w["tp"]) * int(w["dp"])
        out.append((d, {k: Path(v).stem if k == "topology" else v for k, v in zip(keys, combo, strict=True)}))
    return out


MERGED_FIELDS = ("gpu", "gpus_per_node", "intra_gbps", "intra_latency_us")  # what DCs must share to become one


def one_site(topology: Topology) -> Topology:
    """The topology's GPUs in one DC (named as its first): the efficiency metric's reference, so that the WAN is
    the only difference from the run across DCs. DCs whose GPUs or fabric differ are refused, since merging them
    would change the compute as well."""
    first = topology.dcs[0]
    for i, dc in enumerate(topology.dcs[1:], start=1):
        unlike = [f"{f} {getattr(dc, f)} vs {getattr(first, f)}" for f in MERGED_FIELDS
                  if getattr(dc, f) != getattr(first, f)]
        if unlike:
            raise SpecError(f"topology.dcs[{i}]", f"{dc.name} differs from {first.name} ({', '.join(unlike)}), so "
                            "one DC cannot stand for both", "give every DC the same GPUs and fabric for an efficiency "
                            "card, or use a speedup metric")
    merged = first.model_copy(update={"gpus": sum(d.gpus for d in topology.dcs),
                                      "hosts": min(16, sum(d.hosts for d in topology.dcs))})
    return Topology(name=topology.name, tcp_window_mb=topology.tcp_window_mb, dcs=[merged], links=[])


def one_site_experiment(exp, scheduler: str):
    """`exp` with only `scheduler`, on one_site of its topology; workload pins to DCs are summed onto that DC."""
    from testbed.spec.experiment import Experiment

    data = exp.model_dump(mode="json")
    data["topology"] = one_site(exp.topology).model_dump(mode="json")
    data["schedulers"] = [scheduler]
    w, name = data["workload"], exp.topology.dcs[0].name
    if w.get("groups"):
        raise SpecError("workload.groups", "a hybrid's groups name the DCs that one site merges",
                        "leave groups out of an efficiency card")
    for key in ("replicas_per_dc", "stages_per_dc"):
        if w.get(key):
            w[key] = {name: sum(w[key].values())}
    return validate(Experiment, data, "one site")


def family(scheduler: str) -> str:
    """The family of a scheduler (its base: `pp-wan+mtcp` is a pipeline across DCs); an efficiency card's
    reference is the same scheduler on one DC."""
    if scheduler.endswith(ONE_SITE):
        return "one DC"
    return next(f for base, f in sorted(FAMILIES.items(), key=lambda kv: -len(kv[0])) if scheduler.startswith(base))


def per_token(row: dict, column: str) -> float:
    """The row's `column`, and for iteration_s its time per synchronous-training token's worth of progress:
    over the family's token efficiency (1 for synchronous families, below 1 for DiLoCo-like ones)."""
    v = float(row[column])
    eff = row.get("token_efficiency")
    return v / float(eff) if column == "iteration_s" and eff not in ("", None) and float(eff) > 0 else v


def point_value(card: ClaimCard, rows: list[dict], one_site_rows: list[dict] | None = None
                ) -> tuple[float | None, dict | None, dict | None, bool]:
    """The metric at one point: (value, scheduler row, baseline row, kept by `where`). `efficiency` needs
    `one_site_rows`, the same point run on one DC; its baseline row is the scheduler's there."""
    by = {r["scheduler"]: r for r in rows if r.get("iteration_s") not in ("", None)}
    m = card.metric
    if m.scheduler not in by:
        failed = next((r for r in rows if r.get("scheduler") == m.scheduler and r.get("status")), None)
        if failed is not None:  # it is among them but could not run here: say why, not that it is missing
            raise SpecError(f"{card.name}.metric.scheduler", f"{m.scheduler!r} could not run: {failed['status']}",
                            "fix what that message names (a missing trace: --set bubbletea.trace=synthetic)")
        raise SpecError(f"{card.name}.metric.scheduler", f"{m.scheduler!r} is not among the experiment's schedulers",
                        "add it to the experiment's schedulers or fix the name")
    row = by[m.scheduler]
    base = None
    if m.kind == "efficiency":
        one = next((r for r in one_site_rows or [] if r["scheduler"] == m.scheduler
                    and r.get("iteration_s") not in ("", None)), None)
        if one is None:
            raise SpecError(f"{card.name}.metric", f"no one-DC run of {m.scheduler!r} to compare with",
                            "run the card with testbed claims (it simulates each point on one DC too)")
        base = {**one, "scheduler": m.scheduler + ONE_SITE}
    elif m.kind != "value":
        if m.baseline == "best":
            cands = [r for s, r in by.items() if is_baseline(s)]
            if not cands:
                raise SpecError(f"{card.name}.metric.baseline", "the experiment has no baseline scheduler",
                                "add pp-wan (or another non-Atlas scheduler) to its schedulers")
            base = min(cands, key=lambda r: (per_token(r, "iteration_s"), r["scheduler"]))
        elif m.baseline in by:
            base = by[m.baseline]
        else:
            raise SpecError(f"{card.name}.metric.baseline", f"{m.baseline!r} is not among the experiment's schedulers",
                            "use one of them, or best")
    if m.kind in ("speedup", "efficiency"):
        value = per_token(base, m.column) / per_token(row, m.column)
    elif m.kind == "gain":
        value = per_token(row, m.column) / per_token(base, m.column) - 1
    else:
        value = float(row[m.column])
    kept = True
    for w in card.where:
        col, op, num = _parse_where(w)
        v = row.get(col, "")
        kept = kept and v not in ("", None) and op(float(v), num)
    return value, row, base, kept


def verdict(card: ClaimCard, ours: float | None) -> str:
    if ours is None:
        return "not reproduced"
    if card.regime == "different":
        return "different regime"
    lo, hi = card.accept
    return "reproduced" if lo <= ours <= hi else "not reproduced"


_CACHE: dict[str, list[dict]] = {}  # experiment data (as YAML) -> its summary rows: cards share points


def _run_points(points: list, jobs: int | None) -> list[list[dict]]:
    from testbed.runs.simulated import run_experiment

    keys = [yaml.safe_dump(exp.model_dump(mode="json"), sort_keys=True) for exp, _ in points]
    todo = [(p, k) for p, k in zip(points, keys, strict=True) if k not in _CACHE]
    if todo:
        by_point: dict[str, list[dict]] = {}
        for r in run_experiment([p for p, _ in todo], jobs):
            by_point.setdefault(r.summary["run_id"].split("-", 1)[0], []).append(r.summary)
        for i, (_, k) in enumerate(todo):
            _CACHE[k] = by_point[f"p{i:02d}"]
    return [_CACHE[k] for k in keys]


def run_card(path: Path, jobs: int | None = None, extra: list[str] | None = None) -> tuple[tuple, list[tuple]]:
    """Simulate the card's points (and, with `refine`, climb from the best one); return its claims.csv
    row and its points' rows."""
    card = load_card(path)
    seen: dict[tuple, tuple | None] = {}  # combo -> (value, kept, row, base) or None (does not fit)

    def evaluate(combos: list[tuple]) -> None:
        from testbed.spec.experiment import Experiment

        todo = [c for c in dict.fromkeys(combos) if c not in seen]
        points, ones = [], []
        efficiency = card.metric.kind == "efficiency"
        for c, (d, point) in zip(todo, card_points(card, path, extra, todo), strict=True):
            d["timeline"] = "none"
            exp = validate(Experiment, d, card.name)
            one = one_site_experiment(exp, card.metric.scheduler) if efficiency else None
            if feasible(exp, card_schedulers(card)) and (one is None or feasible(one)):
                points.append((c, exp, point))
                ones += [(one, point)] if one is not None else []
            else:
                seen[c] = None
        runs = _run_points([(e, p) for _, e, p in points] + ones, jobs)
        for i, ((c, _, _), summaries) in enumerate(zip(points, runs, strict=False)):
            value, row, base, kept = point_value(card, summaries, runs[len(points) + i] if efficiency else None)
            seen[c] = (value, kept, row, base)

    def best_of(combos) -> tuple | None:
        ok = [c for c in combos if seen.get(c) and seen[c][1] and seen[c][0] is not None]
        if not ok or card.aggregate == "first":
            return ok[0] if ok else None
        return max(ok, key=lambda c: seen[c][0] if card.aggregate == "max" else -seen[c][0])

    evaluate(space_combos(card))
    best = best_of(seen)
    for _ in range(card.refine if card.aggregate != "first" else 0):
        if best is None:
            break
        near = neighbours(card, best)
        evaluate(near)
        step = best_of([best, *near])
        if step == best:
            break
        best = step
    if all(v is None for v in seen.values()):
        raise SpecError(f"{card.name}.space", "no point of the space fits (every plan is rejected)",
                        "widen the space or change the card's settings")
    label = {c: ";".join(f"{k}={Path(v).stem if k == 'topology' else v}" for k, v in zip(card.space, c, strict=True))
             for c in seen}
    rows = [(card.name, label[c], _num(v[0]), v[2]["iteration_s"], v[3]["scheduler"] if v[3] else "",
             family(v[3]["scheduler"]) if v[3] else "", v[3]["iteration_s"] if v[3] else "", int(v[1]))
            for c, v in seen.items() if v is not None]
    ours = seen[best][0] if best is not None else None
    base = seen[best][3] if best is not None else None
    settings = "; ".join([*card.set, *(f"{k} in {v}" for k, v in card.space.items())]
                         + ([f"{card.samples} sampled points (seed {card.seed})"] if card.samples else [])
                         + ([f"then up to {card.refine} one-coordinate moves uphill"] if card.refine else []))
    n_fit = sum(v is not None for v in seen.values())
    n_out = len(seen) - n_fit
    row = (card.name, card.source, card.published, _num(ours), card.unit, f"{card.accept[0]:g}-{card.accept[1]:g}",
           verdict(card, ours), label[best] if best is not None else "no point met the card's conditions",
           base["scheduler"] if base else "", family(base["scheduler"]) if base else "",
           f"{n_fit} (+{n_out} that do not fit)" if n_out else n_fit, settings,
           " | ".join(card.assumptions))
    return row, rows


def feasible(exp, needed: tuple[str, ...] = ()) -> bool:
    """The point can be planned (the job fits its GPUs' memory and the DCs) for every scheduler of the
    experiment, or with `needed` for those only (a card's own schedulers: a baseline of another family that
    does not fit, e.g. whole pipelines in a DC too small for one, is left out of `best` at that point)."""
    from testbed.plan.build import plannable

    try:
        for sched in needed or exp.schedulers:
            plannable(exp, sched)
    except SpecError:
        return False
    return True


def card_schedulers(card: ClaimCard) -> tuple[str, ...]:
    """The schedulers a card's metric needs at every point: its scheduler and a named baseline (an efficiency
    card's baseline is its scheduler on one DC)."""
    m = card.metric
    alone = m.kind in ("value", "efficiency") or m.baseline == "best"
    return (m.scheduler,) if alone else (m.scheduler, m.baseline)


def _better(aggregate: str, a: float, b: float) -> bool:
    return a > b if aggregate == "max" else a < b if aggregate == "min" else False


def _num(x: float | None) -> object:
    return "" if x is None else round(x, 6)


def run_claims(cards: list[Path], out: Path, jobs: int | None = None, progress=None,
               extra: list[str] | None = None) -> list[Path]:
    """Every card (`extra`: --set overrides for every point); writes claims.csv, claims_points.csv and
    claims.png into `out`."""
    from testbed.figures.claims import claims_figure
    from testbed.results import write_csv

    rows, points = [], []
    for path in cards:
        row, pts = run_card(path, jobs, extra)
        rows.append(row)
        points += pts
        if progress:
            progress(f"{row[0]}: ours {row[3]} vs published {row[2]} ({row[6]})")
    paths = [out / "claims.csv", out / "claims_points.csv", out / "claims.png"]
    write_csv(paths[0], CLAIMS_HEADER, rows)
    write_csv(paths[1], POINTS_HEADER, points)
    claims_figure([dict(zip(CLAIMS_HEADER, r, strict=True)) for r in rows], paths[2])
    return paths

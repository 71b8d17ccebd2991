"""The knee of a BubbleTea load sweep: the highest offered request rate at which the service still
meets its SLO for (almost) every request and training is (almost) not slowed down.

Utilisation keeps rising past that point (the bubbles fill up) while requests queue in the fallback
pool and miss their SLO, so the peak utilisation of a sweep is not a sustainable operating point;
the knee is.
"""

from __future__ import annotations

from collections.abc import Iterable

SLO_TARGET = 0.99  # share of requests whose TTFT meets the SLO
SLOWDOWN_MAX = 0.01  # training iteration time may grow by less than this
KNEE_HEADER = ("scheduler", "source", "knee_request_rate", "sweep", "gpu_util", "useful_util", "goodput_rps",
               "slo_attainment", "train_slowdown", "served_in_bubbles", "points", "next_request_rate",
               "next_slo_attainment", "next_train_slowdown")


def meets(row: dict, slo_target: float = SLO_TARGET, slowdown_max: float = SLOWDOWN_MAX) -> bool:
    slowdown = row.get("train_slowdown", "")
    return float(row["slo_attainment"]) >= slo_target and (slowdown == "" or float(slowdown) < slowdown_max)


# the fill work's columns at the knee (testbed/bubbletea/fill.py), after KNEE_HEADER when the sweep has fill work
KNEE_FILL_COLUMNS = ("fill_util", "fill_work_util", "fill_deadline_met", "fill_goodput_jobs_per_s",
                     "fill_goodput_tokens_per_s")


def knee_header(rows: list[dict]) -> tuple[str, ...]:
    return KNEE_HEADER + (KNEE_FILL_COLUMNS if any("fill_util" in r for r in rows) else ())


def knees(rows: Iterable[dict], slo_target: float = SLO_TARGET, slowdown_max: float = SLOWDOWN_MAX,
          extra: tuple[str, ...] = ()) -> list[tuple]:
    """One row per (BubbleTea scheduler, source): the knee point's metrics (empty when no point of the
    sweep qualifies), how many points the sweep had, and the next offered rate above the knee (where
    the criteria fail) so the knee's bracket is visible; then the knee point's `extra` columns. Fill work
    does not enter the criteria: it takes only what prefill leaves, so it moves neither."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        if r.get("requests", "") not in ("", None):
            groups.setdefault((str(r["scheduler"]), str(r["source"])), []).append(r)
    out = []
    for (sched, source), rs in groups.items():
        rs = sorted(rs, key=lambda r: float(r["request_rate"]))
        ok = [r for r in rs if meets(r, slo_target, slowdown_max)]
        k = ok[-1] if ok else None
        above = [r for r in rs if k is None or float(r["request_rate"]) > float(k["request_rate"])]
        nxt = above[0] if above else None
        pick = (lambda r, c: r[c]) if k else (lambda r, c: "")
        out.append((sched, source, pick(k, "request_rate"), pick(k, "sweep"), pick(k, "gpu_util"),
                    pick(k, "useful_util"), pick(k, "goodput_rps"), pick(k, "slo_attainment"),
                    pick(k, "train_slowdown"), pick(k, "served_in_bubbles"), len(rs),
                    nxt["request_rate"] if nxt else "", nxt["slo_attainment"] if nxt else "",
                    nxt["train_slowdown"] if nxt else "", *(k.get(c, "") if k else "" for c in extra)))
    return out

"""The BubbleTea service for emulated runs: its own process. It learns each worker's idle windows from
the live run, re-plans prefill for every iteration (testbed/bubbletea/online.py) as soon as the previous
one's reports are all in (during the orchestrator's barrier, as a real service plans on its own CPU
while training synchronises), hands each worker its jobs at the iteration's start, and records what
ran, what was skipped, what went to the fallback pool and, with real compute, when each KV cache
reached its decode process.

Time: workers send CLOCK_MONOTONIC times (one kernel, one clock). The service keeps the run's
timeline clock, iterations back to back (an iteration lasts from its start to the end of its last
op, prefill included, as the orchestrator counts it); requests arrive on it from iteration 1's start
(iteration 0 is the warm-up, and the first source of windows).

Protocol (Unix socket, length-prefixed JSON, one reply per message):
  {"op": "jobs", "worker": "s0r1", "iteration": K, "t_start": T}  -> {"jobs": [[request, chunk, chunks,
      not_before_s, duration_s, tokens, cached, home_dc], ...], "standby": [later iterations' jobs, same form],
      "gaps": [[gap, usable_s], ...], "guard": s}
  {"op": "idle", "worker", "iteration", "gap", "start", "end"}    -> {"ok": true}   (a window as it ends)
  {"op": "tail", "worker", "iteration"}                           -> {"ok": true}   (past its last op)
  {"op": "over", "worker", "iteration"}                           -> {"over": every worker is in its tail}
  {"op": "done", "worker", "iteration", "t_start", "ops", "overrun", "last_train_end", "last_op_end", "last_end",
      "ran": [[request, chunk,
      start, end, tokens, cached, busy_s]],
      "skipped": [[request, time]]}                                -> {"ok": true}
  {"op": "decoded", "request", "t_send", "t_kv", "t_done", "tokens", "dc"} -> {"ok": true}
A malformed request gets {"error": ...} and the connection is closed; the service keeps serving.
On SIGTERM it writes its results file.

Usage: python -m testbed.bubbletea.service CONFIG.json
"""

from __future__ import annotations

import json
import os
import sys

from testbed.runtime.ctlserver import serve_frames
from testbed.runtime.wire import ProtocolError


def planner_from(cfg: dict):
    """The online planner for this run's requests (arrivals from iteration 1's start: shift them once
    that start is known)."""
    import functools

    from testbed.bubbletea.online import OnlinePlanner
    from testbed.bubbletea.scheduler import GroupCost
    from testbed.bubbletea.trace import Request
    from testbed.costs import prefill, prefill_model
    from testbed.costs.gpu_specs import register_gpu
    from testbed.costs.models import MODELS

    m = MODELS[cfg["model"]]
    for gpu, fields in cfg.get("gpus", {}).items():  # the GPUs as the orchestrator has them (its own, calibrated)
        register_gpu(gpu, fields)
    if cfg.get("calibration"):  # real compute: this CPU's roofline, fitted to its measured passes
        cal = prefill.Calibration(*cfg["calibration"])
        pass_s = functools.partial(prefill.prefill_time_s, cal=cal)
        chunk_s = functools.partial(prefill.chunk_time_s, cal=cal)
    else:
        kind = cfg.get("prefill_model", prefill_model.DEFAULT_PREFILL_MODEL)
        pass_s = functools.partial(prefill_model.prefill_time_s, kind=kind)
        chunk_s = functools.partial(prefill_model.chunk_time_s, kind=kind)
    workers = {}
    for name, w in cfg["workers"].items():
        full = functools.lru_cache(maxsize=None)(lambda n, g=w["gpu"], t=w["tp"]: pass_s(m, g, t, n))
        chunk = functools.lru_cache(maxsize=None)(lambda d, k, g=w["gpu"], t=w["tp"]: chunk_s(m, g, t, d, k))
        workers[name] = (w["dc"], GroupCost(full, chunk, w["max_tokens"]))
    reqs = [Request(int(r), a, int(p), int(o)) for r, a, p, o, _home in cfg["requests"]]
    homes = {int(r[0]): r[4] for r in cfg["requests"]}
    kv = {tuple(k.split("|")): v for k, v in cfg["kv"].items()}

    def kv_time(src: str, dst: str, tokens: int) -> float:
        lat, rate = kv[(src, dst)]
        return lat + cfg["kv_bytes_per_token"] * tokens / rate

    return OnlinePlanner(reqs, workers, homes=homes, kv_time=kv_time, guard_s=cfg["guard_s"], slo_s=cfg["slo_s"],
                         history=cfg.get("history", 3), last_iteration=cfg.get("last_iteration"))


class Service:
    def __init__(self, cfg: dict) -> None:
        self.cfg = cfg
        self.n = len(cfg["workers"])
        self.planner = planner_from(cfg)  # built before the run: the first plan must not wait for imports
        self.starts: dict[int, float] = {}  # iteration -> its start (monotonic)
        self.timeline: dict[int, float] = {0: 0.0}  # iteration -> its start on the timeline clock
        self.windows: dict[int, dict[str, list]] = {}  # iteration -> worker -> [(start, end)] monotonic
        self.done: dict[int, dict[str, dict]] = {}
        self.jobs: dict[int, dict[str, list]] = {}
        self.ran: list[list] = []
        self.skipped: list[list] = []
        self.decoded: list[list] = []
        self.predicted: dict[int, dict[str, list]] = {}
        self.gaps: dict[int, dict[str, list]] = {}  # iteration -> worker -> [[gap, usable length]]
        self.standby: dict[int, dict[str, dict]] = {}  # iteration -> worker -> later iterations' jobs handed out
        self.early = 0  # standby jobs run early
        self.tails: dict[int, set[str]] = {}  # iteration -> workers past their last op (in their tail)
        self.waited: dict[int, float] = {}  # iteration -> how long training waited for prefill (all workers)
        self.margins: dict[int, float] = {}  # iteration -> the measured margin its plan used

    def handle(self, msg: dict) -> dict:
        op = msg.get("op")
        if op == "decoded":
            self.decoded.append([int(msg["request"]), float(msg["t_send"]), float(msg["t_kv"]), float(msg["t_done"]),
                                 int(msg["tokens"]), str(msg["dc"])])
            return {"ok": True}
        worker, it = str(msg["worker"]), int(msg["iteration"])
        if op == "jobs":
            self.starts.setdefault(it, float(msg["t_start"]))
            if it not in self.jobs:
                self.jobs[it] = self._plan(it)
            base = self.timeline.get(it, 0.0)
            standby = self.planner.jobs_after(it).get(worker, [])  # planned for later iterations: run now if room
            self.standby.setdefault(it, {})[worker] = {(j.request_id, j.chunk): j.duration_s for j in standby}
            return {"jobs": [j.wire(base) for j in self.jobs[it].get(worker, [])],
                    "standby": [j.wire(base) for j in standby],
                    "gaps": self.gaps.get(it, {}).get(worker, []), "guard": self.planner.guard_s}
        if op == "tail":
            self.tails.setdefault(it, set()).add(worker)
            return {"ok": True}
        if op == "over":
            return {"over": len(self.tails.get(it, ())) == self.n}
        if op == "idle":
            self.windows.setdefault(it, {}).setdefault(worker, []).append(
                (int(msg["gap"]), float(msg["start"]), float(msg["end"])))
            return {"ok": True}
        if op == "done":
            self.done.setdefault(it, {})[worker] = msg
            planned = {(j.request_id, j.chunk): j.duration_s for j in self.jobs.get(it, {}).get(worker, [])}
            standby = self.standby.get(it, {}).get(worker, {})
            for rid, chunk, a, b, tokens, cached, busy in msg["ran"]:
                self.ran.append([int(rid), worker, it, int(chunk), float(a), float(b), int(tokens), int(cached)])
                key = (int(rid), int(chunk))
                if key in standby and key not in planned:
                    self.planner.ran_early(*key)
                    self.early += 1
                if key in planned or key in standby:
                    self.planner.took(planned.get(key, standby.get(key, 0.0)), float(busy))
            for rid, t in msg["skipped"]:
                self.skipped.append([int(rid), worker, it, float(t)])
            if len(self.done[it]) == self.n and it + 1 not in self.jobs:
                self.jobs[it + 1] = self._plan(it + 1)  # every report is in: plan the next iteration now,
            return {"ok": True}  # while the orchestrator's barrier holds, so its jobs are ready at its start
        raise ProtocolError(f"unknown op {op!r}")

    def _finish(self, k: int) -> None:
        """Iteration k is over (every worker reported): its length, windows (tail included) and skips."""
        done = self.done.get(k, {})
        t0 = self.starts[k]
        ends = [float(d["last_end"]) for d in done.values()]  # every op, prefill included: the orchestrator's rule
        train_end = max((float(d["last_train_end"]) for d in done.values()), default=t0)
        duration = max(ends, default=t0) - t0
        self.timeline[k + 1] = self.timeline[k] + duration
        wins: dict[str, list] = {}
        for w, d in done.items():
            ws = [(g, a - t0, b - t0) for g, a, b in self.windows.get(k, {}).get(w, [])]
            if train_end > float(d["last_train_end"]):  # the tail: until the last op anywhere
                ws.append((int(d["ops"]), float(d["last_train_end"]) - t0, train_end - t0))
            wins[w] = ws
        if k == 0:
            self.planner.shift(self.timeline[1])
        self.planner.observe(wins, duration, warmup=k == 0, tails={w: int(d["ops"]) for w, d in done.items()})
        if k > 0:  # training waited for prefill: inside the workers' gaps, and past the last training op
            ops_end = max((float(d.get("last_op_end", d["last_end"])) for d in done.values()), default=t0)
            inside = sum(float(d.get("overrun", 0.0)) for d in done.values())
            tail = max(0.0, t0 + duration - ops_end)
            self.planner.overran(inside, duration, k)  # the margin governs the gaps, not the tail (it takes none)
            self.waited[k] = [inside, tail]
        for rid, _w, it, t in self.skipped:
            if it == k:
                self.planner.skipped(rid, self.timeline[k] + t - t0)

    def _plan(self, k: int) -> dict:
        if k == 0:
            return {}
        if k not in self.timeline:
            self._finish(k - 1)
        jobs = self.planner.plan(k, self.timeline[k])
        self.predicted[k] = {w: self.planner.windows.predict(w) for w in self.cfg["workers"]}
        self.gaps[k] = {w: self.planner.gaps_for(w) for w in self.cfg["workers"]}
        self.margins[k] = [self.planner.windows.margin_s, self.planner.windows.quantile]
        return jobs

    def results(self, rejected: int) -> dict:
        last = max(self.done, default=-1)
        if last >= 0 and last + 1 not in self.timeline and len(self.done[last]) == self.n:
            self._finish(last)
        decisions = [[rid, d.worker, d.pool_join_s, len(d.jobs), d.reason]
                     for rid, d in sorted(self.planner.decided.items())]
        return {"starts": self.starts, "timeline": self.timeline, "ran": self.ran, "skipped": self.skipped,
                "decoded": self.decoded, "decisions": decisions, "predicted": self.predicted, "rejected": rejected,
                "gaps": self.gaps, "margins": self.margins, "early": self.early, "waited": self.waited,
                "jobs": {k: {w: [j.wire(self.timeline.get(k, 0.0)) for j in js] for w, js in v.items()}
                         for k, v in self.jobs.items()}}


def main() -> None:
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    svc = Service(cfg)
    rejected = serve_frames(cfg["socket"], svc.handle, "bubbletea", gid=cfg.get("gid"), peer_uids=cfg.get("peer_uids"))
    tmp = cfg["results"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(svc.results(rejected), f)
    os.replace(tmp, cfg["results"])


if __name__ == "__main__":
    main()

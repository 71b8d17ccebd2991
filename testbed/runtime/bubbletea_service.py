"""The BubbleTea service for emulated runs: its own process. It holds the prefill plan (jobs per
worker and iteration: which request, when relative to the iteration's start, for how long),
hands each worker its jobs at the start of every iteration, and collects what actually ran.

The plan comes from the same scheduler the simulator uses, applied to the bubbles the plan predicts
(testbed/bubbletea/scheduler.py); workers run a job only while they wait for training input, so
training never waits for prefill beyond a job that overruns its bubble (measured as train_slowdown).

Protocol (Unix socket, length-prefixed JSON, one request and one reply each):
  {"op": "jobs", "worker": "s0r1", "iteration": K}
      -> {"jobs": [[request_id, offset_s, duration_s, latest_start_s], ...]}
  {"op": "done", "worker": "s0r1", "iteration": K, "ran": [[request_id, start, end], ...]} -> {"ok": true}
A malformed request gets {"error": ...} and the connection is closed; the service keeps serving.
On SIGTERM it writes every completion to its results file.

Usage: python -m testbed.runtime.bubbletea_service CONFIG.json
"""

from __future__ import annotations

import json
import os
import sys

from testbed.runtime.ctlserver import serve_frames
from testbed.runtime.wire import ProtocolError


class Service:
    def __init__(self, cfg: dict) -> None:
        self.jobs: dict[str, dict[str, list]] = cfg["jobs"]  # worker -> iteration -> jobs
        self.ran: list[list] = []

    def handle(self, msg: dict) -> dict:
        op = msg.get("op")
        worker, it = str(msg["worker"]), str(int(msg["iteration"]))
        if op == "jobs":
            return {"jobs": self.jobs.get(worker, {}).get(it, [])}
        if op == "done":
            for rid, start, end in msg["ran"]:
                self.ran.append([int(rid), worker, int(it), float(start), float(end)])
            return {"ok": True}
        raise ProtocolError(f"unknown op {op!r}")


def main() -> None:
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    svc = Service(cfg)
    rejected = serve_frames(cfg["socket"], svc.handle, "bubbletea", gid=cfg.get("gid"), peer_uids=cfg.get("peer_uids"))
    tmp = cfg["results"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump({"ran": svc.ran, "rejected": rejected}, f)
    os.replace(tmp, cfg["results"])


if __name__ == "__main__":
    main()

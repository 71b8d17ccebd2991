"""The worker's side of BubbleTea: run prefill jobs in this worker's bubbles, report its idle windows.

- At each iteration's start the worker fetches its jobs from the BubbleTea service (each: a chunk of
  a request, its planned start and latest start as offsets from the iteration's start, its predicted
  duration, tokens, tokens already cached, the request's home DC).
- It runs a job only while it waits (for training input, its replica offset, or the iteration's end)
  and never after the job's latest start: the predicted end of its bubble less the guard band and the
  job's duration. A job that can no longer start in time is skipped and reported; training is never
  held for prefill beyond a job already started.
- Each idle window (the gap between two of its training ops) is sent to the service as it ends, so
  the service can predict the next iteration's windows from the live ones (testbed/bubbletea/online.py).
- compute `modeled`: a job waits its predicted time; with `bubbletea.ship_kv`, after a request's last chunk
  its KV cache (filler of the modeled size over the emulation's scale) crosses the emulated WAN to the decode
  process of its home DC (testbed/bubbletea/decode.py, receive-only), as the real one does; a cache whose home is
  this worker's DC is not shipped (it crosses no WAN link; the simulator's transfers inside a DC do not contend).
  compute `torch`: a real prefill of the request's prompt on a small Llama-style model
  (testbed/runtime/tiny_llama.py), chunk by chunk with the KV cache kept between chunks; after the last
  chunk the KV cache and the first token are shipped over the emulated WAN to the decode process of
  the request's home DC (testbed/bubbletea/decode.py).

The service link is one Unix socket: notices (windows, reports) go through a queue and a thread of
their own, in order, so they never hold the training loop; only the job fetch waits for its reply.
"""

from __future__ import annotations

import inspect
import queue
import socket
import threading
import time
from collections.abc import Callable

from testbed.bubbletea.kvsend import KvProcess, KvShipper
from testbed.runtime.wire import recv_ctrl, send_ctrl

TRAINING = ("fwd", "bwd", "allreduce")
FETCH_TIMEOUT = 5.0
Rec = Callable[..., None]


class ServiceLink:
    """Messages to the BubbleTea service in order; `ask` waits for its reply, `tell` does not."""

    def __init__(self, path: str) -> None:
        self.q: queue.Queue = queue.Queue()
        self.error: str = ""
        self.path = path
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        try:
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(FETCH_TIMEOUT)
            s.connect(self.path)
        except OSError as e:
            self.error = f"BubbleTea service unreachable ({e.strerror or e}): no prefill"
            self._drain()
            return
        while True:
            msg, box = self.q.get()
            try:
                send_ctrl(s, msg)
                reply = recv_ctrl(s)
            except (OSError, ValueError) as e:
                self.error = f"BubbleTea service lost ({e}): no prefill"
                if box is not None:
                    box.put(None)
                self._drain()
                return
            if box is not None:
                box.put(reply)

    def _drain(self) -> None:
        while True:
            _msg, box = self.q.get()
            if box is not None:
                box.put(None)

    def tell(self, msg: dict) -> None:
        if not self.error:
            self.q.put((msg, None))

    def ask_later(self, msg: dict) -> queue.Queue:
        """Send `msg`; its reply (None on failure) will be in the returned queue."""
        box: queue.Queue = queue.Queue(maxsize=1)
        if self.error:
            box.put(None)
        else:
            self.q.put((msg, box))
        return box

    def ask(self, msg: dict) -> dict | None:
        try:
            return self.ask_later(msg).get(timeout=FETCH_TIMEOUT)
        except queue.Empty:
            self.error = "BubbleTea service did not answer: no prefill"
            return None


class TorchPrefill:
    """Real prefill on the CPU; shipping of finished KV caches to the home DC's decode process."""

    def __init__(self, decode: dict, model_name: str) -> None:
        import torch

        from testbed.costs.models import MODELS
        from testbed.runtime.tiny_llama import TinyLlama

        torch.set_num_threads(1)
        self.m = MODELS[model_name]
        self.net = TinyLlama(self.m)
        self.cache: dict[int, list] = {}
        self.shipper = KvShipper(decode)

    def steps(self, rid: int, tokens: int, cached: int, last: bool, home: str):
        """The job's real prefill, one layer per step; after the last layer the cache is kept (more chunks
        follow) or shipped with the first token to the request's home DC."""
        from testbed.runtime.tiny_llama import kv_to_bytes, prompt_ids

        ids = prompt_ids(rid, cached + tokens, self.m.vocab)[cached:]
        first, kv = yield from self.net.prefill_steps(ids, self.cache.pop(rid, None))
        if last:
            self.shipper.ship(rid, first, cached + tokens, kv_to_bytes(kv), home)
        else:
            self.cache[rid] = kv

    def drop(self, rid: int) -> None:
        self.cache.pop(rid, None)


KV_DRAIN_S = 5.0  # at the end of the run, how long a worker waits for its KV caches still crossing the WAN


class PrefillClient:
    """This worker's prefill jobs and idle gaps, one iteration at a time (see the module docstring)."""

    def __init__(self, name: str, service: str | None, compute: str, prefill=None, dc: str = "") -> None:
        """`prefill`: testbed/runtime/config.py's PrefillConfig (model, layers, decode endpoints); `dc`: this
        worker's DC (modeled caches whose home it is are not shipped: they cross no WAN link)."""
        self.name, self.dc = name, dc
        self.link = ServiceLink(service) if service else None
        self.torch = None
        if service and compute == "torch" and prefill is not None:
            self.torch = TorchPrefill(prefill.decode, prefill.model)
        # modeled compute with ship_kv: a finished request's KV cache crosses the WAN as filler of its modeled size
        self.kv_per_token = (prefill.kv_bytes_per_token if service and prefill is not None and self.torch is None
                             and prefill.decode else 0.0)
        self.shipper = (self.torch.shipper if self.torch is not None else
                        KvProcess(prefill.decode, prefill.kv_connections) if self.kv_per_token > 0
                        else None)
        self.jobs: list[list] = []
        self.standby: list[list] = []  # later iterations' jobs: run now only where no job of this one fits
        self.gaps: dict[int, float] = {}  # gap -> its predicted usable length (the service's)
        self.guard = 0.0
        self.finished: set[tuple[int, int]] = set()  # (request, chunk) that ran to the end
        self.layers = prefill.layers if prefill is not None else 32
        self.current = None  # the job under way: (job, its steps, when it first started, busy so far)
        self.t0 = self.last_end = self.last_any = 0.0
        self.ops = 0  # training ops so far this iteration: the index of the gap the worker is in
        self.reply: queue.Queue | None = None
        self.over: queue.Queue | None = None  # a pending poll: is every worker in its tail?
        self.tail_over = False
        self.it = 0

    @property
    def degraded(self) -> str:
        return self.link.error if self.link else ""

    def begin(self, it: int, t_start: float) -> None:
        """Ask for this iteration's jobs without waiting: training starts now, the jobs join when their
        reply is in (the service's planning time costs prefill, never training)."""
        self.it, self.t0, self.last_end, self.last_any, self.jobs, self.gaps = it, t_start, t_start, t_start, [], {}
        self.standby = []
        self.ops = 0
        self.last_op = t_start  # the end of its last op other than prefill (sends and the optimizer step too)
        self.ready_at: float | None = None
        self.prefill_end = 0.0  # the end of the last prefill interval
        self.overrun = 0.0  # how long training waited for prefill this iteration (its input was in)
        self.ran: list[list] = []
        self.skipped: list[list] = []
        self.reply = None if self.link is None else self.link.ask_later(
            {"op": "jobs", "worker": self.name, "iteration": it, "t_start": t_start})

    def _collect(self) -> None:
        if self.reply is None:
            return
        try:
            reply = self.reply.get_nowait()
        except queue.Empty:
            return
        self.reply = None
        if reply:
            self.jobs = list(reply.get("jobs", []))  # in the planned order
            self.standby = list(reply.get("standby", []))
            self.gaps = {int(g): float(u) for g, u in reply.get("gaps", [])}
            self.guard = float(reply.get("guard", 0.0))

    def busy(self, kind: str, t0: float, t1: float) -> None:
        """A training op ran [t0, t1]: the gap before it was an idle window; tell the service now."""
        self.last_any = max(self.last_any, t1)
        if kind == "prefill":
            self.prefill_end = t1
        else:
            self.last_op = max(self.last_op, t1)
        if kind == "recv":
            self.ready_at = t1  # training could go on from here: a prefill running past it made training wait
        if kind not in TRAINING:
            return
        end = min(t0, self.ready_at) if self.ready_at is not None and self.ready_at > self.last_end else t0
        if self.ready_at is not None and self.prefill_end > (since := max(self.ready_at, self.last_end)):
            self.overrun += min(self.prefill_end, t0) - since  # prefill in this gap past the input's arrival
        if self.link is not None and end > self.last_end + 1e-6:
            self.link.tell({"op": "idle", "worker": self.name, "iteration": self.it, "gap": self.ops,
                            "start": self.last_end, "end": end})
        self.last_end = max(self.last_end, t1)
        self.ops += 1
        self.ready_at = None

    def _gap_end(self) -> float:
        """Until when a job may run in the gap the worker is in: its live opening plus its predicted usable
        length, less the guard band (-inf for a gap not predicted)."""
        usable = self.gaps.get(self.ops)
        return -float("inf") if usable is None else self.last_end + usable - self.guard

    def _ready(self, job: list) -> bool:
        return job[1] == 0 or (job[0], job[1] - 1) in self.finished

    def _pick(self, now: float) -> tuple[list, int] | None:
        """The first job (planned order) whose request has arrived and that fits what remains of this gap;
        else the first such job of a later iteration (its time there is then free for others)."""
        end = self._gap_end()
        for jobs in (self.jobs, self.standby):
            for i, j in enumerate(jobs):
                if self.t0 + j[3] <= now and now + j[4] <= end and self._ready(j):
                    return jobs, i
        return None

    def _next_start(self) -> float | None:
        """When a job could next start in this gap (one whose request arrives later, or the reply not yet in)."""
        self._collect()
        now = time.monotonic()
        if self.current is not None:
            return None  # one job at a time: the paused one resumes in a gap with room for a layer of it
        if self.reply is not None:
            return now + 1e-3
        end = self._gap_end()
        times = [t for j in self.jobs + self.standby
                 if self._ready(j) and (t := max(now, self.t0 + j[3])) + j[4] <= end]
        return min(times) if times else None

    def run_due(self, rec: Rec, stop: Callable[[], bool] = lambda: False) -> None:
        """Run jobs while idle, until `stop()` (training input is in): a paused job first (where a layer of it
        fits the gap), then the first one that fits what is predicted to remain of the gap. A job runs one
        layer at a time: when training input arrives mid-job, it pauses at the next layer boundary and
        resumes in a later gap, so a misjudged gap costs training at most one layer."""
        self._collect()
        while not stop():
            now = time.monotonic()
            if now < self.t0:
                return  # the iteration has not begun (its go comes early): its gaps have not either
            if self.current is not None and now + self.current[0][4] / self.layers > self._gap_end():
                return  # a paused job resumes where a layer of it fits the gap
            if self.current is None:
                pick = self._pick(now)
                if pick is None:
                    return
                job = pick[0].pop(pick[1])
                rid, chunk, chunks, _nb, dur, tokens, cached, home = job
                steps = (self.torch.steps(rid, tokens, cached, chunk == chunks - 1, home) if self.torch is not None
                         else self._sleeps(dur))
                self.current = (job, steps, now, 0.0)
            job, steps, first, busy = self.current
            try:
                if inspect.getgeneratorstate(steps) == inspect.GEN_SUSPENDED and not stop():
                    steps.send(True)  # resumed after a pause
                while not stop():
                    next(steps)
            except StopIteration:
                self.current = None
                t1 = time.monotonic()
                rec("prefill", -1, now, t1)
                self.ran.append([job[0], job[1], first, t1, job[5], job[6], busy + t1 - now])
                self.finished.add((job[0], job[1]))
                if self.kv_per_token > 0 and job[1] == job[2] - 1 and job[7] != self.dc:  # last chunk: ship it
                    tokens = job[5] + job[6]
                    self.shipper.ship(job[0], 0, tokens, max(1, round(self.kv_per_token * tokens)), job[7])
                continue
            t1 = time.monotonic()
            rec("prefill", -1, now, t1)  # paused: training input is in
            self.current = (job, steps, first, busy + t1 - now)

    def _sleeps(self, dur: float):
        """Modeled compute: the job's predicted time, one layer's share per step, against a clock anchor, so
        late wake-ups (a loaded CPU) do not add up; the client sends True when it resumes the job after a
        pause, which moves the anchor by the pause."""
        step, done = dur / self.layers, 0.0
        anchor = time.monotonic()
        for _ in range(self.layers):
            done += step
            time.sleep(max(0.0, anchor + done - time.monotonic()))
            if (yield):
                anchor = time.monotonic() - done

    def wait_for(self, inbox, key: tuple, rec: Rec) -> None:
        """Wait for training input; run prefill jobs that fit in the meantime."""
        while not inbox.arrived(key):
            self.run_due(rec, lambda: inbox.arrived(key))
            nxt = self._next_start()
            if nxt is None or inbox.wait_until(key, nxt):
                return

    def wait_until(self, deadline: float, rec: Rec) -> None:
        """Wait until `deadline` (the replica's start offset); run prefill jobs that fit in the meantime."""
        while (now := time.monotonic()) < deadline:
            self.run_due(rec, lambda: time.monotonic() >= deadline)
            nxt = self._next_start()
            time.sleep(max(0.0, min(deadline, nxt if nxt is not None and nxt > now else deadline) - now))
        self.overrun += max(0.0, self.prefill_end - deadline)

    def drain(self, rec: Rec) -> None:
        """After this worker's last op (the tail gap, until the last op anywhere ends the iteration): prefill
        runs until the tail's predicted end less the guard, as in any gap, or until the service says every
        worker is in its tail (polled at each layer of prefill, and every guard band while waiting): the
        iteration then ends with the last op, prefill included, so prefill past it would delay training. A
        job still running pauses and resumes in the next iteration's first idle time."""
        self._collect()
        end = self._gap_end()
        if self.link is not None:
            self.link.tell({"op": "tail", "worker": self.name, "iteration": self.it})
        self.over, self.tail_over = None, False

        def stop() -> bool:
            return time.monotonic() >= end or self._all_in_tail()

        self.run_due(rec, stop)
        while not stop() and (nxt := self._next_start()) is not None:
            if (d := nxt - time.monotonic()) > 0:
                time.sleep(min(d, max(self.guard, 1e-4)))
            self.run_due(rec, stop)

    def _all_in_tail(self) -> bool:
        """Whether every worker has reached its tail this iteration (a poll of the service, never waited on)."""
        if self.link is None:
            return False
        if self.tail_over:
            return True  # once over, over: a new poll's reply must not let a paused job resume
        if self.over is None:
            self.over = self.link.ask_later({"op": "over", "worker": self.name, "iteration": self.it})
        try:
            reply = self.over.get_nowait()
        except queue.Empty:
            return False
        self.over = None
        self.tail_over = bool(reply and reply.get("over"))
        return self.tail_over

    def close(self, timeout_s: float) -> int:
        """At the end of the run: wait up to `timeout_s` for the KV caches still crossing the WAN; returns how
        many had not arrived (the orchestrator counts them from the service's record)."""
        return self.shipper.drain(timeout_s) if self.shipper is not None else 0

    def end(self, it: int) -> None:
        """Report what ran and what did not (each such request is re-planned); waits for the service, so that
        every worker's report is in before the orchestrator's barrier lets the next iteration (and its
        re-plan) start."""
        if self.link is None:
            return
        now = time.monotonic()
        for rid in dict.fromkeys(j[0] for j in self.jobs):
            self.skipped.append([rid, now])
            if self.torch is not None:
                self.torch.drop(rid)
        self.jobs, self.standby = [], []
        self.link.ask({"op": "done", "worker": self.name, "iteration": it, "t_start": self.t0, "ops": self.ops,
                       "overrun": self.overrun, "last_train_end": self.last_end, "last_end": self.last_any,
                       "last_op_end": self.last_op, "ran": self.ran, "skipped": self.skipped})

"""The Atlas sidecar: one per WAN link, in its WAN namespace. It only shapes; it never plans.

Each replica's flows on a WAN egress have their own HTB class (small guaranteed rate, ceiling = the
link). Workers tell the sidecar when a transfer starts and ends. In temporal mode the sidecar ranks
the replicas with a transfer in flight by the plan's turn key (testbed/net/turns.py, the one the
simulator uses: a replica ranks by its smallest key) and gives the first HTB priority 0, the next 1,
and so on (IDLE_PRIO at most; the last, KV_PRIO, is BubbleTea's KV caches'). HTB lends
spare capacity to the lowest priority number first, so one replica at a time gets the link at full
rate, and the next fills what it leaves: the simulator's temporal model. It is work-conserving, so
if the sidecar dies the link keeps carrying everything and training does not hang.

HTB applies a class's new priority only once its queue has emptied (the kernel files an active class
under the priority it had when it became active), so a replica that keeps its class busy would keep
its turn however the ranking changes: a replica with eight microbatches queued held the link for all
eight while the simulator let the other replica's earlier microbatch through (docs/fidelity.md). The
first-ranked replica's class therefore also gets the link's rate as its guaranteed rate: HTB serves
classes within their own rate before any class that borrows, whatever their filed priority, so the
turn passes at once; the others keep a trickle and borrow in priority order.
Under the `replica` policy the ranking is the turn order, so there each class's priority is its turn, fixed,
and only the guaranteed rate moves: a rank that changed while a class stayed busy left it filed under its old
priority, and with three replicas it borrowed ahead of one ranked before it (Atlas dp-3 cases read 1-4 points
slower emulated, docs/fidelity.md "Fixed priorities"). Under `microbatch` and `fcfs` the order itself changes
and priorities still follow the ranking.

The receiving worker says "end" once a transfer's last byte has arrived: only then has its tail left the
socket buffers, the delay line and the HTB queue (a sender's "end" at its last sendall handed the link
to the next replica while the tail was still queued, which a packet capture showed as replicas sharing
each millisecond). An end may take effect `drain_s` later still (0 by default); a finished transfer that
keeps its priority for a while costs nothing, as HTB only lends to classes with packets queued.

Where the link's delay comes before its shaper (the NFQUEUE delay line sits on the forward path, ahead of the
egress HTB), a transfer's bytes reach the shaper one one-way latency after its worker sent them and arrive as
they leave it, so every notice would act one latency early against the data: a replica's end gave the link away
one latency before a real sender's shaper would hear of it, and seed 149 topology 7 (Atlas, dp 3) ran 11-13 %
faster emulated than simulated (docs/fidelity.md, "Delay before the shaper"). `notice_delay_s` (the link's
one-way latency there) holds every notice, starts and ends alike, that long, in the order they came, so the
shaper sees them as a shaper at the sender would.

When the link changes (testbed/emu/wanchange.py), the orchestrator tells the sidecar its new rate: every class
gets the new ceiling (and a guaranteed rate of 1/100 of it) at once, and keeps its turn; a link that is down
has the smallest rate HTB allows. The turn order itself does not depend on the rate.

Control protocol (a Unix socket, length-prefixed JSON, see wire.py), fire-and-forget:
  {"op": "start", "dev": DEV, "replica": R, "mb": I, "kind": "a"|"g", "id": ID}   {"op": "end", "id": ID}
  {"op": "link", "link_bps": BITS_PER_S[, "notice_delay_s": S]}
A transfer's issue time is the order its start notice arrived in.

Predictive (`"predictive": true`, `network.sidecar: predictive`): the ranking comes from the plan's schedule, not
from notices of what already happened. A worker announces each WAN send as the compute that produces it starts
(testbed/runtime/announce.py), `{"op": "announce", ..., "id": ID, "at": T}` with T (CLOCK_MONOTONIC) when it will
be issued, and the sidecar ranks it at once, first come first served by `at` under the `fcfs` policy: the class
change is made before the first byte reaches the shaper, as the simulator's predictive sidecar ranks a transfer
the instant it is issued. `{"op": "issue", ...}` (the start notice's fields) says it was issued: a transfer not
announced before is ranked then. The end is still observed: the receiver's end, which comes as the last byte
leaves the shaper where the delay comes before it, is applied without `notice_delay_s` (the sidecar sits at the
shaper and stands for one that sees its queue drain), one reaction after the last byte, as the simulator has it.
The summary counts announcements that came late (after their `at`, or after their transfer's issue), repeated
ones (an id announced twice: ignored) and those left ranked when the sidecar stopped (no end came).

On a cluster (testbed/cluster/driver.py) a WAN link split between two machines has a sidecar on each, shaping the
one device that half sends into: the sender's start notice reaches its own machine's half, but the receiver's end
is heard on the other machine. With `forward` (a Unix socket the machine's agent carries to the other half's
sidecar, testbed/cluster/relay.py) every end a worker sends here goes there, marked `"fwd": true` with the time it
reached this half (`"fwd_t"`, CLOCK_MONOTONIC, moved with the worker's send time `"t"` onto the other half's
clock by `forward_clock_s`, that machine's clock minus this one's: servers have their own clocks,
testbed/cluster/clock.py); an end so marked is applied here, its drain and notice delay counted from that time, not
from its arrival, so the hop between the halves (two relays and the cluster network: about 1 ms,
a few ms at p90) does not hand each turn over that much later than one sidecar on one machine would.
A malformed message closes that client's connection; the sidecar keeps serving the others.

Usage: python -m testbed.runtime.sidecar CONFIG.json
"""

from __future__ import annotations

import heapq
import json
import socket
import sys
import threading
import time
from collections import defaultdict

from testbed.net.turns import TURN_KEYS
from testbed.runtime import cpuclass
from testbed.runtime.ctlserver import serve_frames
from testbed.runtime.htb import IDLE_PRIO, MIN_RATE_BPS, ClassChanger, trickle_bps
from testbed.runtime.wire import ProtocolError, send_ctrl

SIDECAR_NICE = -10  # without the real-time class: still ahead of the workload


def priorities(transfers) -> dict[int, int]:
    """HTB priority per replica with a transfer in flight, from (turn key, replica) pairs: by its smallest key."""
    best: dict[int, tuple] = {}
    for key, r in transfers:
        if r not in best or key < best[r]:
            best[r] = key
    return {r: min(i, IDLE_PRIO) for i, r in enumerate(sorted(best, key=lambda r: (best[r], r)))}


class Sidecar:
    def __init__(self, cfg: dict, ipr, tc: ClassChanger | None = None) -> None:
        self.cfg = cfg
        self.ipr = ipr
        self.tc = tc or ClassChanger()
        self.idx = {dev: ipr.link_lookup(ifname=dev)[0] for dev in cfg["devs"]}
        self.turn = {int(r): i for i, r in enumerate(cfg["turn_order"])}
        self.key = TURN_KEYS[cfg.get("turn_policy", "replica")]
        # Under the replica policy the ranking is the turn order itself, so a class's HTB priority can be its turn,
        # fixed: only the guaranteed rate moves. HTB files an active class under the priority it had when it became
        # active, so a rank that changed while a class stayed busy (a replica ahead of it starting) left it filed
        # too high, and with three or more replicas it borrowed ahead of one ranked before it.
        self.fixed_prio = cfg.get("turn_policy", "replica") == "replica"
        self.issued = 0  # start notices so far: the issue order first-come-first-served ranks by
        self.active: dict[str, dict[str, tuple[tuple, int]]] = defaultdict(dict)  # dev -> id -> (key, replica)
        self.prio: dict[tuple[str, int], tuple[int, bool]] = {}  # (dev, replica) -> (HTB priority, leads)
        self.changes = 0
        self.reaction_s: list[float] = []  # notice sent -> its HTB change made, per notice that changed a class
        self.delivery_s: list[float] = []  # notice sent -> read by this process
        self.netlink_s: list[float] = []  # one class change
        self.drain_s = float(cfg.get("drain_s", 0.0))
        self.notice_delay_s = float(cfg.get("notice_delay_s", 0.0))
        self.lock = threading.Lock()  # notices arrive on the server's loop, deferred ones on the timer thread
        self.deferred: list[tuple[float, int, object, tuple]] = []  # (due, order, fn, args): a heap
        self.seq = 0
        self.busy = False  # the timer thread is applying a notice
        self.last_due = 0.0  # due times never decrease, even when the notice delay does
        self.errors: list[str] = []  # deferred notices that failed (the thread goes on with the rest)
        self.fwd: socket.socket | None = None  # to the other half's sidecar (cfg "forward": a split link)
        self.forwarded = 0  # end notices sent there
        self.wake = threading.Condition()
        self.predictive = bool(cfg.get("predictive", False))
        self.announced: set[str] = set()  # ids ranked by an announcement or an issue (predictive)
        self.ended: set[str] = set()  # ids whose end came (an issue that arrives after it ranks nothing)
        self.counts = {"announced": 0, "late": 0, "repeated": 0, "unannounced": 0}
        self.issued_first: set[str] = set()  # ids an issue ranked before any announcement came
        self.ahead_s: list[float] = []  # per announcement: how long before its `at` it came (< 0: late)
        threading.Thread(target=self._run_deferred, daemon=True).start()

    def defer(self, delay_s: float, fn, *args, since: float | None = None) -> None:
        """Call fn(*args) `delay_s` after `since` (when the notice reached the link's sidecars; now if None or later
        than now), and never before a call deferred earlier: due times do not decrease (a latency that drops holds
        later notices until the earlier ones are done), so a transfer's end never overtakes its start."""
        now = time.monotonic()
        with self.wake:
            self.seq += 1
            self.last_due = max(min(now, since if since is not None else now) + delay_s, self.last_due)
            heapq.heappush(self.deferred, (self.last_due, self.seq, fn, args))
            self.wake.notify()

    def drained(self, timeout_s: float = 5.0) -> bool:
        """Wait until every deferred notice has been applied (tests; the process itself never waits)."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            with self.wake:
                if not self.deferred and not self.busy:
                    return True
            time.sleep(0.001)
        return False

    def _run_deferred(self) -> None:
        # the real-time class as the main thread has it (without it, this thread inherits the main thread's nice)
        cpuclass.enter(self.cfg.get("realtime", "off"), cpuclass.LINK_PRIORITY, None, "sidecar timer")
        while True:
            with self.wake:
                while not self.deferred or self.deferred[0][0] > time.monotonic():
                    self.wake.wait(None if not self.deferred else self.deferred[0][0] - time.monotonic())
                _due, _seq, fn, args = heapq.heappop(self.deferred)
                self.busy = True
            try:
                fn(*args)
            except Exception as e:  # one failed class change must not stop every later notice
                self.errors.append(f"{getattr(fn, '__name__', fn)}: {e}")
                print(f"sidecar: a deferred notice failed: {e}", file=sys.stderr)
            finally:
                with self.wake:
                    self.busy = False

    def handle(self, msg: dict) -> None:
        """Apply one notice; a malformed one raises (the server closes that connection)."""
        op = msg.get("op")
        if isinstance(msg.get("t"), float):
            self.delivery_s.append(time.monotonic() - msg["t"])
        if op in ("announce", "issue"):
            if not self.predictive:
                raise ProtocolError(f"{op!r} to a reactive sidecar (its config has no \"predictive\": true)")
            self.predict(op, msg)
        elif op == "start":
            dev, r, mb, tid = msg["dev"], int(msg["replica"]), int(msg["mb"]), str(msg["id"])
            self.check(dev, r)
            kind = str(msg.get("kind", "a"))
            with self.lock:
                self.issued += 1
                key = (self.key(mb, self.turn.get(r, r), kind, self.issued), r)
            # every notice through the one ordered queue (even with no delay), so none overtakes another
            self.defer(self.notice_delay_s, self.start, dev, tid, key, self._later(msg.get("t")))
        elif op == "link":
            bps = float(msg["link_bps"])
            if not bps > 0:
                raise ProtocolError(f"bad link rate {bps}")
            if "notice_delay_s" in msg:  # the link's latency changed too
                self.notice_delay_s = max(0.0, float(msg["notice_delay_s"]))
            with self.lock:
                self.cfg["link_bps"] = max(bps, MIN_RATE_BPS)
                self.cfg["min_rate_bps"] = trickle_bps(bps)
                self.prio.clear()  # every class is set again with the new rates
                for dev in self.cfg["devs"]:
                    self.apply(dev)
        elif op == "end":
            tid = str(msg["id"])
            if self.cfg.get("forward") and not msg.get("fwd"):
                self.forward(msg)  # the transfer's device is the other half's: its sidecar applies the end
                return
            hold = 0.0 if self.predictive else self.notice_delay_s  # predictive: observed at the shaper
            sent = (msg.get("t") if self.predictive else self._later(msg.get("t"))) if self.drain_s == 0 else None
            came = msg.get("fwd_t") if msg.get("fwd") and isinstance(msg.get("fwd_t"), float) else None
            if self.predictive:
                with self.lock:
                    self.ended.add(tid)
            self.defer(self.drain_s + hold, self.end, tid, sent, since=came)
        else:
            raise ProtocolError(f"unknown op {op!r}")

    def check(self, dev: str, r: int) -> None:
        if dev not in self.cfg["devs"] or str(r) not in self.cfg["devs"][dev]:
            raise ProtocolError(f"unknown device or replica: {dev} {r}")

    def predict(self, op: str, msg: dict) -> None:
        """An announcement ranks its transfer now, by its `at` (first come, first served); an issue ranks only a
        transfer nobody announced (and counts that announcement as late if it comes after)."""
        dev, r, mb, tid = msg["dev"], int(msg["replica"]), int(msg["mb"]), str(msg["id"])
        self.check(dev, r)
        kind = str(msg.get("kind", "a"))
        at = float(msg["at"]) if op == "announce" else time.monotonic()
        if at != at:  # NaN ranks nowhere
            raise ProtocolError(f"bad announcement time {msg['at']!r}")
        with self.lock:
            if op == "announce":
                self.counts["announced"] += 1
                if tid in self.announced or tid in self.ended:  # after its issue or end (late), or a second time
                    late = tid in self.issued_first or tid not in self.announced
                    self.counts["late" if late else "repeated"] += 1
                    return
                self.ahead_s.append(at - time.monotonic())
                if self.ahead_s[-1] < 0:
                    self.counts["late"] += 1
            elif tid in self.announced or tid in self.ended:
                return  # ranked at its announcement (or over already)
            else:
                self.counts["unannounced"] += 1
                self.issued_first.add(tid)
            self.announced.add(tid)
            key = (self.key(mb, self.turn.get(r, r), kind, at), r)
        self.defer(0.0, self.start, dev, tid, key, msg.get("t"))

    def left_ranked(self) -> int:
        """Transfers still ranked (announced or issued, no end came): what the summary reports as left ranked."""
        with self.lock:
            return sum(len(act) for act in self.active.values())

    def summary(self) -> str:
        """The predictive counts for the sidecar's last line ("" for a reactive sidecar)."""
        if not self.predictive:
            return ""
        c = self.counts
        ahead = f"; announced ahead of the issue: {quantiles(self.ahead_s)}" if self.ahead_s else ""
        return (f"; predictive: {c['announced']} announced, {c['late']} late, {c['repeated']} repeated, "
                f"{c['unannounced']} issued unannounced, {self.left_ranked()} left ranked{ahead}")

    def forward(self, msg: dict) -> None:
        """Send a worker's end to the other half's sidecar; one that cannot be sent is counted and dropped (the
        other half keeps the transfer ranked: work-conserving, so training goes on)."""
        try:
            if self.fwd is None:
                self.fwd = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.fwd.connect(self.cfg["forward"])
            ahead = float(self.cfg.get("forward_clock_s", 0.0))  # the other half's clock minus this one's
            sent = {"t": msg["t"] + ahead} if isinstance(msg.get("t"), float) else {}
            send_ctrl(self.fwd, {**msg, **sent, "fwd": True, "fwd_t": time.monotonic() + ahead})
            self.forwarded += 1
        except OSError as e:
            self.fwd = None
            self.errors.append(f"forward: {e}")
            print(f"sidecar: an end notice could not be forwarded to the other half ({e})", file=sys.stderr)

    def _later(self, sent: float | None) -> float | None:
        """A notice's send time moved by the notice delay: the reaction it measures is this process's own."""
        return None if sent is None else sent + self.notice_delay_s

    def start(self, dev: str, tid: str, key: tuple, sent: float | None = None) -> None:
        with self.lock:
            self.active[dev][tid] = key
            self.apply(dev, sent)

    def end(self, tid: str, sent: float | None = None) -> None:
        with self.lock:
            for dev, act in self.active.items():
                if act.pop(tid, None) is not None:
                    self.apply(dev, sent)
                    break

    def apply(self, dev: str, sent: float | None = None) -> None:
        """Set each replica class's priority (and the first one's guaranteed rate) from the ranking; `sent`: when
        the notice behind it left its worker, to measure the reaction."""
        changed = self.changes
        want = priorities(self.active[dev].values())
        for r_s, minor in self.cfg["devs"][dev].items():
            r = int(r_s)
            lead = want.get(r) == 0
            p = min(self.turn.get(r, r), IDLE_PRIO - 1) if self.fixed_prio else want.get(r, IDLE_PRIO)
            if self.prio.get((dev, r)) != (p, lead):
                rate = self.cfg["link_bps"] if lead else self.cfg["min_rate_bps"]
                t0 = time.monotonic()
                self.tc.set(self.idx[dev], int(minor), rate, self.cfg["link_bps"], p, self.cfg["mtu"])
                self.netlink_s.append(time.monotonic() - t0)
                self.prio[(dev, r)] = (p, lead)
                self.changes += 1
        if sent is not None and self.changes > changed:
            self.reaction_s.append(time.monotonic() - float(sent))


def quantiles(xs: list[float]) -> str:
    s = sorted(xs)
    return f"median {s[len(s) // 2] * 1e3:.2f} ms, p90 {s[int(0.9 * (len(s) - 1))] * 1e3:.2f} ms (n={len(s)})"


def main() -> None:
    from pyroute2 import IPRoute

    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    # part of the emulated network: ahead of the workload on a busy machine (runtime/cpuclass.py)
    try:
        cls = cpuclass.enter(cfg.get("realtime", "off"), cpuclass.LINK_PRIORITY, SIDECAR_NICE, "sidecar")
    except (cpuclass.RealtimeError, ValueError) as e:
        raise SystemExit(f"sidecar: {e}") from None
    ipr = IPRoute()  # this process runs inside the WAN namespace
    try:
        side = Sidecar(cfg, ipr)
        rejected = serve_frames(cfg["socket"], side.handle, "sidecar", gid=cfg.get("gid"),
                                peer_uids=cfg.get("peer_uids"))  # fire-and-forget: no reply
        stats = "".join(f"; {what} {quantiles(xs)}" for what, xs in (
            ("reaction (notice sent to class changed)", side.reaction_s), ("notice delivery", side.delivery_s),
            ("one netlink change", side.netlink_s)) if xs)
        fwd = f", {side.forwarded} end notices forwarded" if cfg.get("forward") else ""
        print(f"sidecar ({cls} CPU class): {side.changes} class changes, {rejected} rejected messages{fwd}{stats}"
              f"{side.summary()}", file=sys.stderr)
    finally:
        ipr.close()


if __name__ == "__main__":
    main()

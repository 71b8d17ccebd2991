"""Machines with their own clocks (testbed/cluster/clock.py): the offset from the fastest round trip, the shared-clock
fast path, the refusal of an offset known too roughly and the drift warning; and the translations every time that
crosses machines goes through: a worker's log, a data chunk's send stamp (real sockets), an Atlas sidecar's forwarded
end, a bulk measurement's two ends, and a real time namespace measured as an agent's clock would be."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from testbed.cluster import clock
from testbed.cluster.clock import ClockOffset, estimate
from testbed.emu.sh import EmuError
from testbed.emu.train import in_our_clock, to_machine


def test_the_offset_comes_from_the_sample_with_the_shortest_round_trip():
    # (driver before, machine's clock, driver after): the 2 ms round trip wins over the slower, skewed ones
    samples = [(10.0, 1010.030, 10.040), (20.0, 1020.001, 20.002), (30.0, 1029.990, 30.050)]
    o = estimate("m1", samples)
    assert o.offset_s == pytest.approx(1000.0) and o.uncertainty_s == pytest.approx(0.001)
    assert not o.shared and o.measured_s == o.offset_s


def test_a_clock_within_its_uncertainty_of_the_drivers_is_shared_and_nothing_is_translated():
    o = estimate("m0", [(5.0, 5.0016, 5.002)])  # 0.6 ms off, known to +-1 ms: one clock
    assert o.shared and o.offset_s == 0.0 and o.measured_s == pytest.approx(0.0006)
    assert not estimate("m2", [(5.0, 5.0035, 5.002)]).shared  # 2.5 ms off: beyond 1 ms + 1 ms of slack
    log = [["fwd", 0, 1.5, 2.5, 0.0]]
    assert in_our_clock(log, 0.0) is log  # on one host the rows are the workers' own, byte for byte


def test_an_offset_known_too_roughly_is_refused_naming_the_machine():
    ok = {"m0": estimate("m0", [(0.0, 0.001, 0.002)])}
    clock.check(ok)
    rough = {**ok, "m2": estimate("m2", [(0.0, 500.0, 0.012)])}  # a 12 ms round trip at best: +-6 ms
    with pytest.raises(EmuError, match=r"machine m2: .*\+-6\.0 ms .*at most 5 ms"):
        clock.check(rough)


def test_a_clock_that_moved_during_the_run_is_named():
    before = {"m1": ClockOffset("m1", -500.0, 0.0005, -500.0), "m2": ClockOffset("m2", 1000.0, 0.0005, 1000.0)}
    after = {"m1": ClockOffset("m1", -500.002, 0.0005, -500.002), "m2": ClockOffset("m2", 1000.009, 0.0005, 1000.009)}
    lines = clock.drift(before, after)
    assert len(lines) == 1 and lines[0].startswith("machine m2's clock moved +9.0 ms")


def test_times_cross_to_a_machine_and_back():
    off = -500.0
    assert to_machine(12.25, off) == pytest.approx(-487.75)
    log = [["recv", 3, to_machine(12.0, off), to_machine(12.5, off), 1e6]]
    assert in_our_clock(log, off) == [["recv", 3, pytest.approx(12.0), pytest.approx(12.5), 1e6]]


def test_measure_finds_a_clock_1000_s_ahead():
    offsets = clock.measure(["m1"], lambda name: time.monotonic() + 1000.0)
    o = offsets["m1"]
    assert abs(o.offset_s - 1000.0) <= o.uncertainty_s and o.uncertainty_s < clock.MAX_UNCERTAINTY_S
    assert "m1 +1000.000 s" in clock.describe(offsets)


def test_a_chunks_send_stamp_reaches_the_receiver_on_its_own_clock():
    """A sender 500 s behind the orchestrator stamps its chunks on the orchestrator's clock; a receiver 1000 s
    ahead reads the stamp on its own: 1500 s after the sender's, over a real socket with the workers' reader."""
    from testbed.runtime.worker import Inbox, Striped, reader

    a, b = socket.socketpair()
    inbox = Inbox(clock_s=1000.0)
    threading.Thread(target=reader, args=([b], inbox), daemon=True).start()
    pipe = Striped([a], clock_s=-500.0)
    sent: list[tuple[float, float]] = []
    t_before = time.monotonic()
    pipe.send(b"a", 0, 1, 4096, lambda t0, t1: sent.append((t0, t1)))
    t_send, t_in = inbox.wait((b"a", 0, 1))
    t_after = time.monotonic()
    assert t_before + 1500.0 <= t_send <= t_after + 1500.0
    assert t_before <= t_in <= t_after  # the arrival is the receiver's own reading
    a.close()
    b.close()


def test_a_forwarded_end_reaches_the_other_half_on_its_clock(tmp_path):
    """A split link's half forwards a worker's end to the other half, on a machine whose clock is 1000 s ahead:
    the worker's send time and the time this half heard it arrive moved onto that clock."""
    from testbed.runtime.sidecar import Sidecar
    from testbed.runtime.wire import recv_ctrl

    class NoClasses:  # this half applies nothing itself: every end is forwarded
        def link_lookup(self, ifname):
            return [3]

    path = str(tmp_path / "fwd.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen()
    half = Sidecar({"devs": {"useast": {"0": 0x100}}, "turn_order": [0], "link_bps": 200e6, "min_rate_bps": 2e6,
                    "mtu": 9000, "forward": path, "forward_clock_s": 1000.0}, NoClasses(), tc=object())
    t_sent = time.monotonic()
    half.handle({"op": "end", "id": "0a0.0", "t": t_sent})
    t_after = time.monotonic()
    c, _ = srv.accept()
    got = recv_ctrl(c)
    assert got["fwd"] and got["t"] == pytest.approx(t_sent + 1000.0)
    assert t_sent + 1000.0 <= got["fwd_t"] <= t_after + 1000.0
    c.close()
    srv.close()


def test_a_worker_config_carries_its_clock_and_refuses_a_bad_one():
    from testbed.program import Program, ProgramError
    from testbed.runtime.config import WorkerConfig

    prog = Program(group="s0r0", stage=0, replica=0, dc="a", host=0, port=7000, offset_s=0.0, steps=(), pipes=())
    cfg = WorkerConfig(program=prog, ip="10.0.0.1", peers={}, scale=1.0, compute="modeled", dp=1, host_index=0,
                       sidecars={}, clock_offset_s=-500.25)
    assert WorkerConfig.from_json(cfg.to_json()).clock_offset_s == -500.25
    bad = cfg.to_json().replace('"clock_offset_s":-500.25', '"clock_offset_s":"soon"')
    with pytest.raises(ProgramError, match="clock_offset_s"):
        WorkerConfig.from_json(bad)


TIME_NS = pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/proc/self/ns/time").exists() or not shutil.which("unshare"),
    reason="a time namespace needs root and Linux 5.6+")


def in_time_ns(offset_s: float, argv: list[str], **kw) -> subprocess.Popen:
    """A process whose CLOCK_MONOTONIC is `offset_s` ahead of ours: a machine of its own, as far as clocks go."""
    return subprocess.Popen(["unshare", "--time", "--monotonic", f"{offset_s:g}", "--fork", *argv], **kw)


ANSWER = "import sys, time\nfor _ in sys.stdin:\n    print(repr(time.monotonic()), flush=True)\n"


@TIME_NS
def test_a_real_time_namespace_is_measured_as_an_agent_would_be():
    """A process in a time namespace 1000 s ahead (as `make cluster-demo --clocks` starts a machine's Ray) answers
    with its CLOCK_MONOTONIC over a pipe: the offset found is 1000 s, to within its uncertainty."""
    p = in_time_ns(1000, [sys.executable, "-c", ANSWER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        def read(_name: str) -> float:
            p.stdin.write("\n")  # type: ignore[union-attr]
            p.stdin.flush()  # type: ignore[union-attr]
            return float(p.stdout.readline())  # type: ignore[union-attr]

        o = clock.measure(["ns"], read)["ns"]
    finally:
        p.kill()
        p.wait()
    assert not o.shared and abs(o.offset_s - 1000.0) <= o.uncertainty_s + 1e-6


@TIME_NS
def test_a_bulk_measurement_between_two_clocks_measures_the_same_interval():
    """The links' check (`topology up --check`) across machines: the server, 1000 s ahead, measures from the client's
    send times, which reach it on its own clock. Told its clock, it measures; told nothing (the stamps 1000 s in its
    past), it finds no message in its interval."""
    from testbed.emu.measure import bulk_client

    def run(server_clock: list[str]) -> dict:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        srv = in_time_ns(1000, [sys.executable, "-m", "testbed.emu.measure", "bulk-server", "127.0.0.1", str(port), "2",
                                str(128 * 1024), "0.1", "0.3", *server_clock], stdout=subprocess.PIPE, text=True)
        bulk_client("127.0.0.1", port, 2, 128 * 1024, 0.1, 0.3, clock_s=0.0)
        out, _ = srv.communicate(timeout=30)
        return json.loads(out.strip().splitlines()[-1])

    told = run(["1000"])
    assert "error" not in told, told
    assert told["messages"] >= 2
    assert "0 message(s)" in run([]).get("error", "")

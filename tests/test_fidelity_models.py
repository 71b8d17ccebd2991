"""The fidelity mechanisms (docs/fidelity.md), each against its closed form or its contract: the emulated
window, buffers, HTB rates and bursts, host placement, the workers' window clamp and striped sends, the
delay line's arrival stamps and on-time release."""

from __future__ import annotations

import socket
import struct
import threading

import pytest

from testbed.emu import delayline
from testbed.emu.build import FOREIGN_SHARE, MIN_WINDOW, MSS, MTU, emulated_window, receive_buffer
from testbed.emu.shaping import MIN_QUEUE_BYTES, htb_commands, queue_bytes
from testbed.plan.lower import host_index, lower
from testbed.program import AllReduce, Pipe, Program
from testbed.runtime import htb
from testbed.runtime.config import WorkerConfig
from testbed.runtime.worker import _advance, _head, _send_all, listen_window, socket_buffer, window_of
from tests.conftest import make_plan


@pytest.mark.parametrize(("window", "scale"), [(6 * 2**20, 50), (2**20, 22.7), (2**20, 1), (16 * 2**20, 4.5)])
def test_emulated_window_is_whole_segments_near_the_scaled_window(window, scale):
    w = emulated_window(window, scale)
    assert w % MSS == 0
    target = max(window / scale, MIN_WINDOW)
    assert abs(w - target) <= MSS / 2


def test_worker_buffers_cover_the_clamped_window_at_any_advertised_share_of_a_half():
    for w in (7 * MSS, 14 * MSS, 400 * MSS):
        assert 2 * socket_buffer(w) * 0.5 >= w + 4 * MSS  # the kernel doubles SO_RCVBUF
    assert socket_buffer(0) == 0  # inside a DC: the kernel's autotuned buffer
    assert receive_buffer(2**20) == int(2**20 / FOREIGN_SHARE)  # unclamped processes: sized from a share


def test_wire_rate_carries_the_payload_rate_in_full_frames():
    assert htb.FRAME_BYTES == MTU + 14 and htb.PAYLOAD_BYTES == MSS  # the emulator's MTU, one definition each
    assert htb.wire_bps(1e8) == pytest.approx(1e8 * (MTU + 14) / (MTU - 52))
    cmds = htb_commands("west", 1e8, 0.05, None, htb.link_mtu(1e8))
    assert f"{int(htb.wire_bps(1e8, htb.link_mtu(1e8)))}bit" in cmds[1]  # in the path's packets (4,500 bytes)


@pytest.mark.parametrize("rate", [1e6, 1.39e7, 2.3e7, 8.5e7, 2e8, 1e9])
def test_htb_buckets_hold_one_frame_of_the_path_at_every_rate(rate):
    """An idle class lets what its bucket holds through at the veth's speed: one frame of the link's path, so the
    head start it gives lasts no longer on the link than one of the packets it carries, whatever the rate (a jumbo
    frame's bucket on a 13.9 Mbit/s path of 1,500-byte packets was six packets, 5.2 ms)."""
    mtu = htb.link_mtu(rate)
    frame = mtu + 14
    assert htb.burst_bytes(mtu) == frame
    args = htb.class_args(rate / 100, rate, htb.IDLE_PRIO, mtu)
    assert args[args.index("burst") + 1] == args[args.index("cburst") + 1] == str(frame)
    for cmd in htb_commands("west", rate, 0.05, None, mtu)[1:3]:  # the link's class 1:1 and its default class
        assert cmd[cmd.index("burst") + 1] == cmd[cmd.index("cburst") + 1] == str(frame)
    bucket_s = htb.burst_bytes(mtu) * 8 / htb.wire_bps(rate, mtu)
    assert bucket_s <= max(htb.FRAME_BYTES * 8 / htb.FULL_FRAME_BPS, (htb.MIN_MTU + 14) * 8 / rate) * 1.0001


def test_the_sidecars_netlink_change_carries_the_same_bucket():
    """The sidecar's netlink change (runtime/htb.py change_message) sets the bucket `class_args` gives tc: one frame
    of the path at the class's rate and at its ceiling, in psched ticks."""
    mtu, rate_bps, ceil_bps = 1500, 1e6, 1.39e7
    msg = htb.change_message(7, 0x101, rate_bps, ceil_bps, htb.IDLE_PRIO, mtu)
    rate, ceil = (bits // 8 for bits in htb.wire_rates(rate_bps, ceil_bps, mtu))
    at = msg.index(htb._ratespec(rate) + htb._ratespec(ceil)) + 24
    buffer, cbuffer, quantum = struct.unpack_from("=III", msg, at)
    ticks = htb.PSCHED_TICK_NS
    assert (buffer, cbuffer) == ((mtu + 14) * 10**9 // rate // ticks, (mtu + 14) * 10**9 // ceil // ticks)
    assert quantum == htb.mtu_quantum(mtu)


def test_a_turn_holds_the_largest_packet_a_class_carries():
    """HTB sends a whole packet per turn whatever the deficit: a quantum below the packets shares by packet count.
    Every class's quantum is two frames of its path's MTU (hosts cap GSO at two segments), at every link rate."""
    for rate in (1e6, 2.3e7, 1e8, 2e8, 1e9):
        mtu, quantum = htb.link_mtu(rate), htb.link_quantum(rate)
        assert quantum == htb.GSO_SEGMENTS * (mtu + 14) == htb.mtu_quantum(mtu)  # and no more: packet by packet
        args = htb.class_args(rate / 100, rate, htb.IDLE_PRIO, mtu)
        assert int(args[args.index("quantum") + 1]) == quantum
        change = htb.change_message(3, 0x100, rate / 100, rate, htb.IDLE_PRIO, mtu)
        assert quantum.to_bytes(4, "little") in change  # the sidecar's netlink change keeps the link's quantum
        link = htb_commands("west", rate, 0.05, None, mtu)
        default = next(c for c in link if "1:10" in c and "class" in c)
        assert int(default[default.index("quantum") + 1]) == quantum  # the default class turns alike


def test_wire_rate_counts_the_headers_of_the_paths_packets():
    """The simulator's capacities are payload: HTB counts frames, 66 header bytes each whatever the MTU."""
    for mtu in (1500, 2250, 9000):
        assert htb.wire_bps(1e8, mtu) == pytest.approx(1e8 * (mtu + 14) / (mtu - 52))
    assert htb.wire_bps(1e8, 1500) / htb.wire_bps(1e8) == pytest.approx(1.037, abs=1e-3)  # 3.7 % more wire
    args = htb.class_args(1e6, 5e7, 0, 2250)
    assert args[args.index("ceil") + 1] == f"{int(htb.wire_bps(5e7, 2250))}bit"


def test_slow_links_send_smaller_packets_lasting_what_a_jumbo_frame_lasts_at_the_target_rate():
    assert htb.link_mtu(htb.FULL_FRAME_BPS) == htb.JUMBO_MTU == MTU
    assert htb.link_mtu(1e10) == MTU  # never above the jumbo MTU
    assert htb.link_mtu(htb.FULL_FRAME_BPS / 4) == MTU // 4
    assert htb.link_mtu(1e6) == htb.MIN_MTU  # never below Ethernet's
    for rate in (4e7, 1e8, 1.5e8):
        assert htb.link_mtu(rate) * 8 / rate == pytest.approx(MTU * 8 / htb.FULL_FRAME_BPS, rel=1e-3)
    assert htb.turn_bytes(1e8, 40) == 40 * htb.link_quantum(1e8)  # a turn in real-world bytes at scale 40


def test_shaper_queues_hold_any_window_without_a_drop():
    assert queue_bytes(2e8, 0.1) >= MIN_QUEUE_BYTES >= 32 * 2**20
    assert queue_bytes(1e10, 0.2) == 4 * int(1e10 / 8 * 0.2)


def test_every_group_of_a_dc_gets_its_own_host_while_there_are_hosts():
    plan = make_plan(pp=4, dp=3, dcs=["a", "a", "b", "b"])
    plan.hosts = {"a": 6, "b": 4}
    hosts = {(s, r): host_index(plan, s, r) for r in range(3) for s in range(4)}
    assert sorted(hosts[(s, r)] for r in range(3) for s in (0, 1)) == list(range(6))  # a: 6 groups, 6 hosts
    assert sorted(hosts[(s, r)] for r in range(3) for s in (2, 3)) == [0, 0, 1, 1, 2, 3]  # b: 6 groups, 4 hosts
    assert all(p.host == hosts[(p.stage, p.replica)] for p in lower(plan).values())


def _cfg(prog: Program, scale: float) -> WorkerConfig:
    return WorkerConfig(program=prog, ip="10.0.0.1", peers={}, scale=scale, compute="modeled", dp=1,
                        host_index=0, sidecars={}, torch=None)


def test_workers_clamp_wan_connections_to_the_scaled_window():
    pipes = (Pipe("s0r0", 2, ("a", "b"), 7001, 0, 14 * MSS * 50.0), Pipe("s2r0", 1, None, 7002, None, 0.0))
    ar = AllReduce("hierarchical", 1e9, (("s1r0",), ("s1r1",), ("s1r2",)), (4, 4, 4), (1e6, 2e6, 3e6))
    prog = Program("s1r0", 1, 0, "a", 0, 7001, 0.0, (ar,), pipes)
    cfg = _cfg(prog, 50.0)
    assert window_of(cfg, "s0r0", "pipe") == 14 * MSS
    assert window_of(cfg, "s2r0", "pipe") == 0  # inside a DC: the kernel's window
    assert window_of(cfg, "s1r1", "ring") == round(1e6 / 50)  # to the next DC: the link from DC 0 to DC 1
    assert window_of(cfg, "s1r2", "ring") == round(3e6 / 50)  # from the previous DC: the link from DC 2 to DC 0
    assert listen_window(cfg) == max(14 * MSS, round(3e6 / 50))


def test_lowered_wan_pipes_carry_their_window_and_replica_class():
    plan = make_plan(pp=2, dp=2, dcs=["a", "b"], window=3e6, connections=3, act_bytes=1e6, capacity=1e9,
                     latency=0.01)
    progs = lower(plan)
    p = progs["s0r1"].pipes[0]
    assert (p.window_bytes, p.connections, p.flow_class, p.wan) == (3e6, 3, 1, ("a", "b"))
    assert Program.from_json(progs["s0r1"].to_json()) == progs["s0r1"]


def test_head_and_advance_walk_a_message_in_slices():
    bufs = [memoryview(b"hdr"), memoryview(b"abcdefgh")]
    assert b"".join(_head(bufs, 5)) == b"hdrab"
    _advance(bufs, 5)
    assert b"".join(bufs) == b"cdefgh"
    _advance(bufs, 6)
    assert bufs == []


def test_striped_send_delivers_every_connection_whole():
    """Real sockets, each sent far more than its buffer holds, in turns of SLICE_BYTES without blocking: every
    byte arrives, in order, on its own connection."""
    import selectors

    pairs = [socket.socketpair() for _ in range(3)]
    size = 3 * 2**20
    got = [bytearray() for _ in pairs]

    def drain(i: int, s: socket.socket) -> None:
        while len(got[i]) < size + 3:
            got[i] += s.recv(65536)

    readers = [threading.Thread(target=drain, args=(i, b)) for i, (_, b) in enumerate(pairs)]
    for t in readers:
        t.start()
    payload = [bytes([65 + i]) * size for i in range(3)]
    with selectors.DefaultSelector() as sel:
        _send_all(sel, [(a, [memoryview(b"hd%d" % i), memoryview(payload[i])]) for i, (a, _) in enumerate(pairs)])
    for t in readers:
        t.join(10)
    assert [bytes(g) for g in got] == [b"hd%d" % i + payload[i] for i in range(3)]
    for a, b in pairs:
        a.close()
        b.close()


class _Recording(socket.socket):
    """A real TCP socket that records its writes and its TCP_CORK changes, in order."""

    events: list

    def sendmsg(self, buffers, *args):
        k = super().sendmsg(buffers, *args)
        self.events.append(("send", k))
        return k

    def setsockopt(self, level, opt, value, *args):
        if (level, opt) == (socket.IPPROTO_TCP, socket.TCP_CORK):
            self.events.append(("cork", value))
        return super().setsockopt(level, opt, value, *args)


def test_striped_chunks_are_corked_until_their_last_byte():
    """Each TCP connection is corked before its chunk's first write and uncorked once the kernel took its last
    byte, so a 16 KiB slice that ends inside a segment waits for the next one instead of leaving short (an
    emulated window of nine segments lost one to such short segments, docs/fidelity.md "Short segments")."""
    import selectors

    srv = socket.create_server(("127.0.0.1", 0))
    conns = []
    for _ in range(2):
        c = _Recording(socket.AF_INET, socket.SOCK_STREAM)
        c.events = []
        c.connect(srv.getsockname())
        conns.append(c)
    peers = [srv.accept()[0] for _ in conns]
    size = 3 * 2**20 + 123
    got = [0, 0]

    def drain(i: int) -> None:
        while got[i] < size:
            got[i] += len(peers[i].recv(65536))

    readers = [threading.Thread(target=drain, args=(i,)) for i in range(2)]
    for t in readers:
        t.start()
    with selectors.DefaultSelector() as sel:
        _send_all(sel, [(c, [memoryview(bytes(size))]) for c in conns])
    for t in readers:
        t.join(10)
    assert got == [size, size]
    for c in conns:
        ev = c.events
        assert ev[0] == ("cork", 1) and ev[-1] == ("cork", 0), ev[:3] + ev[-3:]
        assert [e for e in ev if e[0] == "cork"] == [("cork", 1), ("cork", 0)]
        assert sum(k for kind, k in ev if kind == "send") == size  # every byte written while corked
        assert c.getsockopt(socket.IPPROTO_TCP, socket.TCP_CORK) == 0
    for s in (*conns, *peers, srv):
        s.close()


def test_a_striped_send_that_fails_leaves_no_socket_corked():
    import selectors

    srv = socket.create_server(("127.0.0.1", 0))
    good, bad = socket.create_connection(srv.getsockname()), socket.create_connection(srv.getsockname())
    peers = [srv.accept()[0], srv.accept()[0]]
    bad.close()  # corking it fails
    with selectors.DefaultSelector() as sel, pytest.raises(OSError):
        _send_all(sel, [(good, [memoryview(b"x" * 100)]), (bad, [memoryview(b"y" * 100)])])
    assert good.getsockopt(socket.IPPROTO_TCP, socket.TCP_CORK) == 0
    for s in (good, srv, *peers):
        s.close()


def test_workers_mark_their_all_reduce_connections_for_the_nics_class():
    """A ring peer's connections carry ALLREDUCE_TOS (a host's NIC gives them their own class: emu/shaping.py
    lan_commands), a pipe's do not: real sockets on the loopback."""
    import time

    from testbed.runtime.htb import ALLREDUCE_TOS
    from testbed.runtime.worker import PURPOSE_TOS, accept, connect, listen

    lst = listen("127.0.0.1", 0)
    port = lst.getsockname()[1]
    socks = [connect("127.0.0.1", port, {"group": "s0r0", "purpose": p}, time.monotonic() + 5,
                     tos=PURPOSE_TOS.get(p, 0)) for p in ("ring", "pipe")]
    try:
        assert [s.getsockopt(socket.IPPROTO_IP, socket.IP_TOS) for s in socks] == [ALLREDUCE_TOS, 0]
        assert {accept(lst)[1]["purpose"] for _ in socks} == {"ring", "pipe"}
    finally:
        for s in socks:
            s.close()
        lst.close()


def _queue(delay_s: float):
    line = object.__new__(delayline.DelayLine)
    line.seq, line.hold_since = 0, None
    q = delayline.Queue(line, 0, delay_s)
    line.queues = {0: q}
    return line, q


def _packet(pid: int, stamp: float | None) -> bytes:
    attrs = delayline._attr(delayline.NFQA_PACKET_HDR, struct.pack("!IHB", pid, 0x0800, 3))
    if stamp is not None:
        attrs += delayline._attr(delayline.NFQA_TIMESTAMP, struct.pack("!QQ", int(stamp), round(stamp % 1 * 1e6)))
    body = struct.pack("=BBH", socket.AF_INET, 0, socket.htons(0)) + attrs
    return struct.pack("=IHHII", 16 + len(body), (delayline.NFNL_SUBSYS_QUEUE << 8) | delayline.NFQNL_MSG_PACKET,
                       0, 0, 0) + body


def test_delay_line_counts_the_delay_from_the_kernels_arrival_stamp():
    import time

    line, q = _queue(0.020)
    stamp = time.time() - 0.005  # the kernel saw it 5 ms before this process read it
    line.dispatch(_packet(7, stamp) + _packet(8, None))
    (d7, id7), (d8, id8) = q.pending
    now = time.monotonic()
    assert (id7, id8) == (7, 8) and q.stamped == 1
    assert d7 == pytest.approx(now - 0.005 + 0.020, abs=2e-3)  # from the stamp, not from now
    assert d8 >= d7  # an unstamped packet counts from now, and deadlines never go backwards


def test_delay_line_learns_its_wake_up_lateness_and_releases_that_much_early():
    _, q = _queue(0.020)
    for _ in range(200):
        q.woke(0.0003)
    assert q.early == pytest.approx(0.0003, rel=1e-3)
    for _ in range(200):
        q.woke(0.5)  # a stalled machine: never more than MAX_EARLY_S early
    assert q.early == delayline.MAX_EARLY_S


def test_a_modeled_compute_takes_back_its_threads_late_wake_up_and_a_real_one_cannot():
    from testbed.runtime.worker import unabsorbed_s

    assert unabsorbed_s(0.4e-3, 3e-3, modeled=True) == 0.0  # started back at the input's arrival
    assert unabsorbed_s(5e-3, 3e-3, modeled=True) == pytest.approx(2e-3)  # more than the compute takes
    assert unabsorbed_s(0.4e-3, 3e-3, modeled=False) == 0.4e-3  # torch starts when the thread does


def test_the_reader_holds_the_window_clamp_inside_a_message(monkeypatch):
    """The kernel may reset a connection's window clamp whenever it re-measures its segments (kernel 6.6+); a clamp
    applied only after each message let the rest of that message, and the next one, in at the buffer's window
    (a window-bound pp-wan transfer took half its time in one iteration: docs/fidelity.md). The reader clamps again
    after every partial read of a payload, as well as after each message."""
    from testbed.runtime import worker
    from testbed.runtime.wire import DATA

    calls: list[int] = []
    monkeypatch.setattr(worker, "clamp_window", lambda sock, window: calls.append(window))
    srv = socket.create_server(("127.0.0.1", 0))
    a = socket.create_connection(srv.getsockname())
    b, _ = srv.accept()
    inbox = worker.Inbox()
    payload = b"x" * 5000
    a.sendall(DATA.pack(b"a", 1, 0, 0, 1, len(payload), len(payload), 0.0) + payload[:2000])
    st, buf = worker._Incoming(), memoryview(bytearray(1 << 16))
    while st.left != len(payload) - 2000:
        worker._read(b, st, inbox, buf, 65536)
    assert calls and all(w == 65536 for w in calls)  # clamped in the middle of the message
    n = len(calls)
    a.sendall(payload[2000:])
    while st.left:
        worker._read(b, st, inbox, buf, 65536)
    assert len(calls) > n  # and once it is whole
    assert (b"a", 1, 0) in inbox.done
    for s in (a, b, srv):
        s.close()

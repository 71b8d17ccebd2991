from testbed.plan.turns import TURN_KEYS
from testbed.runtime.sidecar import IDLE_PRIO, priorities
from testbed.runtime.wire import ProtocolError, recv_ctrl


def test_turns_go_to_the_earliest_microbatch_then_the_turn_order():
    key = TURN_KEYS["microbatch"]
    # (microbatch, turn position, replica)
    assert priorities([(key(3, 1, "a", 0), 1), (key(2, 0, "a", 1), 0), (key(2, 2, "a", 2), 2)]) == {0: 0, 2: 1, 1: 2}
    # a replica ranks by its earliest
    assert priorities([(key(5, 0, "a", 0), 0), (key(1, 3, "a", 1), 3), (key(4, 0, "a", 2), 0)]) == {3: 0, 0: 1}
    many = priorities([(key(i, i, "a", i), i) for i in range(12)])
    assert many[0] == 0 and many[11] == IDLE_PRIO
    assert priorities([]) == {}


def test_first_come_first_served_ranks_by_issue_order_not_microbatch():
    key = TURN_KEYS["fcfs"]
    assert priorities([(key(7, 1, "a", 1), 1), (key(2, 0, "a", 2), 0)]) == {1: 0, 0: 1}


def test_control_frames_are_bounded_and_must_be_json_objects():
    import socket
    import struct

    import pytest

    for bad in (struct.pack("!I", 2**30), struct.pack("!I", 3) + b"abc", struct.pack("!I", 2) + b"[]"):
        a, b = socket.socketpair()
        a.sendall(bad)
        with pytest.raises(ProtocolError):
            recv_ctrl(b)
        a.close()
        b.close()


class FakeNetlink:
    """Records the class changes a Sidecar asks for (the real ones are netlink calls in a WAN namespace)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def link_lookup(self, ifname):
        return [{"useast": 3, "uswest": 4}[ifname]]

    def set(self, idx, minor, rate_bps, ceil_bps, prio, mtu):  # the sidecar's ClassChanger (payload bits/s)
        assert mtu == 9000  # the link's packet size, as built, whatever its rate now
        self.calls.append((idx, f"1:{minor:x}", rate_bps, ceil_bps, prio))


def test_a_link_change_rerates_every_class_and_keeps_the_turns():
    from testbed.runtime.sidecar import Sidecar

    nl = FakeNetlink()
    cfg = {"devs": {"useast": {"0": 0x100, "1": 0x101}, "uswest": {"0": 0x100, "1": 0x101}}, "turn_order": [0, 1],
           "link_bps": 200e6, "min_rate_bps": 2e6, "mtu": 9000}
    side = Sidecar(cfg, nl, tc=nl)
    side.handle({"op": "start", "dev": "useast", "replica": 1, "mb": 0, "id": "x"})
    assert side.drained()  # every notice goes through one ordered queue
    nl.calls.clear()
    side.handle({"op": "link", "link_bps": 80e6})
    assert len(nl.calls) == 4  # both replicas' classes on both directions
    assert {c[3] for c in nl.calls} == {80e6}
    # replica 1 keeps its turn: first, with the link's rate guaranteed; every other class a trickle. Under the
    # replica policy a class's priority is its turn, fixed (HTB files a busy class under its old priority)
    assert (3, "1:101", 80e6, 80e6, 1) in nl.calls and (3, "1:100", 0.8e6, 80e6, 0) in nl.calls
    assert {c[2] for c in nl.calls if c[:2] != (3, "1:101")} == {0.8e6}
    import pytest

    with pytest.raises(ProtocolError):
        side.handle({"op": "link", "link_bps": 0})


def test_under_the_replica_policy_priorities_stay_the_turns_and_only_the_lead_moves():
    from testbed.runtime.sidecar import Sidecar

    nl = FakeNetlink()
    cfg = {"devs": {"useast": {"0": 0x100, "1": 0x101, "2": 0x102}}, "turn_order": [2, 0, 1], "link_bps": 200e6,
           "min_rate_bps": 2e6, "mtu": 9000}
    side = Sidecar(cfg, nl, tc=nl)
    for r in (1, 0, 2):  # the last in turn order starts first, then the others
        side.handle({"op": "start", "dev": "useast", "replica": r, "mb": 0, "id": f"t{r}"})
        assert side.drained()
    prio = {c[1]: c[4] for c in nl.calls}
    assert prio == {"1:102": 0, "1:100": 1, "1:101": 2}  # each class's priority is its turn, whoever leads
    assert nl.calls[-1][2] == 200e6 and nl.calls[-1][1] == "1:102"  # replica 2 (first in turn) now leads
    lead = {c[1] for c in nl.calls[-2:] if c[2] == 200e6}
    assert lead == {"1:102"}
    nl.calls.clear()
    side.handle({"op": "end", "id": "t2"})
    assert side.drained()
    assert sorted(c[1:] for c in nl.calls) == [("1:100", 200e6, 200e6, 1), ("1:102", 2e6, 200e6, 0)]  # the next leads


def test_notices_wait_the_delay_before_the_shaper_and_keep_their_order():
    """With the delay line ahead of HTB, a notice takes effect one latency after it came (`notice_delay_s`), as the
    data reaches the shaper; a transfer's end right after its start never overtakes it (a stuck rank would keep a
    replica's turn for good)."""
    import time

    from testbed.runtime.sidecar import Sidecar

    nl = FakeNetlink()
    cfg = {"devs": {"useast": {"0": 0x100, "1": 0x101}}, "turn_order": [0, 1], "link_bps": 200e6,
           "min_rate_bps": 2e6, "mtu": 9000, "notice_delay_s": 0.05, "turn_policy": "microbatch"}
    side = Sidecar(cfg, nl, tc=nl)
    t0 = time.monotonic()
    side.handle({"op": "start", "dev": "useast", "replica": 1, "mb": 0, "id": "x"})
    side.handle({"op": "end", "id": "x"})
    side.handle({"op": "start", "dev": "useast", "replica": 0, "mb": 1, "id": "y"})
    assert nl.calls == []  # nothing yet: the data is still in the delay line
    while len(nl.calls) < 4 and time.monotonic() - t0 < 5:
        time.sleep(0.005)
    assert time.monotonic() - t0 >= 0.05
    firsts = [c for c in nl.calls if c[4] == 0]
    assert [c[1] for c in firsts] == ["1:101", "1:100"]  # replica 1's turn, then, once it ended, replica 0's
    assert side.active["useast"] == {"y": side.active["useast"]["y"]}  # x started and ended, in that order
    side.handle({"op": "link", "link_bps": 1e8, "notice_delay_s": 0.0})
    assert side.notice_delay_s == 0.0


def test_a_forwarded_end_counts_its_delay_from_when_it_reached_the_first_half_not_from_the_relay():
    """A split link's end crosses two relays and the cluster network before the half that applies it hears it: its
    notice delay counts from `fwd_t` (when the first half got it), so the hop does not delay the turn; an end heard
    directly still counts from its arrival, however old its worker's `t` (one machine unchanged); one stamped in
    the future (another clock) counts from its arrival; due times never decrease, so an end never overtakes a start."""
    import time

    from testbed.runtime.sidecar import Sidecar

    nl = FakeNetlink()
    cfg = {"devs": {"useast": {"0": 0x100, "1": 0x101}}, "turn_order": [0, 1], "link_bps": 200e6,
           "min_rate_bps": 2e6, "mtu": 9000, "notice_delay_s": 0.5, "turn_policy": "microbatch"}
    side = Sidecar(cfg, nl, tc=nl)

    def ended_after_s(tid: str, ago_s: float, **extra) -> float:
        """A transfer started (and applied), then its end heard `ago_s` after it was sent: how long until it applies."""
        side.handle({"op": "start", "dev": "useast", "replica": 1, "mb": 0, "id": tid})
        assert side.drained()
        t0 = time.monotonic()
        side.handle({"op": "end", "id": tid, "t": t0 - ago_s,
                     **{k: t0 + v if k == "fwd_t" else v for k, v in extra.items()}})
        while tid in side.active["useast"] and time.monotonic() - t0 < 5:
            time.sleep(0.002)
        return time.monotonic() - t0

    relayed_s = ended_after_s("x", 0.45, fwd=True, fwd_t=-0.4)  # 0.4 s on the way between the halves
    assert 0.09 <= relayed_s < 0.4  # due 0.5 s after the first half heard it: 0.1 s after it came here
    direct_s = ended_after_s("y", 0.4)
    assert direct_s >= 0.5  # heard directly: from its arrival, as before
    future_s = ended_after_s("z", 0.0, fwd=True, fwd_t=60.0)
    assert 0.5 <= future_s < 5
    side.handle({"op": "start", "dev": "useast", "replica": 0, "mb": 1, "id": "w"})
    side.handle({"op": "end", "id": "w", "fwd": True, "fwd_t": time.monotonic() - 10.0})  # due before its start
    assert side.drained()
    assert side.active["useast"] == {} and side.errors == []  # w started, then ended, in that order


def test_a_shorter_latency_never_lets_an_end_overtake_its_start():
    """A link whose latency drops while a start still waits: the end that follows, due sooner by the new delay,
    waits for it (else the late start would leave a finished transfer ranked for good)."""
    from testbed.runtime.sidecar import Sidecar

    nl = FakeNetlink()
    cfg = {"devs": {"useast": {"0": 0x100, "1": 0x101}}, "turn_order": [0, 1], "link_bps": 200e6,
           "min_rate_bps": 2e6, "mtu": 9000, "notice_delay_s": 0.1}
    side = Sidecar(cfg, nl, tc=nl)
    side.handle({"op": "start", "dev": "useast", "replica": 1, "mb": 0, "id": "x"})
    side.handle({"op": "link", "link_bps": 200e6, "notice_delay_s": 0.0})
    side.handle({"op": "end", "id": "x"})
    assert side.drained()
    assert side.active["useast"] == {}  # started, then ended: nothing left ranked
    assert side.errors == []


def test_a_split_links_halves_hand_the_receivers_end_to_the_half_that_shapes_the_transfer(tmp_path):
    """On a cluster each half of a link shapes one device; a worker's end reaches the half on its own machine, which
    forwards it (over a real Unix socket, as the agent's relay would carry it) to the half that heard the start."""
    import socket
    import threading

    from testbed.runtime.sidecar import Sidecar
    from testbed.runtime.wire import recv_ctrl

    path = str(tmp_path / "fwd.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen()
    base = {"turn_order": [0, 1], "link_bps": 200e6, "min_rate_bps": 2e6, "mtu": 9000}
    nl_a, nl_b = FakeNetlink(), FakeNetlink()
    a = Sidecar({**base, "devs": {"uswest": {"0": 0x100, "1": 0x101}}}, nl_a, tc=nl_a)  # sends towards uswest
    b = Sidecar({**base, "devs": {"useast": {"0": 0x100, "1": 0x101}}, "forward": path}, nl_b, tc=nl_b)
    got: list[dict] = []

    def carry() -> None:  # the relay: whatever b forwards, a hears
        c, _ = srv.accept()
        for _ in range(2):
            got.append(recv_ctrl(c))
            a.handle(got[-1])

    t = threading.Thread(target=carry)
    t.start()
    a.handle({"op": "start", "dev": "uswest", "replica": 1, "mb": 0, "id": "1a0.0"})
    assert a.drained() and set(a.active["uswest"]) == {"1a0.0"}
    b.handle({"op": "end", "id": "1a0.0"})  # the receiver, on b's machine
    b.handle({"op": "end", "id": "nope"})  # an unknown transfer: forwarded too, and ignored there
    t.join(5)
    assert [m["fwd"] for m in got] == [True, True] and b.forwarded == 2 and not b.errors
    assert all(isinstance(m["fwd_t"], float) for m in got)  # when b heard it: a counts its delay from there
    assert a.drained() and a.active["uswest"] == {}  # the transfer ended on the half that shapes it
    assert nl_b.calls == []  # b never touched its own classes for it
    srv.close()


def test_an_end_that_cannot_be_forwarded_is_counted_not_fatal(tmp_path):
    from testbed.runtime.sidecar import Sidecar

    nl = FakeNetlink()
    side = Sidecar({"devs": {"useast": {"0": 0x100}}, "turn_order": [0], "link_bps": 200e6, "min_rate_bps": 2e6,
                    "mtu": 9000, "forward": str(tmp_path / "absent.sock")}, nl, tc=nl)
    side.handle({"op": "end", "id": "0a0.0"})
    assert side.forwarded == 0 and side.errors and "forward" in side.errors[0]

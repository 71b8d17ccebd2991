"""The delay line's live changes, on crafted NFQUEUE messages (no kernel): a new delay keeps packets in
order, a hold keeps what comes until the release and lets out what was already on its way."""

from __future__ import annotations

import json
import socket
import struct

from testbed.emu import delayline as dl


def line() -> dl.DelayLine:
    d = dl.DelayLine.__new__(dl.DelayLine)  # no netlink socket: dispatch and control are plain logic
    d.seq, d.hold_since, d.holds, d.bad_control = 0, None, [], 0
    d.queues = {0: dl.Queue(d, 0, 0.020)}
    return d


def packet(pid: int) -> bytes:
    body = struct.pack("=BBH", 0, 0, socket.htons(0))
    attr = dl._attr(dl.NFQA_PACKET_HDR, struct.pack("!IHB", pid, 0x800, 0))
    return struct.pack("=IHHII", 16 + len(body) + len(attr), (dl.NFNL_SUBSYS_QUEUE << 8) | dl.NFQNL_MSG_PACKET,
                       0, 0, 0) + body + attr


def test_a_shorter_delay_never_lets_a_packet_overtake():
    d = line()
    d.dispatch(packet(1))
    d.control(json.dumps({"delays_ms": {"0": 1}}).encode())
    d.dispatch(packet(2))
    (t1, _), (t2, _) = d.queues[0].pending
    assert t2 >= t1 and d.queues[0].changes == 1


def test_a_hold_keeps_new_packets_until_released_and_records_itself():
    d = line()
    d.dispatch(packet(1))
    d.control(b'{"hold": true}')
    d.dispatch(packet(2))
    d.dispatch(packet(3))
    q = d.queues[0]
    assert q.pending[0][0] < dl.HELD and [t for t, _ in list(q.pending)[1:]] == [dl.HELD, dl.HELD]
    d.control(b'{"hold": false}')
    times = [t for t, _ in q.pending]
    assert times == sorted(times) and max(times) < dl.HELD
    (h,) = d.holds
    assert h["packets"] == 2 and h["from"] <= h["first"] <= h["to"]
    d.dispatch(packet(4))  # after the release packets are timed as usual again
    assert q.pending[-1][0] < dl.HELD and q.pending[-1][0] >= times[-1]


def test_malformed_control_is_counted_not_fatal():
    d = line()
    d.control(b"not json")
    d.control(b'{"delays_ms": 3}')
    assert d.bad_control == 2


def test_the_stats_file_is_written_off_the_packet_loop(tmp_path):
    """A stats write that blocks (here: a FIFO nobody reads yet; on ext4, a rename that waits on the journal) must
    not block the loop that releases packets; the newest snapshot is what lands, and close writes the last word."""
    import os
    import threading

    fifo = tmp_path / "stats.json.tmp"  # the writer opens PATH.tmp first: that open blocks until a reader comes
    os.mkfifo(fifo)
    w = dl.StatsWriter(str(tmp_path / "stats.json"))
    putter = threading.Thread(target=lambda: [w.put(json.dumps({"n": i})) for i in range(100)])
    putter.start()
    putter.join(5)
    assert not putter.is_alive()  # put never waited for the blocked write (it would wait forever)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    reader.join(5)
    w.close(json.dumps({"n": "final"}))
    assert got and json.loads(got[0])["n"] in range(100)
    assert json.loads((tmp_path / "stats.json").read_text()) == {"n": "final"}

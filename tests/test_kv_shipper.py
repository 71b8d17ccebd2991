"""The workers' KV-cache shipper (testbed/bubbletea/kvsend.py KvShipper, and KvProcess: the same in a child process)
against a real TCP receiver on loopback speaking the decode process's receive-only side
(testbed/bubbletea/decode.py): filler is striped over the connections, every part is acknowledged, and the bounded
drain counts what has not arrived."""

from __future__ import annotations

import os
import socket
import threading
import time

from testbed.bubbletea.decode import discard
from testbed.bubbletea.kvsend import KvProcess, KvShipper
from testbed.runtime.config import Endpoint
from testbed.runtime.lowcpu import KV_NICE
from testbed.runtime.wire import recv_ctrl


def receiver(ack: bool) -> tuple[Endpoint, list[tuple[int, int, int]]]:
    """A listener on loopback recording (request, bytes, parts) per part it received whole."""
    got: list[tuple[int, int, int]] = []
    lst = socket.create_server(("127.0.0.1", 0))

    def client(c: socket.socket) -> None:
        buf = bytearray(1 << 16)
        try:
            while True:
                head = recv_ctrl(c)
                discard(c, int(head["bytes"]), buf)
                got.append((int(head["request"]), int(head["bytes"]), int(head["parts"])))
                if ack:
                    c.sendall(b"\x01")
        except (ConnectionError, OSError):
            c.close()

    def accept() -> None:
        while True:
            c, _ = lst.accept()
            threading.Thread(target=client, args=(c,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return Endpoint("127.0.0.1", lst.getsockname()[1]), got


def test_filler_is_striped_over_the_connections_and_drained():
    ep, got = receiver(ack=True)
    ship = KvShipper({"home": ep}, connections=3)
    ship.ship(1, 0, 100, 3_000_001, "home")
    ship.ship(2, 0, 2, 2, "home")  # fewer bytes than connections: no empty parts
    assert ship.drain(10.0) == 0
    one = [g for g in got if g[0] == 1]
    assert sorted(b for _, b, _ in one) == [1_000_000, 1_000_000, 1_000_001] and {p for *_, p in one} == {3}
    assert sorted(g for g in got if g[0] == 2) == [(2, 1, 2), (2, 1, 2)]


def test_drain_is_bounded_and_counts_what_has_not_arrived():
    ep, got = receiver(ack=False)  # receives everything, never acknowledges: nothing counts as arrived
    ship = KvShipper({"home": ep}, connections=2)
    ship.ship(7, 0, 10, 1000, "home")
    assert ship.drain(0.3) == 2


def test_a_modeled_runs_caches_leave_from_a_child_process_at_the_lowest_priority():
    """The sender threads live in another process (not the worker's interpreter, whose GIL training's threads
    hold), at nice 19; the parts arrive striped as from the in-process shipper, and the drain ends the child."""
    ep, got = receiver(ack=True)
    ship = KvProcess({"home": ep}, connections=2)
    assert ship.proc.pid != os.getpid()
    deadline = time.monotonic() + 5.0
    while os.getpriority(os.PRIO_PROCESS, ship.proc.pid) != KV_NICE and time.monotonic() < deadline:
        time.sleep(0.01)
    assert os.getpriority(os.PRIO_PROCESS, ship.proc.pid) == KV_NICE
    assert os.getpriority(os.PRIO_PROCESS, 0) != KV_NICE  # the worker's own priority is left alone
    ship.ship(3, 0, 50, 2_000_001, "home")
    assert ship.drain(10.0) == 0
    assert sorted(b for r, b, _ in got if r == 3) == [1_000_000, 1_000_001]
    assert ship.proc.poll() is not None


def test_the_child_process_counts_what_has_not_arrived():
    ep, _ = receiver(ack=False)
    ship = KvProcess({"home": ep}, connections=2)
    ship.ship(8, 0, 10, 1000, "home")
    assert ship.drain(0.3) == 2
    assert ship.proc.poll() is not None

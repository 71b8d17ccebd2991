"""The workers' KV-cache shipper (testbed/bubbletea/worker_side.py KvShipper) against a real TCP receiver on loopback
speaking the decode process's receive-only side (testbed/bubbletea/decode.py): filler is striped over the
connections, every part is acknowledged, and the bounded drain counts what has not arrived."""

from __future__ import annotations

import socket
import threading

from testbed.bubbletea.decode import discard
from testbed.bubbletea.worker_side import KvShipper
from testbed.runtime.config import Endpoint
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

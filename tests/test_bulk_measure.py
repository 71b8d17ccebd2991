"""The multi-TCP experiment's bulk measurement: its goodput arithmetic, and one real run over loopback TCP
through the workers' own connection set-up (no emulated WAN: that is the integration test's)."""

from __future__ import annotations

import socket
import threading

import pytest

from testbed.emu.measure import bulk_client, bulk_message_bytes, bulk_server, goodput


def test_goodput_counts_the_messages_after_the_first_over_the_time_between():
    arrivals = [0.1, 0.5, 1.0, 1.5, 2.0, 2.5, 3.2]  # the first and last lie outside the measured interval
    g = goodput(arrivals, 1_000_000, t_from=0.4, t_to=3.0)
    assert g["messages"] == 5
    assert g["bytes"] == 4_000_000
    assert g["measured_s"] == pytest.approx(2.0)
    assert g["received_mbps"] == pytest.approx(16.0)


def test_goodput_needs_two_messages():
    assert "error" in goodput([1.0], 1000, 0.0, 2.0)
    assert "multitcp.seconds" in goodput([5.0, 6.0], 1000, 0.0, 2.0)["error"]


def test_a_message_is_a_window_per_connection():
    assert bulk_message_bytes(4, 259_492) == 4 * 259_492
    assert bulk_message_bytes(1, 1000) == 64 * 1024  # never below the emulated window floor


def test_bulk_over_loopback_with_clamped_windows():
    """Server and client in two threads on 127.0.0.1: every connection is accepted, clamped, read to the end,
    and the goodput is of the measured interval only."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    window, n = 128 * 1024, 3
    out: dict = {}
    srv = threading.Thread(target=lambda: out.update(bulk_server("127.0.0.1", port, n, window, 0.1, 0.3)))
    srv.start()
    sent = bulk_client("127.0.0.1", port, n, window, 0.1, 0.3)
    srv.join(10)
    assert not srv.is_alive()
    assert "error" not in out, out
    assert out["connections"] == n and out["window"] == window
    assert sent["message_bytes"] == n * window
    assert sent["tcp_rtt_ms"] > 0  # the kernel's smoothed RTT of the connections, sampled while measured
    assert out["bytes"] == (out["messages"] - 1) * sent["message_bytes"]
    assert 2 <= out["messages"] < sent["messages"]  # the warm-up and the tail are left out
    assert 0 < out["measured_s"] <= 0.3

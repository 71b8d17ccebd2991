"""The control relay between machines (testbed/cluster/relay.py) on real sockets, both ends in this process: a
worker's connection reaches the driver with the machine and pid the agent vouched for, bytes flow both ways, and
a stranger (a pid the agent did not start, a wrong secret, another address) is refused."""

from __future__ import annotations

import json
import os
import queue
import socket

import pytest

from testbed.cluster.relay import AgentRelay, DriverRelay

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the agent accepts root workers only (run as root)")


@pytest.fixture
def relays(tmp_path):
    got: queue.Queue = queue.Queue()
    driver = DriverRelay("127.0.0.1", {"m1": "127.0.0.1"}, "s3cret", lambda c, m, p: got.put((c, m, p)))
    pids = {os.getpid()}
    agent = AgentRelay(str(tmp_path / "ctl.sock"), "m1", tuple(driver.address), "s3cret", lambda: pids)
    yield agent, driver, got, pids
    agent.close()
    driver.close()


def test_a_workers_connection_reaches_the_driver_vouched_for(relays) -> None:
    agent, _driver, got, _pids = relays
    w = socket.socket(socket.AF_UNIX)
    w.connect(agent.path)
    w.sendall(b"hello")
    c, machine, pid = got.get(timeout=10)
    assert (machine, pid) == ("m1", os.getpid())
    c.settimeout(10)
    assert c.recv(5) == b"hello"
    c.sendall(b"go")
    w.settimeout(10)
    assert w.recv(2) == b"go"
    for s in (w, c):
        s.close()


def test_a_process_the_agent_did_not_start_is_refused(relays) -> None:
    agent, _driver, got, pids = relays
    pids.clear()
    w = socket.socket(socket.AF_UNIX)
    w.connect(agent.path)
    w.settimeout(10)
    assert w.recv(1) == b""  # closed by the agent
    with pytest.raises(queue.Empty):
        got.get(timeout=1)


@pytest.mark.parametrize("head", [{"secret": "guess", "machine": "m1", "pid": 1},
                                  {"secret": "s3cret", "machine": "m9", "pid": 1}, {"pid": 1}])
def test_the_driver_refuses_a_wrong_secret_or_machine(relays, head) -> None:
    _agent, driver, got, _pids = relays
    c = socket.create_connection(tuple(driver.address), timeout=10)
    c.sendall(json.dumps(head).encode() + b"\n")
    assert c.recv(1) == b""
    with pytest.raises(queue.Empty):
        got.get(timeout=1)
    assert driver.refused


def test_the_driver_refuses_a_machines_secret_from_another_address() -> None:
    got: queue.Queue = queue.Queue()
    driver = DriverRelay("127.0.0.1", {"m1": "10.9.9.9"}, "s3cret", lambda c, m, p: got.put((c, m, p)))
    try:
        c = socket.create_connection(tuple(driver.address), timeout=10)
        c.sendall(json.dumps({"secret": "s3cret", "machine": "m1", "pid": 1}).encode() + b"\n")
        assert c.recv(1) == b""
        with pytest.raises(queue.Empty):
            got.get(timeout=1)
    finally:
        driver.close()


def test_a_split_links_forwarded_notices_reach_the_other_halfs_sidecar_socket(tmp_path) -> None:
    """One half's sidecar writes to its agent's outbox; the other agent's inbox hands the bytes to its own
    sidecar's Unix socket (`to_unix`), and nothing else."""
    from testbed.cluster.relay import to_unix

    side = socket.socket(socket.AF_UNIX)  # the other half's sidecar
    side.bind(str(tmp_path / "sidecar.sock"))
    side.listen()
    inbox = DriverRelay("127.0.0.1", {"m0": "127.0.0.1"}, "l1nk", to_unix(str(tmp_path / "sidecar.sock")))
    outbox = AgentRelay(str(tmp_path / "fwd.sock"), "m0", tuple(inbox.address), "l1nk", lambda: {os.getpid()})
    try:
        w = socket.socket(socket.AF_UNIX)
        w.connect(outbox.path)
        w.sendall(b"end")
        side.settimeout(10)
        c, _ = side.accept()
        c.settimeout(10)
        assert c.recv(3) == b"end"
        for s in (w, c):
            s.close()
    finally:
        outbox.close()
        inbox.close()
        side.close()

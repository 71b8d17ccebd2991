"""The control plane's building blocks: peer credentials, socket modes, and which process a docker exec
client started (the integration test shows other users refused on a real run)."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys

from testbed.emu.containers import TAG_ENV, ContainerProcess
from testbed.runtime.access import listen_unix, peer_cred


def test_peer_cred_is_the_connecting_process():
    a, b = socket.socketpair(socket.AF_UNIX)
    with a, b:
        assert peer_cred(a) == (os.getpid(), os.getuid(), os.getgid())


def test_listen_unix_is_0660_in_the_given_group(tmp_path):
    path = str(tmp_path / "s.sock")
    srv = listen_unix(path, os.getgid())
    with srv:
        st = os.stat(path)
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == os.getgid()
        c = socket.socket(socket.AF_UNIX)
        c.connect(path)
        conn, _ = srv.accept()
        with c, conn:
            assert peer_cred(conn)[0] == os.getpid()


def test_listen_unix_without_a_group_stays_private(tmp_path):
    path = str(tmp_path / "s.sock")
    with listen_unix(path, None):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_container_process_owns_only_its_tagged_process():
    cp = ContainerProcess.__new__(ContainerProcess)  # the tag logic, without a Docker engine
    cp.tag, cp.ns_pid = "0123456789abcdef", os.getpid()
    tagged = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                              env={**os.environ, TAG_ENV: cp.tag})
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"],
                             env={**os.environ, TAG_ENV: "someone-else"})
    try:
        import time

        deadline = time.monotonic() + 10
        while not cp.owns(tagged.pid) and time.monotonic() < deadline:  # until the child has exec'd
            time.sleep(0.05)
        assert cp.owns(tagged.pid)
        assert not cp.owns(other.pid) and not cp.owns(os.getpid())
        assert cp.inner_pids() == [tagged.pid]
    finally:
        for p in (tagged, other):
            p.kill()
            p.wait()

"""A run's control plane lets no one else in: its directory is 0750 and its sockets 0660 in the run's
group, the orchestrator's control socket accepts only the worker processes the run started (checked
with SO_PEERCRED), and the BubbleTea service (and the sidecar, same server) only the run's users."""

from __future__ import annotations

import contextlib
import grp
import json
import os
import stat
import subprocess
import sys

import pytest

from testbed.emu import state
from testbed.emu.build import down, up
from testbed.emu.rungroup import GROUP, secure_dir
from testbed.emu.train import Controller
from testbed.spec.load import load_topology
from tests.integration.conftest import snapshot_of, write_topology

# A client that needs nothing but the standard library (it runs as `nobody`, too): connect, say hello as
# worker s0r0, then report whether the server kept the connection (it answers) or closed it.
CLIENT = r"""
import json, socket, struct, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except OSError as e:
    print("connect failed:", e.strerror, flush=True)
    sys.exit(3)
print("connected", flush=True)
body = json.dumps(json.loads(sys.argv[2])).encode()
s.settimeout(60)
try:
    s.sendall(struct.pack("!I", len(body)) + body)
    print("answered" if s.recv(4) else "closed", flush=True)
except OSError as e:
    print("closed:", e.strerror, flush=True)
"""
HELLO = json.dumps({"hello": [0, 0]})
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534"]


def client(argv_prefix: list[str], path: str, msg: str = HELLO, **kw) -> subprocess.Popen:
    p = subprocess.Popen([*argv_prefix, sys.executable, "-c", CLIENT, path, msg], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, **kw)
    return p


def first_line(p: subprocess.Popen) -> str:
    return p.stdout.readline().strip()  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    before = snapshot_of("gdtbh3")
    e = up(load_topology(write_topology(tmp_path_factory.mktemp("t") / "t.yaml")), prefix="gdtbh3", scale=1)
    yield e
    down(e)
    assert snapshot_of("gdtbh3") == before


def test_run_directory_and_control_socket_belong_to_the_run_group(emu):
    gid = grp.getgrnam(GROUP).gr_gid
    rdir = state.run_dir(emu.prefix)
    st = os.stat(rdir)
    assert stat.S_IMODE(st.st_mode) == 0o750 and st.st_gid == gid and st.st_uid == 0
    ctl = Controller(str(rdir / "ctl-mode.sock"), 1, gid, worker_uid=0)
    try:
        st = os.stat(ctl.path)
        assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == gid
    finally:
        ctl.close()


def test_controller_refuses_other_users_and_processes_it_did_not_start(emu):
    gid = grp.getgrnam(GROUP).gr_gid
    ctl = Controller(str(state.run_dir(emu.prefix) / "ctl.sock"), 1, gid, worker_uid=0)
    procs = []
    try:
        # another local user cannot even reach the socket: the run directory is 0750 root:gdtb
        outsider = client([*NOBODY, "--clear-groups"], ctl.path)
        assert first_line(outsider) == "connect failed: Permission denied"
        # a user in the run's group reaches it, but is no worker this run started: refused by SO_PEERCRED
        member = client([*NOBODY, f"--groups={gid}"], ctl.path)
        procs += [outsider, member]
        assert first_line(member) == "connected"
        # and so is a root process the run did not start, even one that says hello as a real worker
        stranger = client([], ctl.path)
        procs.append(stranger)
        assert first_line(stranger) == "connected"
        # the real worker: started by the run, in its host's namespace, as the netns backend starts workers
        node = emu.host_node("east-h0")
        worker = emu.backend.popen(node, [sys.executable, "-c", CLIENT, ctl.path, HELLO], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
        procs.append(worker)
        assert first_line(worker) == "connected"
        ctl.accept_all({(0, 0): worker}, timeout=30)
        assert list(ctl.conns) == [(0, 0)]
        assert len(ctl.refused) == 2, ctl.refused
        assert f"refused pid {member.pid} (uid 65534, gid 65534): not a process this run started" in ctl.refused[0]
        assert f"refused pid {stranger.pid} (uid 0, gid 0): not a process this run started" in ctl.refused[1]
        assert first_line(member).startswith("closed") and first_line(stranger).startswith("closed")
        ctl.broadcast({"stop": True})
        assert first_line(worker) == "answered"
    finally:
        ctl.close()
        for p in procs:
            p.kill()
            p.wait()


def test_bubbletea_service_refuses_users_the_run_does_not_run_as(emu, tmp_path):
    gid = grp.getgrnam(GROUP).gr_gid
    rdir = state.run_dir(emu.prefix) / "bt"
    rdir.mkdir(exist_ok=True)
    secure_dir(rdir, gid)
    sock = str(rdir / "bubbletea.sock")
    cfg = tmp_path / "bt.json"
    cfg.write_text(json.dumps({"socket": sock, "results": str(tmp_path / "ran.json"), "gid": gid, "peer_uids": [0],
                               "model": "llama2-7b", "layers": 32, "guard_s": 0.001, "slo_s": 2.0, "calibration": None,
                               "workers": {"s0r0": {"dc": "a", "gpu": "H100", "tp": 1, "max_tokens": 10000}},
                               "kv": {"a|a": [0.0001, 1e10]}, "kv_bytes_per_token": 1000.0,
                               "requests": [[7, 0.0, 100, 10, "a"]]}))
    svc = subprocess.Popen([sys.executable, "-m", "testbed.bubbletea.service", str(cfg)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert first_line(svc) == "ready"
        st = os.stat(sock)
        assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == gid
        ask = json.dumps({"op": "jobs", "worker": "s0r0", "iteration": 0, "t_start": 100.0})
        member = client([*NOBODY, f"--groups={gid}"], sock, ask)
        assert first_line(member) == "connected" and first_line(member).startswith("closed")
        worker = client([], sock, ask)  # the run's workers run as root on bare namespaces
        assert first_line(worker) == "connected" and first_line(worker) == "answered"
        worker.wait(10)
    finally:
        svc.terminate()
        _, err = svc.communicate(timeout=10)
    assert f"bubbletea: refused a connection from pid {member.pid} (uid 65534, gid 65534)" in err, err
    assert json.loads((tmp_path / "ran.json").read_text())["rejected"] == 1


def test_a_copied_container_tag_outside_the_container_is_not_ours():
    """The tag is on the docker exec client's command line; a process in another PID namespace (standing in
    for anyone's process outside the container) carrying it is not taken for the container's process."""
    import time

    from testbed.emu.containers import TAG_ENV, ContainerProcess, tagged_pids

    cp = ContainerProcess.__new__(ContainerProcess)
    cp.tag, cp.ns_pid = "feedfacecafebeef", os.getpid()  # "the container" is our own PID namespace here
    p = subprocess.Popen(["unshare", "--pid", "--fork", sys.executable, "-c", "import time; time.sleep(30)"],
                         env={**os.environ, TAG_ENV: cp.tag})
    try:
        deadline = time.monotonic() + 10
        while len(tagged_pids(cp.tag)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        both = tagged_pids(cp.tag)  # unshare (our namespace) and its child (a new one)
        assert len(both) == 2 and p.pid in both
        assert cp.inner_pids() == [p.pid]
        assert not cp.owns(next(x for x in both if x != p.pid))
    finally:
        for pid in tagged_pids(cp.tag):  # the child in the new namespace outlives a killed unshare
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        p.wait()

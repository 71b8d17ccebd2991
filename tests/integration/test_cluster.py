"""A cluster emulation's failure paths on two local machines (containers with Ray: testbed/cluster/local.py):
a cluster network too small for the tunnels' packets fails the build naming the link and the machine and leaves
nothing on either machine; a driver killed outright leaves its parts behind, and `testbed clean --cluster`
removes them from every machine; a capture on a cluster is refused before anything is built; a training
run across the two machines counts each replica's traffic on both halves of each tunnel.
(`make cluster-demo` runs the measured three-machine case.)"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.cluster.local import LocalCluster, running, unavailable
from tests.conftest import ROOT

WHY = unavailable()
pytestmark = pytest.mark.skipif(bool(WHY), reason=f"local cluster: {WHY}")
PREFIX = "gdtbct"
TOPO = ROOT / "experiments" / "emu-3dc-topology.yaml"
TESTBED = str(Path(sys.executable).with_name("testbed"))


@pytest.fixture(scope="module")
def machines(tmp_path_factory):
    out = tmp_path_factory.mktemp("cluster")
    lc = LocalCluster(PREFIX, 2, subnet="10.250.33.0/24")
    with running(lc, ROOT, out):
        (out / "cluster.yaml").write_text("ray_address: auto\n")
        yield lc, out


def run_testbed(lc: LocalCluster, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return lc.driver(ROOT, [TESTBED, *args], timeout)




@contextlib.contextmanager
def held_up(lc: LocalCluster, out: Path):
    """`topology up --cluster` from m0, held, its driver's pid in m0's /tmp/driver.pid; yields once it is up."""
    cmd = (f"cd {ROOT} && echo $$ > /tmp/driver.pid && exec {TESTBED} topology up {TOPO} --scale 50 --prefix "
           f"{PREFIX} --cluster {out / 'cluster.yaml'}")
    with subprocess.Popen(["docker", "exec", lc.name(0), "sh", "-c", cmd], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as p:
        deadline = time.monotonic() + 240
        for line in p.stdout:  # type: ignore[union-attr]
            if "is up" in line or time.monotonic() > deadline:
                break
        yield p


def set_mtu(lc: LocalCluster, mtu: int) -> None:
    for i in range(lc.count):
        lc.exec(i, ["ip", "link", "set", "dev", "eth0", "mtu", str(mtu)])


def test_a_cluster_network_without_jumbo_frames_fails_naming_the_machine_and_leaves_nothing(machines) -> None:
    lc, out = machines
    set_mtu(lc, 1500)
    try:
        p = run_testbed(lc, "topology", "up", str(TOPO), "--scale", "50", "--prefix", PREFIX, "--cluster",
                       str(out / "cluster.yaml"), "--no-hold")
    finally:
        set_mtu(lc, lc.mtu)
    assert p.returncode != 0
    assert "machine m" in p.stdout + p.stderr and "MTU" in p.stdout + p.stderr, p.stdout + p.stderr
    assert lc.leftovers() == []


def test_clean_cluster_removes_what_a_killed_driver_left_on_every_machine(machines) -> None:
    lc, out = machines
    with held_up(lc, out) as p:
        lc.exec(0, ["sh", "-c", "kill -9 $(cat /tmp/driver.pid)"])
        p.wait(30)
    left = lc.leftovers()
    assert any(f"{PREFIX}-useast-h0" in ln for ln in left) and any(f"{PREFIX}-uscentral-h0" in ln for ln in left)
    c = run_testbed(lc, "clean", "--cluster", str(out / "cluster.yaml"), "--prefix", PREFIX)
    assert c.returncode == 0, c.stdout + c.stderr
    assert "m0: removed" in c.stdout and "m1: removed" in c.stdout
    assert lc.leftovers() == []


def test_a_capture_on_a_cluster_says_not_yet_before_building(machines) -> None:
    lc, out = machines
    p = run_testbed(lc, "experiment", "run", str(ROOT / "experiments" / "emu-3dc.yaml"), "--cluster",
                    str(out / "cluster.yaml"), "--capture", "--out", str(out / "exp"))
    assert p.returncode == 3 and "not yet with --capture" in p.stdout + p.stderr, p.stdout + p.stderr
    assert not (out / "exp").exists()
    assert lc.leftovers() == []


def test_a_training_run_across_two_machines_shapes_each_replica_on_both_halves_of_a_tunnel(machines) -> None:
    """useast and uswest on m0, uscentral on m1: both pipeline hops cross a tunnel, and the WAN link between
    useast and uswest is built whole on m0 beside them."""
    import csv

    lc, out = machines
    p = run_testbed(lc, "experiment", "run", str(ROOT / "experiments" / "emu-3dc.yaml"), "--cluster",
                    str(out / "cluster.yaml"), "--prefix", PREFIX, "--set", "schedulers=[pp-wan]", "--set",
                    "iterations=2", "--no-probe", "--out", str(out / "train"), timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    with open(out / "train" / "summary.csv") as f:
        emu = [r for r in csv.DictReader(f) if r["source"] == "emu"]
    assert len(emu) == 1 and float(emu[0]["iteration_s"]) > 0
    with open(out / "train" / "flows.csv") as f:
        sent: dict[tuple[str, str, str], int] = {}
        for r in csv.DictReader(f):
            key = (r["link"], r["towards"], r["replica"])
            sent[key] = max(sent.get(key, 0), int(r["wire_bytes"]))
    for link, ends in (("useast-uscentral", ("useast", "uscentral")), ("uscentral-uswest", ("uscentral", "uswest"))):
        for towards in ends:  # each direction's classes live on the half that sends into the tunnel
            for replica in ("0", "1"):
                assert sent.get((link, towards, replica), 0) > 0, (link, towards, replica, sorted(sent))
    assert lc.leftovers() == []


def test_a_machine_killed_mid_run_is_named_and_the_others_are_cleaned(machines) -> None:
    """Last in this file: it kills m1 for good. The held run must end naming m1; `clean --cluster` must clean m0:
    with every alive node it warns about m1 (dead, or not answering while Ray still lists it), with the machines
    listed it ends with a one-line error naming m1 (and no other machine)."""
    lc, out = machines
    with held_up(lc, out) as p:
        subprocess.run(["docker", "kill", lc.name(1)], check=True, stdout=subprocess.DEVNULL)
        rest, _ = p.communicate(timeout=180)
    assert p.returncode != 0 and "machine m1" in rest, rest[-1000:]
    c = run_testbed(lc, "clean", "--cluster", str(out / "cluster.yaml"), "--prefix", PREFIX)  # every alive node
    said = c.stdout + c.stderr
    assert c.returncode == 0 and "1 machine(s)" in said, said[-1000:]
    deadline = time.monotonic() + 60  # Ray marks the node dead after its missed heartbeats
    while f"node {lc.address(1)} as dead" not in said and time.monotonic() < deadline:
        time.sleep(5)
        said = (c := run_testbed(lc, "clean", "--cluster", str(out / "cluster.yaml"), "--prefix", PREFIX)).stderr
    assert f"node {lc.address(1)} as dead: not cleaned" in said, said[-1000:]
    listed = out / "listed.yaml"  # the machines named: the dead one is an error that names it, and only it
    listed.write_text("machines:\n" + "".join(f"  - {{name: m{i}, address: {lc.address(i)}}}\n" for i in (0, 1)))
    c = run_testbed(lc, "clean", "--cluster", str(listed), "--prefix", PREFIX)
    said = c.stdout + c.stderr
    assert c.returncode != 0 and "not cleaned: machine m1 " in said and "machine m0 " not in said, said[-1000:]
    assert lc.leftovers([0]) == []

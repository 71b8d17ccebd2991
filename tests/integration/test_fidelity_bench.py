"""The fidelity bench on one small random topology (real namespaces, tc, TCP, workers), and the sidecar's raw
netlink class change against what tc reads back."""

from __future__ import annotations

import csv
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.integration.conftest import snapshot_of

PREFIX = "gdtbf9"
UNITS = {"bit": 1, "Kbit": 1e3, "Mbit": 1e6, "Gbit": 1e9}


def bits(text: str) -> float:
    """A rate as tc prints it (`201475Kbit`), in bits/s."""
    num, unit = re.fullmatch(r"(\d+)(\w+)", text).groups()  # type: ignore[union-attr]
    return float(num) * UNITS[unit]


def test_fidelity_bench_runs_one_topology_and_leaves_nothing(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "fidelity.py"), "--seed", "2", "--topologies", "1",
                        "--iterations", "2", "--prefix", PREFIX, "--out", str(tmp_path)],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = list(csv.DictReader((tmp_path / "fidelity.csv").read_text().splitlines()))
    assert [x["scheduler"] for x in rows] == ["pp-wan", "pp-wan+mtcp", "atlas"]
    for x in rows:
        sim, emu, err = float(x["sim_s"]), float(x["emu_s"]), float(x["error"])
        assert sim > 0 and emu > 0 and float(x["emu_min_s"]) <= emu <= float(x["emu_max_s"])
        assert err == round((sim - emu) / emu, 6) or abs(err - (sim - emu) / emu) < 1e-5
    assert (tmp_path / "fidelity.png").stat().st_size > 0
    assert "total wall time" in r.stdout and "median |err|" in r.stdout
    assert snapshot_of(PREFIX) == {"netns": set(), "links": set(), "iptables": set(), "procs": set()}


def test_sidecar_class_change_is_what_tc_reads_back():
    from testbed.runtime.htb import wire_bps

    ns = f"{PREFIX}-htb"

    def run(*argv: str) -> str:
        return subprocess.run(["ip", "netns", "exec", ns, *argv], capture_output=True, text=True, check=True).stdout

    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        run("ip", "link", "add", "d0", "type", "veth", "peer", "name", "d1")
        run("ip", "link", "set", "d0", "up")
        run("tc", "qdisc", "add", "dev", "d0", "root", "handle", "1:", "htb", "default", "10")
        run("tc", "class", "add", "dev", "d0", "parent", "1:", "classid", "1:1", "htb", "rate", "200mbit")
        run("tc", "class", "add", "dev", "d0", "parent", "1:1", "classid", "1:100", "htb", "rate", "2mbit", "ceil",
            "200mbit")
        code = ("import sys, socket\nfrom testbed.runtime.htb import ClassChanger\n"
                "c = ClassChanger()\nc.set(socket.if_nametoindex('d0'), 0x100, 2e8, 2e8, 0, 9000)\n"
                "c.set(socket.if_nametoindex('d0'), 0x100, 3e6, 2e8, 5, 9000)\n")
        run(sys.executable, "-c", code)
        out = run("tc", "-d", "class", "show", "dev", "d0", "classid", "1:100")
        got = dict(re.findall(r"\b(prio|rate|ceil|quantum) (\d+\w*)", out))
        assert got["prio"] == "5", out
        assert got["quantum"] == "18028", out  # the link's quantum survives a change (runtime/htb.py link_quantum)
        assert bits(got["rate"]) == pytest.approx(wire_bps(3e6), rel=1e-3), out
        assert bits(got["ceil"]) == pytest.approx(wire_bps(2e8), rel=1e-3), out
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)

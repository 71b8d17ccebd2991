"""`testbed launch --cluster` on three local machines (containers with Ray: testbed/cluster/local.py), one DC each,
placed so that the first rank's DC is not on the driver's machine. The job is a script that exists only on the
driver's machine (m0): it prints where it runs, then runs examples/diloco.py (DDP across the three DCs, a few
steps). Every rank must run on its DC's machine, the script must reach m1 and m2 as a copy, the job's WAN traffic
must cross the tunnels (a counter on each machine's VXLAN packets), every exit status and rank 0's file must come
back to the driver's machine, and nothing may be left on any machine. A rank that fails must stop every machine's
ranks; so must SIGTERM to the driver."""

from __future__ import annotations

import csv
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.cluster.local import LocalCluster, running, unavailable
from tests.conftest import ROOT

WHY = unavailable()
pytestmark = pytest.mark.skipif(bool(WHY), reason=f"local cluster: {WHY}")
PREFIX = "gdtbl"
TESTBED = str(Path(sys.executable).with_name("testbed"))
PLACEMENT = {"useast": "m2", "uscentral": "m0", "uswest": "m1"}  # rank 0 (useast) on another machine than the driver
TOPOLOGY = """name: launch-3dc
tcp_window_mb: 6
dcs:
- {name: useast, gpus: 1, hosts: 1}
- {name: uscentral, gpus: 1, hosts: 1}
- {name: uswest, gpus: 1, hosts: 1}
links:
- {between: [useast, uscentral], gbps: 10, latency_ms: 14}
- {between: [uscentral, uswest], gbps: 10, latency_ms: 19}
- {between: [useast, uswest], gbps: 10, latency_ms: 33}
"""
JOB = f"""import os, runpy, socket, sys
print(f"machine={{socket.gethostname()}} dc={{os.environ['TESTBED_DC']}} master={{os.environ['MASTER_ADDR']}} "
      f"nccl_debug={{os.environ.get('NCCL_DEBUG')}}", flush=True)
if sys.argv[1] in ("fail", "hang"):  # `fail N`: rank N fails, the others would run forever; `hang`: all do
    import time
    sys.exit(3) if sys.argv[1:] == ["fail", os.environ["RANK"]] else time.sleep(600)
example = "{ROOT}/examples/diloco.py"
sys.path.insert(0, os.path.dirname(example))
sys.argv = [example, *sys.argv[1:]]
runpy.run_path(example, run_name="__main__")
"""
COUNT = ["OUTPUT", "-p", "udp", "--dport", "4789", "-m", "comment", "--comment", PREFIX, "-j", "ACCEPT"]
LAUNCHED = re.compile(r"^\[r(\d) (\w+)-h0\] machine=gdtbl-(m\d) dc=(\w+) master=(\S+) nccl_debug=WARN$", re.M)


@pytest.fixture(scope="module")
def machines(tmp_path_factory):
    out = tmp_path_factory.mktemp("cluster-launch")
    lc = LocalCluster(PREFIX, 3, subnet="10.250.36.0/24")
    with running(lc, ROOT, out):
        (out / "cluster.yaml").write_text(
            "machines:\n" + "".join(f"  - {{name: m{i}, address: {lc.address(i)}}}\n" for i in range(3))
            + "placement: {" + ", ".join(f"{dc}: {m}" for dc, m in PLACEMENT.items()) + "}\n")
        (out / "topo.yaml").write_text(TOPOLOGY)
        lc.exec(0, ["sh", "-c", f"mkdir -p /job && cat > /job/job.py << 'EOF'\n{JOB}EOF"])  # only on m0
        yield lc, out


def launch_argv(out: Path, to: str, *job: str) -> list[str]:
    return [TESTBED, "launch", str(out / "topo.yaml"), "--cluster", str(out / "cluster.yaml"), "--prefix", PREFIX,
            "--scale", "50", "--out", to, "--", "python", "job.py", *job]


def launch(lc: LocalCluster, out: Path, to: str, *job: str) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", "exec", "-w", "/job", "-e", "NCCL_DEBUG=WARN", lc.name(0),
                           *launch_argv(out, to, *job)], capture_output=True, text=True, timeout=300)


def tunnel_bytes(lc: LocalCluster) -> list[int]:
    """Each machine's VXLAN bytes sent since the counting rule went in."""
    return [int(lc.exec(i, ["iptables", "-L", "OUTPUT", "-v", "-x", "-n"]).split(f"/* {PREFIX} */")[0]
                .splitlines()[-1].split()[1]) for i in range(lc.count)]


def ranks(text: str) -> dict[str, dict]:
    return {r["rank"]: r for r in csv.DictReader(text.splitlines())}


def assert_nothing_left(lc: LocalCluster) -> None:
    assert lc.leftovers(state=True) == []
    for i in range(lc.count):
        procs = lc.exec(i, ["ps", "-eo", "args"])
        assert "job.py" not in procs, (lc.name(i), procs)
        assert lc.exec(i, ["sh", "-c", f"ls /run/gdtb/{PREFIX} 2>&1 || true"]).strip().endswith(
            "No such file or directory")


def test_a_torch_job_runs_each_rank_on_its_dcs_machine_across_the_tunnels(machines) -> None:
    lc, out = machines
    for i in range(lc.count):
        lc.exec(i, ["iptables", "-I", *COUNT])
    try:
        # --out in m0's own /tmp: the machines share no folder for it
        p = launch(lc, out, "/tmp/ddp", "--method", "ddp", "--steps", "4", "--inner-steps", "2", "--layers", "1")
        sent = tunnel_bytes(lc)
    finally:
        for i in range(lc.count):
            lc.exec(i, ["iptables", "-D", *COUNT], check=False)
    said = p.stdout + p.stderr
    assert p.returncode == 0, said[-3000:]
    ran = {m[1]: m.groups()[1:] for m in LAUNCHED.finditer(said)}
    assert sorted(ran) == ["0", "1", "2"], said[-3000:]
    for rank, (dc, machine, dc_env, _) in ran.items():
        assert dc == dc_env and machine == PLACEMENT[dc], (rank, ran[rank])  # the rank ran on its DC's machine
    assert {m for _, m, _, _ in ran.values()} == {"m0", "m1", "m2"}
    assert {master for *_, master in ran.values()} == {"10.80.0.1"}  # useast-h0's emulated address, on m2
    carried = re.findall(r"^\[(m\d)\] /job/job\.py -> /run/gdtb/gdtbl/launch/arg1/job\.py", said, re.M)
    assert sorted(carried) == ["m1", "m2"], said[-3000:]  # m0 holds the script itself
    # DDP's gradients: at least 4 steps x 2/3 of the model (~200 KB) sent by each rank, through its VXLAN device
    assert all(b > 4 * 150_000 for b in sent), sent
    rows = ranks(lc.exec(0, ["cat", "/tmp/ddp/ranks.csv"]))
    assert {r: (rows[r]["dc"], rows[r]["exit_code"], rows[r]["stopped_by_launch"]) for r in rows} == {
        "0": ("useast", "0", "0"), "1": ("uscentral", "0", "0"), "2": ("uswest", "0", "0")}
    log = lc.exec(0, ["cat", "/tmp/ddp/launch.log"])
    assert all(f"[r{r} " in log for r in range(3))
    # rank 0's own record, written on m2, brought back to the driver's folder on m0 (and only that file)
    assert "[m2] brought back 1 file(s)" in said and "[m1] brought back" not in said, said[-3000:]
    assert len(list(csv.DictReader(lc.exec(0, ["cat", "/tmp/ddp/ddp.csv"]).splitlines()))) >= 1
    assert lc.exec(0, ["sh", "-c", "ls -A /tmp/ddp | grep -c testbed-launch || true"]).strip() == "0"
    assert_nothing_left(lc)


def test_a_rank_that_fails_stops_every_machines_ranks(machines) -> None:
    lc, out = machines
    p = launch(lc, out, str(out / "fail"), "fail", "2")  # a folder every machine shares
    said = p.stdout + p.stderr
    assert p.returncode == 3, said[-3000:]
    assert "rank 2 (uswest-h0, uswest on machine m1) exited with status 3" in said, said[-3000:]
    rows = ranks((out / "fail" / "ranks.csv").read_text())
    assert "brought back" not in said
    assert (rows["2"]["exit_code"], rows["2"]["stopped_by_launch"]) == ("3", "0")
    for r in ("0", "1"):  # killed by the launch's SIGTERM, on m2 and m0
        assert (rows[r]["exit_code"], rows[r]["stopped_by_launch"]) == ("143", "1"), rows[r]
    assert_nothing_left(lc)


def test_ctrl_c_on_the_driver_stops_every_machines_ranks(machines) -> None:
    """SIGTERM (as Ctrl-C) to the driver once every rank has said where it runs: every rank is stopped, every
    machine's part torn down."""
    lc, out = machines
    cmd = f"cd /job && echo $$ > /tmp/launch.pid && exec {shlex.join(launch_argv(out, str(out / 'hang'), 'hang'))}"
    with subprocess.Popen(["docker", "exec", lc.name(0), "sh", "-c", cmd], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True) as p:
        seen = []
        for line in p.stdout:  # type: ignore[union-attr]
            seen.append(line)
            if sum("machine=gdtbl-" in ln for ln in seen) == 3:
                break
        lc.exec(0, ["sh", "-c", "kill -TERM $(cat /tmp/launch.pid)"])
        rest, _ = p.communicate(timeout=60)
    said = "".join(seen) + rest
    assert p.returncode == 130 and "interrupted: every rank stopped" in said, said[-3000:]
    assert_nothing_left(lc)

"""An agent's ranks of a cluster launch (testbed/cluster/ranks.py RankHost) as real processes: started with their
environment, their lines drained before their exit, and `stop` ending every rank still running with everything it
started. The backend here runs each command on this machine without a namespace (the namespaces are the
integration test's: tests/integration/test_cluster_launch.py), so this needs no root."""

from __future__ import annotations

import sys
import time

import pytest

from testbed.cluster.ranks import Carried, RankHost
from testbed.emu.backends.base import Backend, Node
from testbed.emu.build import Emulation
from testbed.emu.containers import tagged_pids
from testbed.emu.names import address_plan
from testbed.launch.ranks import layout
from tests.test_launch_pure import TOPO

JOB = """import os, subprocess, sys, time
rank = int(os.environ["RANK"])
print(f"rank {rank} of {os.environ['WORLD_SIZE']} says {sys.argv[1]}", flush=True)
if rank == 0:
    print("second line", flush=True)
elif rank == 1:  # a child that outlives no stop: it carries the rank's tag
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    time.sleep(60)
elif rank == 2:
    time.sleep(0.3)
    sys.exit(3)
"""


class Here(Backend):
    """Commands run on this machine as they are."""

    name = "here"
    persistent = False

    def add_node(self, name: str, role: str) -> Node:
        self.nodes[name] = Node(name, role, ns=name)
        return self.nodes[name]

    def link(self, a, a_if, b, b_if, mtu) -> None:
        raise NotImplementedError

    def attach_lan(self, index, gw, hosts, mtu) -> str:
        raise NotImplementedError

    def argv(self, node: Node, argv: list[str]) -> list[str]:
        return argv

    def teardown(self) -> None:
        self.nodes.clear()


@pytest.fixture
def host(tmp_path):
    addr = address_plan(TOPO, "gdtbl")
    be = Here("gdtbl")
    for h in addr.hosts:
        be.add_node(h.ns, "host")
    emu = Emulation("gdtbl", TOPO, be, addr, 50.0, "none")
    rh = RankHost(emu, tmp_path / "launch")
    yield rh
    rh.close()


def drain_until(rh: RankHost, ranks: set[int], timeout_s: float = 20) -> tuple[list, list]:
    lines, exits = [], []
    deadline = time.monotonic() + timeout_s
    while not ranks <= {r for r, _, _ in exits} and time.monotonic() < deadline:
        got_lines, got_exits = rh.drain()
        assert all(r not in {e[0] for e in exits} for r, _ in got_lines)  # no line after its rank's exit
        lines += got_lines
        exits += got_exits
        time.sleep(0.05)
    return lines, exits


def test_ranks_report_their_lines_then_their_exit_and_stop_takes_their_children(host, tmp_path):
    (tmp_path / "job.py").write_text(JOB)
    slots = layout(host.emu.addr, 1)[:3]
    envs = {s.rank: {"RANK": str(s.rank), "WORLD_SIZE": "3", "TESTBED_OUT": str(tmp_path / "out")} for s in slots}
    carried = [Carried(1, str(tmp_path / "job.py"), {"job.py": JOB.encode()})]
    notes = host.start(slots, ["python", str(tmp_path / "job.py"), "hello"], envs, str(tmp_path), carried)
    assert notes == [] and (tmp_path / "out").is_dir()  # the same file here: run in place
    lines, exits = drain_until(host, {0, 2})
    assert ("rank 0 of 3 says hello" in [t for r, t in lines if r == 0]) and (0, "second line") in lines
    assert {(r, code) for r, code, _ in exits} == {(0, 0), (2, 3)}
    tag = next(p.tag for p in host.procs if p.slot.rank == 1)
    assert len(tagged_pids(tag)) == 2  # rank 1 and its child
    t0 = time.monotonic()
    rest_lines, rest_exits = host.stop(grace_s=1.0)
    assert time.monotonic() - t0 < 8
    assert [(r, code) for r, code, _ in rest_exits] == [(1, 143)]  # SIGTERM, once
    assert (1, "rank 1 of 3 says hello") in lines + rest_lines
    assert tagged_pids(tag) == []


def test_a_missing_working_folder_runs_the_ranks_in_the_launch_folder_with_the_script_copied(host, tmp_path):
    slots = layout(host.emu.addr, 1)[:1]
    envs = {0: {"RANK": "0", "WORLD_SIZE": "1", "TESTBED_OUT": str(tmp_path / "out")}}
    gone = tmp_path / "elsewhere" / "job.py"  # the driver's path, absent here
    script = "import os; print(os.getcwd())\n"
    carried = [Carried(1, str(gone), {"job.py": script.encode()})]
    notes = host.start(slots, [sys.executable, str(gone)], envs, str(gone.parent), carried)
    assert len(notes) == 2 and "job.py ->" in notes[0] and "no folder" in notes[1]
    lines, exits = drain_until(host, {0})
    assert exits[0][1] == 0 and lines == [(0, str(host.launch_dir))]
    host.close()
    assert not host.launch_dir.exists()


def test_what_the_ranks_wrote_comes_back_unless_the_folder_is_shared(tmp_path):
    import os

    from testbed.cluster.ranks import outputs

    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    (out / "before.csv").write_text("old")
    os.utime(out / "before.csv", (1.0, 1.0))  # written before the launch: not the ranks'
    since = time.time() - 1
    (out / "loss.csv").write_text("step,loss\n")
    (out / "sub" / "big.bin").write_bytes(b"x" * 100)
    files, left = outputs(out, since, ".testbed-launch-abc", max_bytes=50)
    assert files == {"loss.csv": b"step,loss\n"} and left == [str(out / "sub" / "big.bin")]
    files, left = outputs(out, since, ".testbed-launch-abc", max_bytes=1000)
    assert set(files) == {"loss.csv", "sub/big.bin"} and left == []
    (out / ".testbed-launch-abc").touch()  # the driver's own folder, seen from here: nothing to bring
    assert outputs(out, since, ".testbed-launch-abc", max_bytes=1000) == ({}, [])
    assert outputs(tmp_path / "none", since, ".testbed-launch-abc", max_bytes=1000) == ({}, [])

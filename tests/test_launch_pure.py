"""Pure parts of `testbed launch` and of the packet capture: rank layout and environment, NCCL
striping, port blocks, 1 ms flow bins, contention analysis, header parsing, time to target."""

from __future__ import annotations

import pytest

from testbed.analysis.convergence import convergence_row, time_to_target
from testbed.analysis.flows import BIN_S, FlowBins, FlowKey, contention, leader_shares, pending_bins, spread
from testbed.emu.capture import parse_headers
from testbed.emu.names import address_plan
from testbed.errors import SpecError
from testbed.launch.ranks import (
    NCCL_MAX_SOCKETS,
    NCCL_MAX_THREADS,
    layout,
    nccl_striping,
    omp_threads,
    port_ranges,
    rank_env,
)
from testbed.launch.run import describe, exit_code, resolve_command
from testbed.spec.topology import Topology

TOPO = Topology.model_validate({
    "dcs": [{"name": "east", "gpus": 8, "hosts": 2}, {"name": "west", "gpus": 8, "hosts": 2},
            {"name": "mid", "gpus": 8, "hosts": 1}],
    "links": [{"between": ["east", "west"], "gbps": 10, "latency_ms": 20},
              {"between": ["west", "mid"], "gbps": 10, "latency_ms": 5}]})


def test_layout_is_torchrun_node_major_with_contiguous_dcs():
    slots = layout(address_plan(TOPO, "gdtbl1"), 2)
    assert [s.rank for s in slots] == list(range(10))
    assert [(s.host, s.local_rank) for s in slots[:4]] == [("east-h0", 0), ("east-h0", 1), ("east-h1", 0),
                                                          ("east-h1", 1)]
    assert [s.group_rank for s in slots] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    dcs = [s.dc for s in slots]
    assert dcs == sorted(dcs, key=["east", "west", "mid"].index)  # each DC's ranks are one block
    assert {s.replica for s in slots if s.dc == "west"} == {0, 1}
    with pytest.raises(SpecError, match="nproc-per-host"):
        layout(address_plan(TOPO, "gdtbl1"), 0)


def test_rank_env_is_torchruns_on_the_emulated_network():
    slots = layout(address_plan(TOPO, "gdtbl1"), 2)
    env = rank_env(slots[7], slots, master_port=29511, connections=20, dcs=["east", "west", "mid"], gpus=[],
                   in_container=False, out_dir="/o", threads=1)
    assert env["MASTER_ADDR"] == slots[0].ip == "10.80.0.1" and env["MASTER_PORT"] == "29511"
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"], env["GROUP_RANK"]) == \
        ("7", "10", "1", "2", "3")
    assert env["TESTBED_DC"] == "west" and env["TESTBED_HOST"] == "west-h1" and env["TESTBED_REPLICA"] == "1"
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert int(env["NCCL_SOCKET_NTHREADS"]) * int(env["NCCL_NSOCKS_PERTHREAD"]) >= 20
    assert env["NCCL_HOSTID"] == slots[7].ns and env["TESTBED_DEVICE"] == "cpu" and "CUDA_VISIBLE_DEVICES" not in env


def test_gpu_hosts_get_their_pinned_device():
    slots = layout(address_plan(TOPO, "gdtbl1"), 1)
    kw = {"master_port": 1, "connections": 1, "dcs": ["east"], "out_dir": "/o", "threads": 1}
    bare = [rank_env(s, slots, gpus=["0", "1", "2"], in_container=False, **kw) for s in slots]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in bare] == ["0", "1", "2", "0", "1"]
    assert {e["TESTBED_DEVICE"] for e in bare} == {"cuda:0"}
    boxed = rank_env(slots[1], slots, gpus=["0", "1"], in_container=True, **kw)  # --gpus device=N at creation
    assert "CUDA_VISIBLE_DEVICES" not in boxed and boxed["TESTBED_DEVICE"] == "cuda:0"


@pytest.mark.parametrize("n", [1, 2, 7, 16, 17, 40, 64, 500])
def test_nccl_striping_covers_the_plan_within_nccls_limits(n):
    t, s = nccl_striping(n)
    assert 1 <= t <= NCCL_MAX_THREADS and t * s <= NCCL_MAX_SOCKETS
    assert t * s >= min(n, NCCL_MAX_SOCKETS)


def test_port_blocks_are_aligned_disjoint_and_ephemeral():
    ranges = port_ranges(address_plan(TOPO, "gdtbl1"))
    blocks = sorted(ranges.values())
    assert len(blocks) == 5
    for (lo, hi), nxt in zip(blocks, [*blocks[1:], None], strict=True):
        size = hi - lo + 1
        assert size & (size - 1) == 0 and lo % size == 0 and lo >= 32768 and hi <= 65535
        assert nxt is None or nxt[0] > hi


def test_omp_threads_share_the_machine():
    assert omp_threads(16, 6) == 2 and omp_threads(2, 6) == 1


def test_python_means_the_interpreter_with_torch():
    import sys

    assert resolve_command(["python", "t.py", "-x"], False) == [sys.executable, "t.py", "-x"]
    assert resolve_command(["python3", "t.py"], True)[0] == "/opt/gdtb/bin/python"
    assert resolve_command(["./run.sh"], False) == ["./run.sh"]


def test_exit_codes_follow_the_shell():
    assert exit_code(-9) == 137 and exit_code(3) == 3
    assert describe(137) == "status 137 (killed by SIGKILL)" and describe(1) == "status 1"


def test_spread_conserves_bytes_and_ends_at_the_timestamp():
    parts = spread(0.0105, 25_000, 200e6)  # 1 ms on the wire at 200 Mbit/s, ending mid-bin 10
    assert sum(v for _, v in parts) == pytest.approx(25_000)
    assert [b for b, _ in parts] == [9, 10] and parts[0][1] == pytest.approx(12_500)
    assert spread(0.0105, 100, 200e6) == [(10, 100.0)]


def test_flow_bins_sum_per_flow_per_ms():
    fb = FlowBins()
    k = FlowKey("a-b", "b", "10.80.0.1", 40000, "10.80.1.1", 7101)
    for t in (0.0101, 0.0102, 0.0121):
        fb.add(k, t, 1000, 1e12)
    rows = fb.rows()
    assert [(b, v, n) for _, b, v, n in rows] == [(10, 2000.0, 2), (12, 1000.0, 1)] and fb.count == 3


def _bins(pattern: str) -> dict[int, dict[str, float]]:
    """One character per ms: '0' or '1' a replica alone, 'h' half each."""
    out = {}
    for b, c in enumerate(pattern):
        out[b] = {"0": 0.5, "1": 0.5} if c == "h" else {c: 1.0}
    return out


def test_contention_splits_where_the_pending_set_changes():
    pend = pending_bins([("0", 1, 0.0, 0.010), ("1", 1, 0.0, 0.020), ("0", 2, 0.010, 0.020)])
    runs = contention(pend)
    assert [(r[0], r[-1]) for r in runs] == [(0, 9), (10, 19)]
    assert all(len(v) >= 1 for v in pend.values()) and max(pend) == int(0.020 / BIN_S) - 1


def test_leader_share_tells_turns_from_sharing():
    pend = pending_bins([("0", 1, 0.0, 0.020), ("1", 1, 0.0, 0.020)])
    turns = leader_shares(_bins("0" * 20), pend)
    fifo = leader_shares(_bins("00001111000011110000"), pend)  # a FIFO alternating bursts
    fluid = leader_shares(_bins("h" * 20), pend)
    assert min(turns) == 1.0 and sum(fifo) / len(fifo) == pytest.approx(0.6) and set(fluid) == {0.5}
    assert leader_shares(_bins("0" * 20), pend, min_bytes=2.0) == []  # a link that was never busy


def test_parse_headers_matches_scapy():
    from scapy.layers.inet import IP, TCP, UDP
    from scapy.layers.l2 import Ether

    frame = bytes(Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02") / IP(src="10.80.0.1", dst="10.80.1.2")
                  / TCP(sport=40001, dport=7101) / (b"x" * 5000))
    assert parse_headers(frame[:96]) == ("10.80.0.1", "10.80.1.2", 5040, 40001, 7101)
    udp = bytes(Ether() / IP(src="1.2.3.4", dst="5.6.7.8") / UDP(sport=1, dport=2))
    assert parse_headers(udp)[3:] == (1, 2)
    assert parse_headers(b"\x00" * 60) is None


def test_time_to_target_is_the_first_evaluation_at_or_below_it():
    rows = [{"step": "1", "wall_s": "1.0", "eval_loss": ""}, {"step": "5", "wall_s": "5.0", "eval_loss": "2.5"},
            {"step": "10", "wall_s": "9.0", "eval_loss": "1.9"}, {"step": "15", "wall_s": "13.0", "eval_loss": "1.5"}]
    assert time_to_target(rows, 2.0) == (9.0, 10) and time_to_target(rows, 1.0) is None
    assert convergence_row("ddp", rows, 2.0)[:6] == ("ddp", 2.0, 9.0, 10, 1.5, 15)


def test_flow_figures_zoom_on_contention(tmp_path):
    import pandas as pd

    from testbed.figures.launch import captured_flows, contention_window

    rows = [("r", "a-b", "b", t, "s", 1, "d", 2, "a", "b", r, "", 100.0, 1)
            for t in range(900) for r in (("0", "1") if t >= 600 else (str(t // 300),))]
    from testbed.analysis.flows import FLOWS_HEADER

    flows = pd.DataFrame(rows, columns=FLOWS_HEADER)
    lo, hi = contention_window(flows, span_ms=200)
    assert hi - lo == 200 and lo >= 600  # inside the stretch where both replicas share every ms
    assert captured_flows(flows, tmp_path / "f.png", window_ms=(lo, hi)).stat().st_size > 0

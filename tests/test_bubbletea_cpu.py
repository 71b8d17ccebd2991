"""The emulated run's timing health names the CPU BubbleTea's own processes take (testbed/emu/health.py): a
process started with a file of the run's directory as one of BubbleTea's roles, or a worker's KV sender, is
counted; another run's, or training's, is not; the verdict of a run over its budget says how much they took."""

from __future__ import annotations

import subprocess
import sys
import time

from testbed.emu.health import Budget, Health, bubbletea_cpu_s, cpu_share, proc_table, verdict

BURN = "import sys, time\nt = time.process_time() + float(sys.argv[1])\nwhile time.process_time() < t: pass\n"


def _spawn(tmp_path, role: str, run_dir: str, seconds: float) -> subprocess.Popen:
    """A real process whose command line looks like the emulator's `-m role CONFIG` and that burns `seconds` CPU."""
    script = tmp_path / f"{role}.py"
    script.write_text(BURN)
    return subprocess.Popen([sys.executable, str(script), str(seconds), "-m", role, f"{run_dir}/cfg.json"])


def _started(*procs: subprocess.Popen) -> None:
    """Wait until each process runs its own command line (a child just forked still shows pytest's)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        table = proc_table()
        if all((p.pid in table and str(p.args[1]) in table[p.pid][1]) or p.poll() is not None for p in procs):
            return
        time.sleep(0.01)


def test_only_this_runs_bubbletea_processes_are_counted(tmp_path):
    run_dir, other = str(tmp_path / "gdtbx1"), str(tmp_path / "gdtbx2")
    ours = _spawn(tmp_path, "testbed.bubbletea.decode", run_dir, 0.3)
    kv_line = _spawn(tmp_path, "testbed.emu.delayline", f"{run_dir}/wan.kv.delay.json", 0.3)
    training_line = _spawn(tmp_path, "testbed.emu.delayline", f"{run_dir}/wan.delay.json", 0.3)
    foreign = _spawn(tmp_path, "testbed.bubbletea.decode", other, 0.3)
    _started(ours, kv_line, training_line, foreign)
    before = bubbletea_cpu_s(proc_table(), run_dir)
    for p in (ours, kv_line, training_line, foreign):
        p.wait(30)
    assert set(before) == {ours.pid, kv_line.pid}


def test_a_workers_kv_sender_counts_as_its_child(tmp_path):
    run_dir = str(tmp_path / "gdtbx3")
    table = {10: (1, f"python -m testbed.runtime.worker {run_dir}/worker-s0r0.json", 5.0),
             11: (10, "python -m testbed.bubbletea.kvsend 5 {}", 2.0),
             12: (99, "python -m testbed.bubbletea.kvsend 5 {}", 2.0)}  # a sender of another run's worker
    assert bubbletea_cpu_s(table, run_dir) == {11: 2.0}


def test_the_share_is_the_cpu_time_taken_over_the_machines_time(tmp_path):
    run_dir = str(tmp_path / "gdtbx4")
    p = _spawn(tmp_path, "testbed.bubbletea.kvsend", run_dir, 0.4)
    _started(p)
    t0, before = time.monotonic(), bubbletea_cpu_s(proc_table(), run_dir)
    after = before
    while time.monotonic() - t0 < 5 and p.poll() is None:
        after = bubbletea_cpu_s(proc_table(), run_dir)
        time.sleep(0.05)
    p.wait(30)
    wall = time.monotonic() - t0
    used = after[p.pid] - before[p.pid]
    assert used > 0.1  # it burned CPU between the two readings, and the share counts it
    assert abs(cpu_share(before, after, wall, 2) - used / (2 * wall)) < 1e-9


def test_the_verdict_names_bubbleteas_cpu_when_it_exceeds_the_budget():
    over = Budget(0.0, 0.0, 0.0, 0.0, fabric=0.2)
    why = verdict(Health(bubbletea_cpu_share=0.3), over, 0.04)
    assert "most from a slow DC fabric; BubbleTea's own processes took 30% of the CPUs" in why
    assert "BubbleTea" not in verdict(Health(bubbletea_cpu_share=0.01), over, 0.04)
    assert "BubbleTea" not in verdict(Health(), over, 0.04)
    assert verdict(Health(bubbletea_cpu_share=0.3), Budget(0.0, 0.0, 0.0), 0.04) == ""

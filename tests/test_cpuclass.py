"""The emulation's real-time CPU class (testbed/runtime/cpuclass.py): who takes it, what never inherits it, and
the fallback to nice with its one message. Each case runs in a child interpreter of its own, so no pytest thread
ever runs real-time."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from testbed.emu.health import cpu_class_summary
from testbed.runtime.config import WorkerConfig
from testbed.runtime.worker import timed_mode
from tests.conftest import ROOT

root = pytest.mark.skipif(os.geteuid() != 0, reason="SCHED_RR needs root (or CAP_SYS_NICE)")
RR = os.SCHED_RR


def child(code: str, wrap: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter (behind `wrap`, a command that runs it), with the package importable."""
    return subprocess.run([*wrap, sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          cwd="/", env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)


@root
def test_auto_puts_the_calling_thread_in_round_robin_and_nothing_it_starts_inherits_it():
    r = child("""
        import os, subprocess, sys, threading
        from testbed.runtime import cpuclass
        from testbed.runtime.lowcpu import lowest_cpu_priority
        print(cpuclass.enter("auto", cpuclass.LINK_PRIORITY, -10, "t"))
        print(os.sched_getscheduler(0) & ~os.SCHED_RESET_ON_FORK, os.sched_getparam(0).sched_priority)
        seen = {}
        def plain():
            seen["thread"] = os.sched_getscheduler(0)
        def kv():
            cpuclass.enter("auto", cpuclass.WORKER_PRIORITY)  # even a thread that had the class leaves it
            lowest_cpu_priority()
            seen["kv"] = os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        for f in (plain, kv):
            t = threading.Thread(target=f); t.start(); t.join()
        print(seen["thread"], *seen["kv"])
        print(subprocess.run([sys.executable, "-c", "import os; print(os.sched_getscheduler(0))"],
                             capture_output=True, text=True).stdout.strip())
    """)
    assert r.returncode == 0, r.stderr
    got, policy, thread, child_proc = r.stdout.split("\n")[:4]
    assert got == "realtime" and policy.split() == [str(RR), "2"]
    assert thread.split() == [str(os.SCHED_OTHER), str(os.SCHED_OTHER), "19"]  # a new thread, and KV shipping
    assert child_proc == str(os.SCHED_OTHER)  # a process it starts
    assert r.stderr == ""  # nothing to say when the class was had


def test_off_keeps_the_nice_value_and_says_nothing():
    r = child("""
        import os, threading
        from testbed.runtime import cpuclass
        print(cpuclass.enter("off", 2, 5, "t"), os.sched_getscheduler(0),
              os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
    """)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["nice", str(os.SCHED_OTHER), "5"] and r.stderr == ""


def test_without_rt_throttling_auto_falls_back_once_and_on_refuses(tmp_path):
    off = tmp_path / "sched_rt_runtime_us"
    off.write_text("-1\n")
    r = child(f"""
        import os
        from testbed.runtime import cpuclass
        print(cpuclass.enter("auto", 1, None, "delay line", rt_runtime_path={str(off)!r}))
        print(cpuclass.enter("auto", 1, None, "delay line", rt_runtime_path={str(off)!r}), os.sched_getscheduler(0))
        try:
            cpuclass.enter("on", 1, None, "delay line", rt_runtime_path={str(off)!r})
        except cpuclass.RealtimeError as e:
            print(e)
    """)
    assert r.returncode == 0, r.stderr
    first, second, refused = r.stdout.strip().split("\n")
    assert first == "nice" and second.split() == ["nice", str(os.SCHED_OTHER)]
    assert r.stderr.count("no real-time CPU class") == 1 and "throttling is off" in r.stderr  # once per process
    assert "throttling is off" in refused and "emulation.realtime: auto or off" in refused


@root
@pytest.mark.skipif(not shutil.which("setpriv"), reason="needs util-linux's setpriv")
def test_a_process_without_the_privilege_falls_back_to_nice_and_says_why():
    no_sys_nice = ("setpriv", "--bounding-set", "-sys_nice", "--inh-caps", "-sys_nice")  # root as in a container
    r = child("""
        import os, resource
        resource.setrlimit(resource.RLIMIT_RTPRIO, (0, 0))
        from testbed.runtime import cpuclass
        print(cpuclass.enter("auto", 1, 3, "worker"), os.sched_getscheduler(0))
    """, no_sys_nice)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["nice", str(os.SCHED_OTHER)]
    assert "worker: no real-time CPU class (SCHED_RR refused" in r.stderr and "nice 3" in r.stderr


def test_obstacle_reads_the_throttling_setting(tmp_path):
    from testbed.runtime.cpuclass import check_mode, obstacle

    f = tmp_path / "rt"
    f.write_text("950000\n")
    assert obstacle(str(f)) == ""
    assert "cannot read" in obstacle(str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="use one of auto, on, off"):
        check_mode("always")


def test_torch_workers_never_take_the_class_and_bad_modes_are_refused():
    from testbed.program import Program, ProgramError

    prog = Program(group="s0r0", stage=0, replica=0, dc="a", host=0, port=7000, offset_s=0.0, steps=(), pipes=())
    cfg = WorkerConfig(program=prog, ip="10.0.0.1", peers={}, scale=1.0, compute="modeled", dp=1, host_index=0,
                       sidecars={}, realtime="auto")
    assert timed_mode(cfg) == "auto"
    assert timed_mode(WorkerConfig(**{**cfg.__dict__, "compute": "torch"})) == "off"  # its compute spins
    assert WorkerConfig.from_json(cfg.to_json()).realtime == "auto"
    with pytest.raises(ProgramError, match="realtime 'always'"):
        WorkerConfig.from_json(cfg.to_json().replace('"realtime":"auto"', '"realtime":"always"'))


def test_the_summary_names_the_class_every_process_ran_in():
    assert cpu_class_summary({}) == ""
    assert cpu_class_summary({"worker 0.0": "realtime", "delay line a-b": "realtime"}) == "realtime"
    assert cpu_class_summary({"worker 0.0": "nice"}) == "nice"
    assert cpu_class_summary({"worker 0.0": "realtime", "w": "nice", "x": "realtime"}) == "mixed (2 of 3 realtime)"


def test_the_spec_option_takes_three_modes_and_yamls_bare_on_and_off():
    from pydantic import ValidationError

    from testbed.spec.experiment import EmulationOptions

    assert EmulationOptions().realtime == "auto"
    assert EmulationOptions(realtime="on").realtime == "on"
    assert [EmulationOptions(realtime=b).realtime for b in (True, False)] == ["on", "off"]  # `realtime: on` in YAML
    with pytest.raises(ValidationError, match="realtime"):
        EmulationOptions(realtime="yes")

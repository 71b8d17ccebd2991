"""An emulated run's timing health (testbed/emu/health.py): late waits and late releases are measured as late, a
timing error over the budget marks the run degraded, and the figures and report show it."""

from __future__ import annotations

import signal
import socket
import threading
import time

import pandas as pd
import pytest

from testbed.emu import delayline
from testbed.emu.health import (
    Health,
    PathLink,
    WaitTotals,
    budget,
    critical_steps,
    lag_over,
    procs_running,
    qdisc_drops,
    steal_share,
    summary_fields,
    verdict,
)
from testbed.runtime.worker import Modeled, WaitStats


def test_a_late_wait_is_measured_as_late():
    """A signal handler that holds the process 30 ms, 5 ms into a 20 ms modeled wait: the wait ends about 15 ms
    late (the sleep resumes towards its deadline), and its lateness is what the worker reports."""
    comp = Modeled(cfg=None)  # type: ignore[arg-type]  (wait() reads no configuration)
    old = signal.signal(signal.SIGALRM, lambda *_: time.sleep(0.03))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.005)
        comp.wait(0.02)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    n, late_sum, late_max, err_sum = comp.waits.as_list()
    assert n == 1
    assert late_max >= 0.01 and late_sum == late_max and err_sum == late_sum


def test_an_early_wait_counts_against_the_signed_sum_only():
    w = WaitStats()
    w.add(0.010, 0.008)
    w.add(0.010, 0.013)
    assert w.n == 2 and w.late_sum_s == pytest.approx(0.003) and w.err_sum_s == pytest.approx(0.001)
    comp = Modeled(cfg=None)  # type: ignore[arg-type]
    comp.wait(0.0)
    assert comp.waits.n == 0, "a wait for nothing is not a wait"


class _Line:
    """The part of a DelayLine a Queue sends its verdicts through: a real socket."""

    def __init__(self) -> None:
        self.sock, self.peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.seq = 0


def test_a_late_release_is_measured_as_late():
    line = _Line()
    q = delayline.Queue(line, 0, 0.010)  # type: ignore[arg-type]
    due = time.monotonic()
    q.pending.append((due, 1))
    q.release(due + 0.012)  # released 12 ms after its due time
    st = line.peer.recv(4096)
    assert st, "a verdict went out"
    assert q.released == 1 and q.lag_sum == pytest.approx(0.012) and q.lag_max == pytest.approx(0.012)


def test_lag_over_the_run_is_the_difference_of_two_snapshots():
    before = {"0": (100, 0.5, 0.002)}
    after = {"0": (300, 0.9, 0.004), "1": (50, 0.1, 0.001)}
    mean, worst = lag_over(before, after)
    assert mean == pytest.approx((0.4 + 0.1) / 250) and worst == 0.004


def test_drops_are_counted_on_root_qdiscs_only():
    text = ('[{"kind":"htb","handle":"1:","root":true,"drops":7},'
            '{"kind":"bfifo","handle":"10:","parent":"1:10","drops":7},{"kind":"netem","root":true,"drops":2}]')
    assert qdisc_drops(text) == 9
    assert qdisc_drops("") == 0


def _health(late_ms: float, lag_ms: float = 0.0, steal: float = 0.0, drops: int = 0) -> Health:
    h = Health(steal_share=steal)
    h.waits["h0"] = WaitTotals(100, 100 * late_ms / 1e3, 2 * late_ms / 1e3, 0.0)
    h.lag_mean_s["a-b"] = lag_ms / 1e3
    h.rtt_s["a-b"] = 0.040
    h.drops["a-b"] = drops
    return h


def test_a_timing_error_over_the_budget_marks_the_run_degraded():
    waits, crossings = critical_steps(pp=3, microbatches=8, wan_boundaries=2)
    assert (waits, crossings) == (2 * (8 + 3 - 1) + 1, 2 * (8 + 2 - 1))
    quiet, busy = _health(0.05), _health(2.0)
    b_quiet, b_busy = budget(quiet, 0.5, waits, crossings), budget(busy, 0.5, waits, crossings)
    assert b_busy.waits > b_quiet.waits
    assert verdict(quiet, b_quiet, 0.05) == ""
    why = verdict(busy, b_busy, 0.05)
    assert "budget 5.0%" in why and "late waits" in why


def test_delay_lag_and_steal_count_in_the_budget():
    lagged = _health(0.0, lag_ms=2.0)
    b = budget(lagged, 1.0, 21, 18)
    assert b.delay == pytest.approx(18 * 0.002)  # each crossing released 2 ms late
    assert "delay-line lag" in verdict(lagged, b, 0.03)
    bound = budget(lagged, 1.0, 21, 18, {"a-b": PathLink(transfer_s=0.02, window_bound=True)})
    free = budget(lagged, 1.0, 21, 18, {"a-b": PathLink(transfer_s=0.02, window_bound=False)})
    assert free.delay == pytest.approx(b.delay)
    assert bound.delay == pytest.approx(b.delay + 2 * 0.002 / 0.040 * 18 * 0.02)  # each round trip 2 lags longer
    assert budget(lagged, 1.0, 21, 18, {"c-d": PathLink(0.02, True)}).delay == 0, "a link the plan does not cross"
    stolen = _health(0.0, steal=0.2)
    assert "CPU steal" in verdict(stolen, budget(stolen, 1.0, 21, 18), 0.05)


def test_shaping_drops_mark_the_run_degraded_whatever_the_timing():
    h = _health(0.0, drops=3)
    assert "dropped 3 packets" in verdict(h, budget(h, 1.0, 21, 18), 0.05)


def test_summary_fields_name_every_health_column():
    from testbed.analysis.metrics import HEALTH_COLUMNS
    from testbed.columns import column

    fields = {**summary_fields(_health(1.0), budget(_health(1.0), 1.0, 21, 18)), "timing_budget": 0.05}
    assert set(fields) == set(HEALTH_COLUMNS)
    assert all(column(c) is not None for c in HEALTH_COLUMNS), "every column is documented in testbed/columns.py"
    assert fields["wait_late_ms"] == 1.0 and fields["wait_late_host_ms"] == 1.0


def test_machine_counters_read():
    assert procs_running() >= 0
    assert steal_share([1] * 10, [1] * 10) == 0.0
    assert steal_share([0] * 10, [1, 0, 0, 0, 0, 0, 0, 1, 0, 0]) == 0.5


def test_the_report_and_figure_show_a_degraded_run(tmp_path):
    from testbed.report import render

    rows = []
    for run_id, err, why in (("p00-pp-wan", 0.02, ""), ("p00-atlas", 0.09, "timing error up to 9.0% > budget 5.0%")):
        rows.append({"run_id": run_id, "source": "emu", "scheduler": run_id[4:], "iteration_s": 1.0,
                     **summary_fields(_health(1.0), None), "timing_error": err, "timing_budget": 0.05,
                     "degraded": why, "status": "ok", "sweep": ""})
    pd.DataFrame(rows).to_csv(tmp_path / "summary.csv", index=False)
    pd.DataFrame([{"run_id": "p00-atlas", "scheduler": "atlas", "metric": "iteration_s", "sim": 1, "emu": 1.1,
                   "rel_error": -0.09, "degraded": ""}]).to_csv(tmp_path / "validation.csv", index=False)
    from testbed.figures.health import timing_health

    png = timing_health(pd.read_csv(tmp_path / "summary.csv"), pd.read_csv(tmp_path / "validation.csv"),
                        tmp_path / "timing_health.png")
    assert png.stat().st_size > 0
    html = render(tmp_path, [png], [])
    assert "Timing health" in html and "1 of 2 emulated runs degraded" in html


def test_a_senders_wake_up_is_measured_and_counts_in_the_budget():
    from testbed.runtime.worker import Striped

    wakes = WaitStats()
    a, b = socket.socketpair()
    done = threading.Event()
    Striped([a], wakes).send(b"a", 0, 0, 1000, lambda t0, t1: done.set())
    assert done.wait(5)
    assert wakes.n == 1 and wakes.late_max_s >= 0
    h = _health(0.0)
    h.wakes = WaitTotals(10, 10 * 0.002, 0.004, 0.0)  # threads resumed 2 ms late on average
    b_ = budget(h, 1.0, 21, 18)
    assert b_.wakes == pytest.approx(2 * 18 * 0.002) and "late wake-ups" in verdict(h, b_, 0.05)
    a.close()
    b.close()

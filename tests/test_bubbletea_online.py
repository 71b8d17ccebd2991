"""The online BubbleTea planner of emulated runs: windows learnt from live iterations, re-planning."""

from __future__ import annotations

import pytest

from testbed.bubbletea.online import OnlinePlanner, WindowModel, intersect, subtract
from testbed.bubbletea.scheduler import GroupCost
from testbed.bubbletea.trace import Request


def test_window_algebra():
    assert intersect([(0, 10), (20, 30)], [(5, 25)]) == [(5, 10), (20, 25)]
    assert subtract([(0, 10)], [(2, 3), (5, 6)]) == [(0, 2), (3, 5), (6, 10)]
    assert subtract([(0, 10)], [(-1, 11)]) == []


def test_a_window_is_predicted_only_where_it_recurred():
    m = WindowModel(history=2)
    m.observe("s0r0", [(0.10, 0.30)])
    m.observe("s0r0", [(0.12, 0.28), (0.5, 0.6)])  # a window seen once is not trusted
    assert m.predict("s0r0") == [(0.10, 0.28)]  # opens at the earliest start, closes at the earliest end
    m.observe("s0r0", [(0.11, 0.29), (0.5, 0.6)])  # the first iteration leaves the history
    assert m.predict("s0r0") == [(0.11, 0.28), (0.5, 0.6)]


def _planner(reqs, *, slo=1.0, guard=0.005, tokens_s=1e-4):
    cost = GroupCost(lambda n: n * tokens_s, lambda d, k: k * tokens_s, 100_000)
    return OnlinePlanner(reqs, {"s0r0": ("a", cost), "s1r0": ("b", cost)}, homes={q.request_id: "a" for q in reqs},
                         kv_time=lambda s, d, n: 0.0, guard_s=guard, slo_s=slo)


def test_jobs_fit_their_predicted_window_less_the_guard_and_overflow_goes_to_the_pool():
    reqs = [Request(i, 1.0 + 0.001 * i, 500, 10) for i in range(40)]  # 40 x 50 ms of prefill, all at once
    p = _planner(reqs)
    for _ in range(2):
        p.observe({"s0r0": [(0.0, 0.2)], "s1r0": [(0.5, 0.7)]}, 1.0)
    jobs = p.plan(1, 1.0)
    assert jobs
    for w, js in jobs.items():
        lo, hi = (0.0, 0.2) if w == "s0r0" else (0.5, 0.7)
        for j in js:
            assert lo + 0.005 - 1e-9 <= j.offset_s and j.offset_s + j.duration_s <= hi - 0.005 + 1e-9
            assert j.latest_s >= j.offset_s - 1e-9 and j.latest_s + j.duration_s <= hi - 0.005 + 1e-9
    pooled = [d for d in p.decided.values() if d.pool_join_s is not None]
    assert pooled and all(d.pool_join_s == pytest.approx(d.request.arrival_s) for d in pooled)
    served = [d for d in p.decided.values() if d.worker]
    assert all(d.request.arrival_s + 1.0 >= 1.0 + max(j.offset_s + j.duration_s for j in d.jobs) - 1e-9
               or d.jobs[0].iteration > 1 for d in served)  # within the SLO


def test_a_skipped_job_is_replanned_and_never_before_the_skip():
    reqs = [Request(0, 1.0, 500, 10)]
    p = _planner(reqs, slo=5.0)
    for _ in range(2):
        p.observe({"s0r0": [(0.0, 0.2)], "s1r0": []}, 1.0)
    first = p.plan(1, 1.0)["s0r0"][0]
    assert first.iteration == 1
    p.skipped(0, 1.15)  # the worker could not start it in time
    p.observe({"s0r0": [(0.0, 0.2)], "s1r0": []}, 1.0)
    again = p.plan(2, 2.0)["s0r0"][0]
    assert again.iteration == 2 and 2.0 + again.offset_s >= 1.15


def test_no_windows_yet_means_no_jobs():
    p = _planner([Request(0, 0.0, 100, 1)])
    assert p.plan(0, 0.0) == {}


def test_the_service_and_the_worker_need_only_the_standard_library():
    """Their images carry the project and no third-party packages (containers/bubbletea, containers/worker)."""
    import subprocess
    import sys

    code = ("import sys\nfor m in ('numpy', 'pydantic', 'pandas', 'torch'): sys.modules[m] = None\n"
            "import testbed.runtime.bubbletea_service as s, testbed.runtime.worker\n"
            "cfg = {'model': 'llama2-7b', 'layers': 32, 'guard_s': 0.001, 'slo_s': 2.0, 'calibration': None,\n"
            "       'workers': {'s0r0': {'dc': 'a', 'gpu': 'H100', 'tp': 1, 'max_tokens': 10000}},\n"
            "       'kv': {'a|a': [0.0001, 1e10]}, 'kv_bytes_per_token': 1000.0,\n"
            "       'requests': [[0, 0.0, 100, 10, 'a']]}\n"
            "assert s.Service(cfg).planner.workers['s0r0'][1].full(1000) > 0\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr

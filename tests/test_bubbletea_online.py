"""The online BubbleTea planner of emulated runs: windows learnt from live iterations, re-planning."""

from __future__ import annotations

from collections import deque

import pytest

from testbed.bubbletea.online import OnlinePlanner, WindowModel, intersect, subtract
from testbed.bubbletea.scheduler import GroupCost
from testbed.bubbletea.trace import Request


def test_window_algebra():
    assert intersect([(0, 10), (20, 30)], [(5, 25)]) == [(5, 10), (20, 25)]
    assert subtract([(0, 10)], [(2, 3), (5, 6)]) == [(0, 2), (3, 5), (6, 10)]
    assert subtract([(0, 10)], [(-1, 11)]) == []


def test_a_gap_is_predicted_by_its_index_at_its_median_length_less_the_measured_margin():
    m = WindowModel(history=3)
    m.observe("s0r0", [(0, 0.0, 0.5)], warmup=True)  # the warm-up teaches nothing once a steady iteration is in
    m.observe("s0r0", [(0, 0.10, 0.30), (4, 0.5, 0.6)])
    assert m.margin_s == 0.0  # nothing scored yet
    m.observe("s0r0", [(0, 0.14, 0.32)])  # gap 4 absent: it counts as length 0
    assert m.errors["s0r0"][-1] == pytest.approx([0.02, 0.1])  # predicted 0.2 and 0.1
    assert m.lengths("s0r0") == pytest.approx({0: 0.19, 4: 0.05})  # medians of (0.2, 0.18) and (0.1, 0)
    m.observe("s0r0", [(0, 0.30, 0.48), (4, 0.5, 0.6)])  # gap 0 opens late: its length is what recurs
    assert m.errors["s0r0"][-1] == pytest.approx([0.01, -0.05])
    assert m.lengths("s0r0") == pytest.approx({0: 0.18, 4: 0.1})
    m.quantile = 0.5
    assert m.margin_s == pytest.approx(0.01)  # the median of (-0.05, 0.01, 0.02, 0.1)
    m.observe("s0r0", [(0, 0.12, 0.27), (4, 0.5, 0.6)])  # gap 0 is 0.03 shorter than predicted
    (g0, a0, b0), (g4, a4, b4) = m.predict_gaps("s0r0")
    assert (g0, g4) == (0, 4)
    margin = m.margin_s  # the median of (-0.05, 0, 0.01, 0.02, 0.03, 0.1)
    assert margin == pytest.approx(0.01)
    assert a0 == pytest.approx(0.14) and b0 - a0 == pytest.approx(0.18 - margin)  # median opening and length
    assert b4 - a4 == pytest.approx(0.1 - margin)


def test_a_gap_seen_in_too_few_iterations_is_not_predicted():
    m = WindowModel(history=3)
    m.observe("s0r0", [(2, 0.1, 0.2)])
    m.observe("s0r0", [])
    m.observe("s0r0", [])
    assert m.predict("s0r0") == [] and m.lengths("s0r0") == {}


def _planner(reqs, *, slo=1.0, guard=0.005, tokens_s=1e-4, last_iteration=None):
    cost = GroupCost(lambda n: n * tokens_s, lambda d, k: k * tokens_s, 100_000)
    return OnlinePlanner(reqs, {"s0r0": ("a", cost), "s1r0": ("b", cost)}, homes={q.request_id: "a" for q in reqs},
                         kv_time=lambda s, d, n: 0.0, guard_s=guard, slo_s=slo, last_iteration=last_iteration)


def test_jobs_fit_their_predicted_window_less_the_guard_and_overflow_goes_to_the_pool():
    reqs = [Request(i, 1.0 + 0.001 * i, 500, 10) for i in range(40)]  # 40 x 50 ms of prefill, all at once
    p = _planner(reqs)
    for _ in range(2):
        p.observe({"s0r0": [(0, 0.0, 0.2)], "s1r0": [(3, 0.5, 0.7)]}, 1.0)
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
        p.observe({"s0r0": [(0, 0.0, 0.2)], "s1r0": []}, 1.0)
    first = p.plan(1, 1.0)["s0r0"][0]
    assert first.iteration == 1
    p.skipped(0, 1.15)  # the worker could not start it in time
    p.observe({"s0r0": [(0, 0.0, 0.2)], "s1r0": []}, 1.0)
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
            "import testbed.bubbletea.service as s, testbed.runtime.worker\n"
            "cfg = {'model': 'llama2-7b', 'layers': 32, 'guard_s': 0.001, 'slo_s': 2.0, 'calibration': None,\n"
            "       'workers': {'s0r0': {'dc': 'a', 'gpu': 'H100', 'tp': 1, 'max_tokens': 10000}},\n"
            "       'kv': {'a|a': [0.0001, 1e10]}, 'kv_bytes_per_token': 1000.0,\n"
            "       'requests': [[0, 0.0, 100, 10, 'a']]}\n"
            "assert s.Service(cfg).planner.workers['s0r0'][1].full(1000) > 0\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_a_worker_starts_a_job_only_if_it_fits_what_remains_of_its_live_gap():
    from testbed.bubbletea.worker_side import PrefillClient

    c = PrefillClient("s0r0", None, "modeled")
    c.begin(1, 100.0)
    c.gaps, c.guard = {0: 0.050, 3: 0.200}, 0.002
    #          request, chunk, chunks, not before, duration, tokens, cached, home
    c.jobs = [[7, 0, 1, 0.0, 0.060, 900, 0, "a"], [8, 1, 2, 0.0, 0.010, 100, 100, "a"],
              [9, 0, 1, 0.030, 0.010, 100, 0, "a"], [10, 0, 1, 0.0, 0.020, 300, 0, "a"]]
    assert c._pick(100.0) == (c.jobs, 3)  # 7 is too long for gap 0, 8 waits for its first chunk, 9 has not arrived
    c.jobs.pop(3)
    assert c._pick(100.030) == (c.jobs, 2)  # now 9 has, and fits (0.030 + 0.010 <= 0.050 - 0.002)
    c.jobs.pop(2)
    assert c._pick(100.040) is None  # nothing fits the 8 ms left of gap 0
    c.busy("fwd", 100.040, 100.050)
    c.busy("fwd", 100.050, 100.060)
    assert c._pick(100.061) is None  # gap 2 is not predicted: nothing runs there
    c.busy("fwd", 100.061, 100.100)  # gap 3 opens late, at 100.100: its length counts from there
    assert c._pick(100.250) is None  # 0.250 + 0.060 > 0.100 + 0.200 - 0.002
    assert c._pick(100.230) == (c.jobs, 0)
    c.jobs.pop(0)
    c.finished.add((8, 0))
    assert c._pick(100.285) == (c.jobs, 0)  # its first chunk is done


def test_modeled_prefill_does_not_add_up_late_wake_ups_but_moves_by_a_pause():
    import time

    from testbed.bubbletea.worker_side import PrefillClient

    c = PrefillClient("s0r0", None, "modeled")
    c.layers = 4
    t0 = time.monotonic()
    steps = c._sleeps(0.040)
    next(steps)
    time.sleep(0.015)  # a late wake-up: the next steps catch up
    next(steps)
    next(steps)
    assert time.monotonic() - t0 < 0.040
    time.sleep(0.030)  # a pause
    steps.send(True)
    with pytest.raises(StopIteration):
        next(steps)
    assert time.monotonic() - t0 >= 0.040 + 0.030 - 0.015


def test_the_margin_widens_while_training_waits_past_the_budget_and_narrows_while_it_does_not():
    from testbed.bubbletea.knee import SLOWDOWN_MAX

    p = _planner([Request(0, 0.0, 100, 1)])
    q0 = p.windows.quantile
    p.overran(1.0, 1.0)
    assert p.windows.quantile == q0  # no margin measured yet: nothing to act on
    p.windows.errors["s0r0"] = deque([[0.01]])
    p.overran(2 * SLOWDOWN_MAX * 1.0, 1.0)  # training waited twice the budget of a 1 s iteration
    assert p.windows.quantile > q0
    for _ in range(20):
        p.overran(0.0, 1.0)
    assert p.windows.quantile == pytest.approx(0.5)  # never below the median
    for _ in range(20):
        p.overran(1.0, 1.0)
    assert 0.98 <= p.windows.quantile < 1.0


def test_a_job_run_early_frees_its_time_in_its_own_iteration():
    reqs = [Request(i, 1.0, 500, 10) for i in range(12)]  # 12 x 50 ms, only 2 x 150 ms per iteration
    p = _planner(reqs, slo=5.0)
    for _ in range(3):
        p.observe({"s0r0": [(0, 0.0, 0.16)], "s1r0": [(0, 0.5, 0.66)]}, 1.0)
    p.plan(1, 1.0)
    nxt = p.jobs_for(2)
    w, js = next(iter(nxt.items()))
    assert not any(b.gpu == w and b.end_s - b.start_s >= js[0].duration_s for b in p._bubbles(2, 2.0, 1.0, 1))
    p.ran_early(js[0].request_id, js[0].chunk)  # a worker had room for it in iteration 1
    assert js[0] not in p.jobs_for(2).get(w, [])
    busy = [(j.offset_s, j.offset_s + j.duration_s) for j in p.jobs_for(2).get(w, [])]
    free = p._bubbles(2, 2.0, 1.0, 1)
    assert any(b.gpu == w and b.end_s - b.start_s >= js[0].duration_s for b in free)
    assert all(not (a < b2 and a2 < b) for a, b in busy for a2, b2 in busy if (a, b) != (a2, b2))


def test_a_worker_runs_the_next_iterations_jobs_only_where_none_of_its_own_fits():
    from testbed.bubbletea.worker_side import PrefillClient

    c = PrefillClient("s0r0", None, "modeled")
    c.begin(1, 100.0)
    c.gaps, c.guard = {0: 0.100}, 0.0
    c.jobs = [[1, 0, 1, 0.0, 0.080, 900, 0, "a"]]
    c.standby = [[2, 0, 1, 0.0, 0.030, 300, 0, "a"]]
    assert c._pick(100.0) == (c.jobs, 0)
    assert c._pick(100.030) == (c.standby, 0)  # the own job no longer fits; the next iteration's does


def test_a_worker_counts_how_long_training_waited_for_prefill():
    from testbed.bubbletea.worker_side import PrefillClient

    c = PrefillClient("s0r0", None, "modeled")
    c.begin(1, 100.0)
    c.busy("prefill", 100.010, 100.052)  # paused late: the input was in at 100.050
    c.busy("recv", 100.0, 100.050)
    c.busy("fwd", 100.052, 100.060)
    assert c.overrun == pytest.approx(0.002)
    c.busy("recv", 100.0, 100.070)
    c.busy("fwd", 100.070, 100.080)  # no prefill in between: no wait
    c.busy("prefill", 100.080, 100.100)  # in the gap before the next op; the input after it was in at 100.090,
    c.busy("recv", 100.0, 100.090)
    c.busy("fwd", 100.100, 100.110)
    c.busy("recv", 100.0, 100.095)  # and the next op's too: that op did not wait for prefill
    c.busy("fwd", 100.110, 100.120)
    assert c.overrun == pytest.approx(0.002 + 0.010)


def test_prefill_in_the_tail_stops_at_its_predicted_end_and_resumes_in_the_next_iteration():
    import time

    from testbed.bubbletea.worker_side import PrefillClient

    c = PrefillClient("s0r0", None, "modeled")
    c.layers = 8
    c.begin(1, time.monotonic())
    c.gaps, c.guard = {1: 0.030}, 0.0
    c.jobs = [[5, 0, 1, 0.0, 0.080, 900, 0, "a"]]  # longer than predicted: it starts in gap 0's place
    c.busy("fwd", c.t0, c.t0)
    c.current = (c.jobs.pop(), c._sleeps(0.080), c.t0, 0.0)
    log = []
    t = time.monotonic()
    c.drain(lambda *a: log.append(a))  # the tail (gap 1) opened at the op's end: 30 ms of it are predicted
    assert time.monotonic() - t < 0.070 and c.current is not None  # paused at the tail's end, not run out
    assert log and log[-1][0] == "prefill"
    c.begin(2, time.monotonic())
    c.gaps = {0: 1.0}
    c.run_due(lambda *a: log.append(a))  # the next iteration's first idle time: it finishes there
    assert c.current is None and c.ran and c.ran[0][:2] == [5, 0]


def test_nothing_runs_before_the_iteration_begins_and_a_paused_job_waits_for_a_gap_with_room():
    import time

    from testbed.bubbletea.worker_side import PrefillClient

    c = PrefillClient("s0r0", None, "modeled")
    c.layers = 4
    now = time.monotonic()
    c.begin(3, now + 0.05)  # the go message comes ahead of the iteration's start
    c.gaps = {0: 1.0, 1: 0.004}
    steps = c._sleeps(0.040)
    next(steps)
    c.current = ([5, 0, 1, 0.0, 0.040, 900, 0, "a"], steps, now - 1, 0.01)  # paused last iteration, after a layer
    log = []
    c.run_due(lambda *a: log.append(a))
    assert not log and c._next_start() is None  # before the start: nothing, and nothing else starts meanwhile
    c.begin(4, time.monotonic())
    c.gaps = {0: 0.004}
    c.run_due(lambda *a: log.append(a))  # gap 0 holds 4 ms: not a layer (10 ms) of the paused job
    assert not log and c.current is not None
    c.gaps = {0: 1.0}
    c.run_due(lambda *a: log.append(a))
    assert log and c.current is None and c.ran[0][:2] == [5, 0]


def test_the_service_says_the_iteration_is_over_once_every_worker_is_in_its_tail():
    from testbed.bubbletea.service import Service

    cfg = {"model": "llama2-7b", "layers": 32, "guard_s": 0.001, "slo_s": 2.0, "calibration": None,
           "workers": {w: {"dc": "a", "gpu": "H100", "tp": 1, "max_tokens": 10000} for w in ("s0r0", "s1r0")},
           "kv": {"a|a": [0.0001, 1e10]}, "kv_bytes_per_token": 1000.0, "requests": [[0, 0.0, 100, 10, "a"]]}
    svc = Service(cfg)
    svc.handle({"op": "tail", "worker": "s1r0", "iteration": 3})
    assert svc.handle({"op": "over", "worker": "s1r0", "iteration": 3}) == {"over": False}
    svc.handle({"op": "tail", "worker": "s0r0", "iteration": 3})
    assert svc.handle({"op": "over", "worker": "s1r0", "iteration": 3}) == {"over": True}
    assert svc.handle({"op": "over", "worker": "s1r0", "iteration": 4}) == {"over": False}


def test_once_the_service_says_every_worker_is_in_its_tail_prefill_stays_stopped():
    import queue

    from testbed.bubbletea.worker_side import PrefillClient

    class Link:  # the service's answers, in order
        def __init__(self, answers):
            self.answers = answers

        def ask_later(self, msg):
            q = queue.Queue()
            q.put({"over": self.answers.pop(0)})
            return q

    c = PrefillClient("s0r0", None, "modeled")
    c.link = Link([False, True, False])
    c.over, c.tail_over = None, False
    assert [c._all_in_tail() for _ in range(4)] == [False, True, True, True]  # no new poll lets it resume


def test_a_tail_whose_end_is_signalled_takes_no_margin_and_does_not_widen_the_others():
    m = WindowModel(history=3)
    for tail_len in (0.10, 0.14, 0.02):  # the tail varies with the slowest worker; gap 0 does not
        m.observe("s0r0", [(0, 0.0, 0.05), (9, 0.5, 0.5 + tail_len)], tail=9)
    assert m.margin_s == 0.0  # only gap 0's (exact) predictions were scored
    assert dict((g, b - a) for g, a, b in m.predict_gaps("s0r0")) == pytest.approx({0: 0.05, 9: 0.10})


def _service_iterations(overrun_s: float, tail_wait_s: float, iterations: int = 5):
    """A service with two workers through `iterations` iterations of 1 s, each worker with one 100 ms gap;
    per iteration training waits `overrun_s` for prefill inside the gaps and `tail_wait_s` past its last op."""
    from testbed.bubbletea.service import Service

    cfg = {"model": "llama2-7b", "layers": 32, "guard_s": 0.001, "slo_s": 2.0, "calibration": None,
           "workers": {w: {"dc": "a", "gpu": "H100", "tp": 1, "max_tokens": 10000} for w in ("s0r0", "s1r0")},
           "kv": {"a|a": [0.0001, 1e10]}, "kv_bytes_per_token": 1000.0, "requests": [[0, 0.0, 100, 10, "a"]]}
    svc = Service(cfg)
    for k in range(iterations):
        t0 = 10.0 * k
        for w in cfg["workers"]:
            svc.handle({"op": "jobs", "worker": w, "iteration": k, "t_start": t0})
            svc.handle({"op": "idle", "worker": w, "iteration": k, "gap": 0, "start": t0, "end": t0 + 0.1})
        for w in cfg["workers"]:
            svc.handle({"op": "done", "worker": w, "iteration": k, "t_start": t0, "ops": 5,
                        "overrun": overrun_s / 2, "last_train_end": t0 + 1.0 - tail_wait_s,
                        "last_op_end": t0 + 1.0 - tail_wait_s, "last_end": t0 + 1.0, "ran": [], "skipped": []})
    return svc


def test_the_margin_follows_the_wait_inside_the_gaps_not_in_the_tail():
    """The tail takes no margin (its end is signalled): its wait must not widen the gaps' margin."""
    start = WindowModel.MARGIN_QUANTILE
    tail_only = _service_iterations(overrun_s=0.0, tail_wait_s=0.05)  # 5 % of an iteration, all in the tail
    assert tail_only.planner.windows.quantile <= start  # the gaps cost training nothing: the margin stays narrow
    assert tail_only.waited[3] == pytest.approx([0.0, 0.05])  # both recorded, apart
    in_gaps = _service_iterations(overrun_s=0.05, tail_wait_s=0.0)
    assert in_gaps.planner.windows.quantile > start


def test_the_validation_compares_the_served_share_over_the_requests_both_engines_were_offered():
    from testbed.bubbletea.emulated import served_same_requests

    def rows(source, served):  # requests.csv rows: request_id at 2, in_bubble at 11
        return [("r", source, rid, 0, 0, "", "", 0, 0, 0, 1, s, "a", 0, "", 0) for rid, s in served.items()]

    sim = rows("sim", {0: 1, 1: 1, 2: 0, 3: 1})
    emu = rows("emu", {0: 1, 1: 0, 2: 0, 3: 1, 4: 0, 5: 0})  # a slower run: offered 4 and 5 after the sim's ended
    assert served_same_requests(sim, emu) == (0.75, 0.5, 4)


def test_every_request_not_yet_started_is_placed_again_in_arrival_order():
    """A request whose job was skipped goes before younger requests placed earlier, not behind them."""
    reqs = [Request(0, 1.0, 500, 10), Request(1, 1.01, 500, 10)]  # 50 ms each; one fits a 60 ms gap
    cost = GroupCost(lambda n: n * 1e-4, lambda d, k: k * 1e-4, 100_000)
    p = OnlinePlanner(reqs, {"s0r0": ("a", cost)}, homes={0: "a", 1: "a"}, kv_time=lambda s, d, n: 0.0,
                      guard_s=0.0, slo_s=3.0)
    for _ in range(2):
        p.observe({"s0r0": [(0, 0.9, 0.96)]}, 1.0)
    p.plan(1, 1.0)
    assert (p.decided[0].jobs[0].iteration, p.decided[1].jobs[0].iteration) == (1, 2)
    p.skipped(0, 1.96)  # its gap turned out shorter: not run in iteration 1
    p.observe({"s0r0": [(0, 0.9, 0.96)]}, 1.0)
    p.plan(2, 2.0)
    assert (p.decided[0].jobs[0].iteration, p.decided[1].jobs[0].iteration) == (2, 3)  # 0 first, then 1
    p.ran_early(1, 0)  # request 1's job ran in iteration 2 (standby): it keeps its place
    p.observe({"s0r0": [(0, 0.9, 0.96)]}, 1.0)
    p.plan(3, 3.0)
    assert p.decided[1].jobs[0].iteration == 3 and p.decided[1].jobs[0].early


def test_standby_holds_every_later_iterations_jobs_in_planned_order_less_those_run_early():
    reqs = [Request(i, 1.0 + 0.001 * i, 500, 10) for i in range(4)]  # 50 ms each; one per 60 ms gap
    cost = GroupCost(lambda n: n * 1e-4, lambda d, k: k * 1e-4, 100_000)
    p = OnlinePlanner(reqs, {"s0r0": ("a", cost)}, homes={q.request_id: "a" for q in reqs},
                      kv_time=lambda s, d, n: 0.0, guard_s=0.0, slo_s=5.0)
    for _ in range(2):
        p.observe({"s0r0": [(0, 0.9, 0.96)]}, 1.0)
    p.plan(1, 1.0)
    later = p.jobs_after(1)["s0r0"]
    assert [(j.request_id, j.iteration) for j in later] == [(1, 2), (2, 3), (3, 4)]
    p.ran_early(2, 0)
    assert [j.request_id for j in p.jobs_after(1)["s0r0"]] == [1, 3]


def test_a_wait_in_an_iteration_planned_before_any_margin_was_measured_does_not_move_the_margin():
    """Iterations 1 and 2 are planned with no margin (nothing scored yet): their wait is not the quantile's."""
    svc = _service_iterations(overrun_s=0.05, tail_wait_s=0.0, iterations=3)  # waits in iterations 1 and 2
    assert svc.planner.windows.errors  # a margin is measured by now
    assert svc.planner.windows.quantile == WindowModel.MARGIN_QUANTILE
    assert _service_iterations(overrun_s=0.05, tail_wait_s=0.0, iterations=4).planner.windows.quantile > \
        WindowModel.MARGIN_QUANTILE  # iteration 3 was planned with one, and training waited


def test_nothing_is_planned_past_the_runs_last_iteration():
    """A backlog that would spill into later iterations goes to the pool when planned, in the last iteration."""
    reqs = [Request(i, 1.0 + 0.001 * i, 500, 10) for i in range(40)]
    for last, spills in ((None, True), (1, False)):
        p = _planner(reqs, slo=3.0, last_iteration=last)
        for _ in range(2):
            p.observe({"s0r0": [(0, 0.0, 0.2)], "s1r0": [(3, 0.5, 0.7)]}, 1.0)
        p.plan(1, 1.0)
        later = [j for d in p.decided.values() for j in d.jobs if j.iteration > 1]
        assert bool(later) == spills
        if not spills:
            assert all(d.reason in ("late", "no_bubble") for d in p.decided.values() if d.pool_join_s is not None)

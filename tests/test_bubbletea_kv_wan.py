"""BubbleTea's KV caches as flows on the WAN links (testbed/sim/realised.py, testbed/bubbletea/realised.py):
they share a link's capacity with training, so more KV bytes than a link carries take at least
bytes / capacity, and training slows (fair sharing) or the KV cache waits (lowest priority, Atlas)."""

from __future__ import annotations

import pytest

from testbed.bubbletea.run import kv_wan_metrics
from testbed.bubbletea.scheduler import Placement
from testbed.bubbletea.trace import Request
from testbed.sim.choose import build_plan
from testbed.sim.realised import PrefillJob, realise
from testbed.spec.load import load_experiment
from tests.conftest import ROOT

TINY = 1e-6  # a prefill job this short ships its KV cache at once


def _plan(sched: str):
    (exp, _), = load_experiment(ROOT / "experiments" / "emu-bubbletea.yaml", sets=[f"schedulers=[{sched}]"])
    return build_plan(exp, sched)


def _last_stage_jobs(plan, per_group: int, nbytes: float):
    """KV caches from the last stage's groups to the previous stage's DC: the link its gradients take."""
    s = plan.pp - 1
    home = plan.stage_dc[0][s - 1]
    assert all(plan.stage_dc[r][s] != home for r in range(plan.dp))
    jobs = {f"s{s}r{r}": [PrefillJob(0.0, TINY, float("inf"), 1, (r, c), (home, nbytes)) for c in range(per_group)]
            for r in range(plan.dp)}
    return jobs, (plan.stage_dc[0][s], home)


@pytest.mark.parametrize("sched", ["pp-wan", "atlas"])
def test_more_kv_bytes_than_the_link_carries_take_at_least_bytes_over_capacity(sched):
    plan = _plan(sched)
    base = realise(plan, None, {"": []}).timeline.iteration_s[0]
    jobs, link = _last_stage_jobs(plan, 2, 1e9)
    total = sum(j.kv[1] for js in jobs.values() for j in js)
    cap = plan.links[link].capacity_bytes_s
    assert total / cap > 2 * base  # offered: more than the link carries in the iteration
    sim = realise(plan, None, jobs)
    assert {(d.src, d.dst) for d in sim.kv_done} == {link} and len(sim.kv_done) == 4
    first = min(d.left_s - d.nbytes / plan.links[link].transfer_cap_bytes_s for d in sim.kv_done)
    assert max(d.left_s for d in sim.kv_done) >= total / cap - 1e-9  # the link never carries more than its capacity
    assert first >= 0
    for d in sim.kv_done:
        assert d.ready_s == pytest.approx(d.left_s + plan.links[link].latency_s)
    d = sim.timeline.iteration_s[0]
    if plan.links[link].temporal:  # lowest priority: training never waits for a KV cache, the KV cache waits
        assert d == pytest.approx(base, rel=1e-9)
    else:  # a fair share: the gradients on that link slow down
        assert d > base * 1.001


def test_a_kv_cache_alone_on_a_link_takes_what_kv_transfer_predicts():
    """On a link training does not use (pp-wan: first stage's DC -> last stage's DC) a KV flow runs at its cap."""
    from testbed.bubbletea.run import kv_transfer
    from testbed.spec.experiment import BubbleTeaOptions

    plan = _plan("pp-wan")
    src, dst = plan.stage_dc[0][0], plan.stage_dc[0][-1]
    tokens = 1000
    opts = BubbleTeaOptions(model="llama2-7b")
    per_token = kv_transfer(plan, opts)(src, dst, 1) - plan.links[(src, dst)].latency_s
    nbytes = per_token * plan.links[(src, dst)].transfer_rate_bytes_s * tokens
    sim = realise(plan, None, {"s0r0": [PrefillJob(0.0, 0.01, float("inf"), 4, ("q", 0), (dst, nbytes))]})
    (key, _g, _a, end), = sim.prefill_done
    (kv,) = sim.kv_done
    assert kv.key == key and kv.src == src and kv.dst == dst
    assert kv.ready_s - end == pytest.approx(kv_transfer(plan, opts)(src, dst, tokens), rel=1e-9)


def test_kv_flows_left_at_an_iterations_end_go_on_in_the_next():
    from testbed.bubbletea.realised import KvLedger

    plan = _plan("pp-wan")
    jobs, link = _last_stage_jobs(plan, 1, 2e9)
    cap = plan.links[link].capacity_bytes_s
    ledger = KvLedger()
    first = ledger.realise(plan, None, jobs, 0.0, last=False)
    d0 = first.timeline.iteration_s[0]
    assert first.kv_done == [] and len(ledger.carry) == 2  # cut at the iteration's end
    left = sum(c.nbytes for c in ledger.carry)
    assert 0 < left < 4e9 and 4e9 - left <= cap * d0 * (1 + 1e-9)  # what left by then fits the link's capacity
    assert all(c.started_s < 0 for c in ledger.carry)
    second = ledger.realise(plan, None, {}, d0, last=True)
    assert second.timeline.iteration_s[0] > realise(plan, None, {"": []}).timeline.iteration_s[0]  # still in the way
    assert set(ledger.ready) == {(0, 0), (1, 0)}
    assert max(ledger.ready.values()) >= 4e9 / cap


def test_kv_wan_metrics_count_bubble_served_caches_crossing_the_wan():
    plan = _plan("pp-wan")
    a, b, c = plan.stage_dc[0]

    def served(rid, dc, home, tokens, end, ready):
        p = Placement(Request(rid, 0.0, tokens, 1), home, gpu="s0r0", dc=dc, intervals=[(0.0, end, tokens)],
                      kv_ready_s=ready, fallback=False, end_s=end)
        return p

    pls = [served(0, a, b, 100, 1.0, 1.5), served(1, a, b, 300, 1.0, 2.0), served(2, b, c, 200, 1.0, 1.1),
           served(3, a, a, 900, 1.0, 1.0), Placement(Request(4, 0.0, 5000, 1), c, dc=a)]  # same DC; the pool's
    m = kv_wan_metrics(plan, pls, 1e6, 2.0)
    assert m["kv_wan_bytes"] == 600_000_000 and m["kv_wan_link"] == f"{a}>{b}"
    assert m["kv_wan_gbps"] == pytest.approx(400e6 * 8 / 2.0 / 1e9)
    cap_gbps = plan.links[(a, b)].capacity_bytes_s * 8e-9
    assert m["kv_wan_link_share"] == pytest.approx(m["kv_wan_gbps"] / cap_gbps, rel=1e-5)
    assert m["kv_ship_p50_ms"] == pytest.approx(500.0) and m["kv_ship_p99_ms"] <= 1000.0


def test_the_exact_run_reports_kv_on_the_wan_and_fair_sharing_slows_training():
    """The exact placement realised: KV caches compete with training; pp-wan (fair share) slows, Atlas (KV at the
    lowest priority) does not, and its KV caches take longer to ship than alone."""
    from testbed.runs.simulated import run_experiment

    sets = ["schedulers=[pp-wan+bubbletea,atlas+bubbletea]", "bubbletea.rate_scale=40", "iterations=3",
            "timeline=none"]
    (exp, _), = load_experiment(ROOT / "experiments" / "emu-bubbletea.yaml", sets=sets)
    rows = {r.summary["scheduler"]: r.summary for r in run_experiment([(exp, {})], jobs=1)}
    for row in rows.values():
        assert row["kv_wan_bytes"] > 0 and row["kv_wan_gbps"] > 0 and ">" in row["kv_wan_link"]
    assert rows["pp-wan+bubbletea"]["train_slowdown"] > 0
    assert rows["atlas+bubbletea"]["train_slowdown"] == 0


def test_kv_flows_on_a_fair_shared_link_take_one_share_together():
    """The KV class on a spatial link: all caches together get what one replica's pipe gets (the emulator's one HTB
    class per link), split fairly among them; what they cannot use goes to the others."""
    from testbed.sim.network import Flow, allocate_spatial

    inf = float("inf")
    flows = [Flow(1.0, inf, ()), Flow(1.0, inf, (), weight=2)] + [Flow(1.0, inf, (), group="kv") for _ in range(3)]
    rates = allocate_spatial(400.0, flows)
    assert rates[:2] == [100.0, 100.0]  # the weight-2 flow counts twice: 100 + 2 x 100 + the KV class's 100
    assert rates[2:] == pytest.approx([100 / 3] * 3)
    capped = [Flow(1.0, inf, ()), Flow(1.0, 10.0, (), group="kv"), Flow(1.0, 5.0, (), group="kv")]
    assert allocate_spatial(100.0, capped) == [85.0, 10.0, 5.0]
    assert allocate_spatial(90.0, [Flow(1.0, inf, ()), Flow(1.0, 20.0, ())]) == [70.0, 20.0]  # no class: per flow

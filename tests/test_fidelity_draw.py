"""bench/fidelity.py's draws: the users one (the default) covers what users run (tp 1-4, dp 1-8, links up to
20 Gbit/s, the spec's default hosts as well as one per group), the wide one its first widening (tp 1-2, dp 1-4);
both keep every host's NIC at the bench's LAN rate whatever tp; the narrow one still draws the earlier rounds'
cases."""

import importlib.util
import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def bench():
    spec = importlib.util.spec_from_file_location("fidelity", ROOT / "bench" / "fidelity.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["fidelity"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize(("draw", "tps", "max_dp"), [("users", (1, 2, 4), 8), ("wide", (1, 2), 4)])
def test_the_draw_covers_what_users_run_and_holds_the_hosts_nic_rate(draw, tps, max_dp):
    f = bench()
    rng = random.Random(5)
    cases = [f.random_case(rng, i, 5, None, 3, f.SCHEDULERS, draw) for i in range(200)]
    seen = {(c.params["tp"], c.params["hosts"]) for c in cases}
    assert seen == {(tp, hosts) for tp in tps for hosts in ("default", "per-group")}
    assert {c.params["dp"] for c in cases} == set(range(1, max_dp + 1))
    assert max(max(float(g) for g in str(c.params["wan_gbps"]).split("|")) for c in cases) > 10
    for c in cases:
        w, topo = c.experiment.workload, c.experiment.topology
        assert w.pp * w.dp <= f.DRAW[draw].max_groups
        fastest = max(lk.gbps for lk in topo.links)
        k, base = c.params["scale"], f.choose_scale(fastest)
        assert base <= k <= 2.01 * base  # the fastest link emulated at 100-200 Mbit/s
        for d in topo.dcs:  # a host's NIC (tp GPUs): in real units LAN_MBPS at k = base, or twice the fastest link
            real_mbps = d.intra_gbps * w.tp * 1e3
            assert abs(real_mbps - max(f.LAN_MBPS * base, 2 * fastest * 1e3)) < 1e-3 * real_mbps
            groups = min(d.gpus // w.tp, w.pp * w.dp)  # the most groups this DC can hold
            if f.DRAW[draw].fabric_mbps is not None and real_mbps > 2 * fastest * 1e3 * 1.001:
                assert groups * real_mbps / k <= f.DRAW[draw].fabric_mbps * 1.01  # the emulated fabric in budget
    if draw == "users":  # a DC of 16 groups runs at a larger k than its fastest link asks for
        assert any(c.params["scale"] > 1.5 * f.choose_scale(max(lk.gbps for lk in c.experiment.topology.links))
                   for c in cases)


def test_the_families_are_drawn_across_dcs_and_the_narrow_draw_keeps_its_cases():
    f = bench()
    rng = random.Random(9)
    fam = [f.random_case(rng, i, 9, None, 3, f.FAMILIES) for i in range(20)]
    assert min(c.params["dp"] for c in fam) >= 2
    assert all(c.experiment.workload.diloco.inner_steps == f.DILOCO_INNER_STEPS for c in fam)
    narrow = f.random_case(random.Random(20261203), 0, 20261203, None, 5, f.SCHEDULERS, "narrow")
    # the earlier rounds' draw of this seed's first case (bench/fidelity.py before --draw)
    assert (narrow.params["mfu"], narrow.params["wan_gbps"], narrow.params["tp"]) == (0.06388, "3.495|7.069|2.663", 1)

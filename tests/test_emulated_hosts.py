"""An emulated training run gives every GPU group its own emulated host (runs/emulated.py host_per_group): groups
that share a host share one group's NIC and reach each other unshaped through its loopback, which the simulator
does not model (docs/fidelity.md, "Groups sharing a host")."""

from testbed.plan.lower import host_index
from testbed.runs.emulated import MAX_HOSTS, host_per_group
from testbed.sim.choose import build_plan
from testbed.spec.experiment import Experiment


def experiment(dp: int, hosts: int | None = None, pp: int = 4) -> Experiment:
    dc = {"gpu": "H100", "gpus": 16, "gpus_per_node": 1, "intra_gbps": 100, **({"hosts": hosts} if hosts else {})}
    return Experiment.model_validate({
        "name": "hosts",
        "topology": {"name": "two", "dcs": [{"name": "a", **dc}, {"name": "b", **dc}],
                     "links": [{"between": ["a", "b"], "gbps": 10, "latency_ms": 10}]},
        "workload": {"model": "tiny", "global_batch": 4 * dp, "microbatch": 1, "tp": 1, "pp": pp, "dp": dp},
        "schedulers": ["pp-wan", "atlas"],
    })


def test_every_group_gets_a_host_of_its_own():
    exp = host_per_group(experiment(dp=3), 3)
    for sched in exp.schedulers:
        plan = build_plan(exp, sched, dp=3)
        seen: set[tuple[str, int]] = set()
        for r in range(plan.dp):
            for s in range(plan.pp):
                where = (plan.stage_dc[r][s], host_index(plan, s, r))
                assert where not in seen, f"{sched}: two groups on host {where}"
                seen.add(where)


def test_more_hosts_than_groups_are_kept_and_the_bound_holds():
    exp = experiment(dp=1, hosts=9)
    assert host_per_group(exp, 1) is exp  # 9 hosts already cover every DC's groups
    big = host_per_group(experiment(dp=8, pp=4), 8)  # 32 groups: a DC may hold more than the bound
    assert max(d.hosts for d in big.topology.dcs) == MAX_HOSTS


def test_a_collective_whose_exchanges_do_not_pair_up_is_refused_before_anything_runs():
    """Four replicas over three DCs (2, 1, 1): the workers' hierarchical exchanges across DCs pair shard j with
    shard j, which the DC holding two has and the others do not; refused as not yet, naming the unpaired receive."""
    import pytest

    from testbed.errors import NotYetError
    from testbed.plan.lower import lower
    from testbed.runs.emulated import check_programs, unpaired_exchange

    dc = {"gpu": "H100", "gpus_per_node": 1, "intra_gbps": 100}
    exp = Experiment.model_validate({
        "name": "uneven",
        "topology": {"name": "three", "dcs": [{"name": "a", "gpus": 6, **dc}, {"name": "b", "gpus": 3, **dc},
                                              {"name": "c", "gpus": 3, **dc}],
                     "links": [{"between": [x, y], "gbps": 10, "latency_ms": 10} for x, y in
                               (("a", "b"), ("a", "c"), ("b", "c"))]},
        "workload": {"model": "tiny", "global_batch": 16, "microbatch": 1, "tp": 1, "pp": 3, "dp": 4},
        "schedulers": ["dp-wan-overlap"],
    })
    plan = build_plan(exp, "dp-wan-overlap", dp=4)
    assert sorted(row[0] for row in plan.stage_dc) == ["a", "a", "b", "c"]
    assert "never sends to it" in unpaired_exchange(lower(plan))
    with pytest.raises(NotYetError, match="same number of replicas"):
        check_programs(plan, "modeled")
    even = build_plan(experiment(dp=2), "pp-wan", dp=2)
    assert unpaired_exchange(lower(even)) == ""



def test_atlas_chain_avoids_a_thin_link_between_the_largest_dcs():
    """Two large DCs joined only by a thin link, a smaller one with fat links to both: Atlas goes through the
    smaller DC (a > c > b) rather than over the thin link, and with equal links keeps the largest DCs first."""
    from testbed.plan.placement import atlas_chain
    from testbed.spec.topology import Topology

    def topo(ab_gbps: float, ab_ms: float = 100) -> Topology:
        return Topology.model_validate({"name": "t", "dcs": [
            {"name": "a", "gpu": "H100", "gpus": 64}, {"name": "c", "gpu": "H100", "gpus": 48},
            {"name": "b", "gpu": "H100", "gpus": 64}], "links": [
            {"between": ["a", "b"], "gbps": ab_gbps, "latency_ms": ab_ms}, {"between": ["a", "c"], "gbps": 400,
                                                                         "latency_ms": 5},
            {"between": ["c", "b"], "gbps": 400, "latency_ms": 5}]})

    assert atlas_chain(topo(10), pp=6, tp=4, dp=4)[:3] == ["a", "c", "b"]
    assert atlas_chain(topo(400, 5), pp=6, tp=4, dp=4)[:2] == ["a", "b"]  # two DCs suffice, links alike
    assert atlas_chain(topo(400), pp=6, tp=4, dp=4)[:2] == ["a", "c"]  # the shorter of two alike links

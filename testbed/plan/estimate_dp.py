"""The analytic estimate for the data-parallel families (dp-wan, diloco, streaming-diloco), for ranking layouts.

A layout of these families is whole pipelines inside each DC (`Layout.counts`: replicas per DC of `order`). An
inner step is estimated as the pipeline inside the slowest of its DCs (estimate.py, no WAN hop); the WAN adds
the gradients' (dp-wan) or the outer gradients' (DiLoCo) ring across the DCs:

- dp-wan: every stage's bf16 gradients cross each hop of the DC ring as 2 (D - 1) / D of their bytes, all
  stages at once on the thinnest hop; a stage's buckets go one after another, each ring step a latency, so
  the iteration pays the larger of the bytes at capacity and the buckets' latencies.
- diloco: the whole model's outer gradient (outer_bits per value) over the same ring once per H inner steps.
- streaming-diloco: F fragments, each hidden under tau inner steps; only what a fragment's sync takes beyond
  them shows, F times per H steps.

A hybrid (`Layout.groups`: a pipeline over each group's DCs, dp-wan across the groups) is estimated as its
slowest group's pipeline (estimate.py over the group's chain, its link shared by that group's replicas only)
plus each stage's gradients across the DCs that hold that stage in some group: a link carrying several
stages' rings carries their bytes one after another, different links at once.
"""

from __future__ import annotations

import math

from testbed.costs.models import ModelConfig
from testbed.costs.stage import BF16
from testbed.plan.buckets import bucket_bytes
from testbed.plan.diloco import resolve as resolve_diloco
from testbed.plan.estimate import Estimate, Estimator, Layout
from testbed.plan.groups import stage_counts
from testbed.spec.experiment import Experiment
from testbed.spec.mechanisms import Mechanisms


class FamilyEstimator:
    """Estimates layouts of one data-parallel family (`mech.placement == "dp-wan"`)."""

    def __init__(self, exp: Experiment, model: ModelConfig, mech: Mechanisms):
        self.exp, self.model, self.mech = exp, model, mech
        self.inner = Estimator(exp, model, mech)
        self.diloco = resolve_diloco(mech.outer, exp.workload.diloco) if mech.outer else None
        self._group_est: dict[int, Estimator] = {}  # a hybrid group's pipeline, by its replicas

    def ring(self, order: tuple[str, ...]) -> tuple[float, float]:
        """The DC ring's thinnest hop (bytes/s) and its longest one-way latency (s)."""
        topo = self.exp.topology
        hops = [topo.link(a, b) for a, b in zip(order, order[1:] + order[:1], strict=True) if a != b]
        if any(h is None for h in hops):
            return 0.0, math.inf
        return min(h.gbps * 1e9 / 8 for h in hops), max(h.latency_ms / 1e3 for h in hops)

    def wan_s(self, lay: Layout) -> float:
        """Seconds per iteration the WAN adds to an inner step."""
        D = len(lay.order)
        if D < 2:
            return 0.0
        cap, lat = self.ring(lay.order)
        if cap <= 0:
            return math.inf
        m = self.model
        params = m.layers * m.layer_params() + 2 * m.embedding_params()
        share = 2 * (D - 1) / D
        if self.diloco is None:
            stage_bytes = params * BF16 / lay.pp
            buckets = math.ceil(stage_bytes / bucket_bytes(self.exp.workload.ddp_bucket_params, lay.dp, lay.tp))
            return max(share * params * BF16 / cap, buckets * 2 * (D - 1) * lat)
        d = self.diloco
        sync_s = share * params * d.outer_bits / 8 / cap / d.fragments + 2 * (D - 1) * lat
        return sync_s * d.fragments / d.inner_steps  # the exposed part is set against the inner step in __call__

    def group_pipeline(self, chain: tuple[str, ...], replicas: int, lay: Layout) -> Estimate:
        """One group's pipeline: its `replicas` share its WAN hops, each runs the layout's microbatches."""
        m = self.exp.workload.global_batch // (lay.microbatch * lay.dp)
        est = self._group_est.get(replicas)
        if est is None:
            w = self.exp.workload.model_copy(update={"global_batch": m * lay.microbatch * replicas})
            est = self._group_est[replicas] = Estimator(self.exp.model_copy(update={"workload": w}), self.model,
                                                        self.mech)
        counts = tuple(c for c in stage_counts(len(chain), lay.pp) if c)
        return est(Layout(chain[:len(counts)], counts, lay.tp, lay.pp, replicas, lay.microbatch))

    def hybrid_wan_s(self, lay: Layout) -> float:
        """What each stage's gradients across the groups add: the busiest link's bytes at its capacity, or the
        buckets' ring steps' latencies, whichever is longer."""
        topo, m = self.exp.topology, self.model
        rows = [[d for d, c in zip(g, stage_counts(len(g), lay.pp), strict=True) for _ in range(c)]
                for g in lay.group_dcs()]
        stage_bytes = (m.layers * m.layer_params() + 2 * m.embedding_params()) * BF16 / lay.pp
        buckets = math.ceil(stage_bytes / bucket_bytes(self.exp.workload.ddp_bucket_params, lay.dp, lay.tp))
        load: dict[tuple[str, str], float] = {}
        latency_s = 0.0
        for s in range(lay.pp):
            ring = sorted({row[s] for row in rows}, key=[d.name for d in topo.dcs].index)
            D = len(ring)
            if D < 2:
                continue
            for a, b in zip(ring, ring[1:] + ring[:1], strict=True) if D > 2 else [(ring[0], ring[1])]:
                link = topo.link(a, b)
                if link is None:
                    return math.inf
                key = (min(a, b), max(a, b))
                load[key] = load.get(key, 0.0) + 2 * (D - 1) / D * stage_bytes / (link.gbps * 1e9 / 8)
                latency_s = max(latency_s, buckets * 2 * (D - 1) * link.latency_ms / 1e3)
        return max(max(load.values(), default=0.0), latency_s)

    def hybrid(self, lay: Layout) -> Estimate:
        worst: Estimate | None = None
        for chain, replicas in zip(lay.group_dcs(), lay.counts, strict=True):
            e = self.group_pipeline(chain, replicas, lay)
            if e.problem:
                return e
            if worst is None or e.iteration_s > worst.iteration_s:
                worst = e
        assert worst is not None
        return Estimate(worst.iteration_s + self.hybrid_wan_s(lay), worst.layers, worst.mem_gb)

    def __call__(self, lay: Layout) -> Estimate:
        if lay.groups:
            return self.hybrid(lay)
        worst: Estimate | None = None
        for dc in dict.fromkeys(self.exp.topology.dc(n).gpu for n in lay.order):
            name = next(n for n in lay.order if self.exp.topology.dc(n).gpu == dc)
            e = self.inner(Layout((name,), (lay.pp,), lay.tp, lay.pp, lay.dp, lay.microbatch))
            if worst is None or e.problem or e.iteration_s > worst.iteration_s:
                worst = e
            if e.problem:
                break
        assert worst is not None
        if worst.problem:
            return worst
        wan = self.wan_s(lay)
        d = self.diloco
        if d is not None and d.overlap_steps:  # each fragment's sync hides under tau inner steps
            per_sync = wan * d.inner_steps / d.fragments
            wan = max(0.0, per_sync - d.overlap_steps * worst.iteration_s) * d.fragments / d.inner_steps
        return Estimate(worst.iteration_s + wan, worst.layers, worst.mem_gb)

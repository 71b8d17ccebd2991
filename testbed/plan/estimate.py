"""A fast analytic estimate of one iteration, for ranking thousands of layouts before simulating a few.

It keeps what makes geo-distributed training slow: the busiest WAN link's bytes under the scheduler's
sharing and TCP window caps, the WAN latency in pipeline fill and drain, 1F1B stalls when too few
microbatches are in flight to cover a WAN round trip, and the gradient all-reduce and optimizer
step after the last backward. Formulas: docs/planner.md.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass

import numpy as np

from testbed.costs.models import ModelConfig
from testbed.costs.stage import ADAMW_BYTES_PER_PARAM, BF16, WORKSPACE_GB, LayerCosts, in_flight, layer_costs
from testbed.errors import NotYetError
from testbed.net.units import gbps_to_bytes_s
from testbed.plan.layers import choose_layers, chunk_layers, empty_chunk
from testbed.plan.network import link_plans
from testbed.plan.plan import LinkPlan
from testbed.plan.schedules import check_interleaving
from testbed.spec.experiment import Experiment
from testbed.spec.mechanisms import Mechanisms


@dataclass(frozen=True)
class Layout:
    """One candidate: the DC chain, stages per DC, and the parallelism. A hybrid (`groups` set) is `order` cut into
    groups of those sizes, each a pipeline over its DCs, `counts` its replicas per group."""

    order: tuple[str, ...]
    counts: tuple[int, ...]  # stages per DC of `order` (data-parallel families: replicas per DC; hybrids: per group)
    tp: int
    pp: int
    dp: int
    microbatch: int
    groups: tuple[int, ...] = ()  # hybrids: how many DCs of `order` each group takes, in order

    def stage_dcs(self) -> list[str]:
        return [d for d, c in zip(self.order, self.counts, strict=True) for _ in range(c)]

    def group_dcs(self) -> list[tuple[str, ...]]:
        """A hybrid's groups, each its DCs in pipeline order."""
        ends = list(itertools.accumulate(self.groups))
        return [self.order[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]


@dataclass
class Estimate:
    iteration_s: float  # inf when it does not fit
    layers: list[int]
    mem_gb: float  # the fullest GPU, before the latency warm-up's extra microbatches
    problem: str = ""  # why it does not fit


@dataclass(frozen=True)
class _Stages:
    """What a layout's stages cost, whatever DCs they sit in (shared by layouts with the same GPUs).
    Arrays are per stage."""

    layers: list[int]
    problem: str
    mem_gb: float  # the fullest GPU
    f: np.ndarray
    b: np.ndarray
    free_gb: np.ndarray  # memory left per GPU
    act_gb: np.ndarray  # what one more in-flight microbatch costs per GPU
    grad_bytes: np.ndarray
    opt_s: np.ndarray


@functools.cache
def _pairs(pp: int) -> tuple[np.ndarray, np.ndarray]:
    """Every (s, t) with s <= t < pp, as two index arrays."""
    return np.triu_indices(pp)


def warmup_extra(round_trips: np.ndarray, fb: np.ndarray, busiest_s: float, fits: np.ndarray, m: int) -> np.ndarray:
    """Extra microbatches in flight per stage, as build.latency_warmup: cover the downstream WAN round trips (one
    microbatch per compute time or busiest hop's time, whichever is longer), memory permitting, never increasing."""
    downstream = np.cumsum(round_trips[::-1])[::-1]
    want = np.ceil(downstream / np.maximum(fb, busiest_s))
    return np.maximum(0, np.minimum.accumulate(np.minimum(np.minimum(want, fits), m)))


def interleaved_pipe_s(fb: np.ndarray, d: np.ndarray, wrap_s: float, service_s: float, m: int, v: int) -> float:
    """The pipeline of Megatron's interleaved 1F1B (v model chunks per stage, a chunk a v-th of the stage).

    Steady state with period T per microbatch: a stage runs one chunk forward and one backward per slot of
    T / v. In Megatron's order stage s runs microbatch i's chunk c forward at slot k and its backward
    gap = W_s + (v - 1 - 2c) pp slots later (W_s = 2 (pp - s - 1) + (v - 1) pp warm-up forwards). Between
    them the microbatch must go through every later piece (the rest of chunk c, then chunks c + 1 .. v - 1,
    each crossing the boundaries and the wrap-around from the last stage to the first) and come back:
    (T / v)(gap + 1) >= that path's compute and delays. Inside one chunk, stages s < t have 2 (t - s) slots of
    slack between them (as 1F1B's s..t constraints). A WAN boundary carries v transfers per microbatch. Fill
    and drain cost (pp - 1) / v of a stage's time and the boundaries' delays v times. Equal stages and free
    links give (m + (pp - 1) / v) fb, the simulator's result (tests/test_interleaved.py)."""
    pp = len(fb)
    F = np.concatenate(([0.0], np.cumsum(fb)))  # F[t] - F[s]: stages s..t-1
    D = np.concatenate(([0.0], np.cumsum(d)))  # D[t] - D[s]: boundaries s..t-1
    period = max(float(fb.max()), v * service_s)
    for s in range(pp):
        for c in range(v):
            later = v - 1 - c  # whole chunks after chunk c
            compute = (F[pp] - F[s] + later * F[pp]) / v
            delays = D[pp - 1] - D[s] + later * (wrap_s + D[pp - 1])
            gap = 2 * (pp - s - 1) + (v - 1) * pp + (v - 1 - 2 * c) * pp
            period = max(period, v * (compute + delays) / (gap + 1))
        for t in range(s + 1, pp):
            period = max(period, v * ((F[t + 1] - F[s]) / v + D[t] - D[s]) / (2 * (t - s) + 1))
    return float(fb.sum()) / v + (m - 1 / v) * period + v * float(d.sum()) + (v - 1) * wrap_s


class Estimator:
    """Estimates layouts of one job; caches per-layer costs by (GPU, tp, dp, microbatch) and stage
    costs by the GPUs along the pipeline."""

    def __init__(self, exp: Experiment, model: ModelConfig, mech: Mechanisms):
        if exp.workload.schedule == "zb":
            raise NotYetError("the planner's estimate models 1F1B (plain or interleaved) and GPipe; the zero-bubble "
                              "schedule is not yet searched (simulate the layout with testbed sim)")
        self.exp, self.model, self.mech = exp, model, mech
        self.dc = {d.name: d for d in exp.topology.dcs}
        self._costs: dict[tuple, LayerCosts] = {}
        self._stages: dict[tuple, _Stages] = {}
        self._links: dict[int, dict[tuple[str, str], LinkPlan]] = {}

    def links(self, tp: int) -> dict[tuple[str, str], LinkPlan]:
        """The WAN plan at this tp (a boundary's NCCL connections grow with it)."""
        if tp not in self._links:
            w = self.exp.workload.model_copy(update={"tp": tp})
            self._links[tp] = link_plans(self.exp.model_copy(update={"workload": w}), self.mech)
        return self._links[tp]

    def costs(self, gpu: str, tp: int, dp: int, microbatch: int) -> LayerCosts:
        key = (gpu, tp, dp, microbatch)
        if key not in self._costs:
            w = self.exp.workload
            self._costs[key] = layer_costs(self.model, gpu, tp=tp, dp=dp, microbatch=microbatch, mfu=w.mfu,
                                           recompute=w.recompute, distributed_optimizer=w.distributed_optimizer,
                                           sequence_parallel=w.sequence_parallel_at(tp))
        return self._costs[key]

    def stages(self, segments: tuple[tuple[str, int], ...], tp: int, dp: int, microbatch: int) -> _Stages:
        """Stage costs for `segments` (GPU type, stages) along the pipeline."""
        key = (segments, tp, dp, microbatch)
        got = self._stages.get(key)
        if got is not None:
            return got
        w, model = self.exp.workload, self.model
        segs = [(self.costs(g, tp, dp, microbatch), n) for g, n in segments]
        lc = [c for c, n in segs for _ in range(n)]
        pp = len(lc)
        last = pp - 1
        m = w.global_batch // (microbatch * dp)
        # per stage, as LayerCosts.max_layers and mem_gb compute them one by one
        weight, act, layer_s, fwd, bwd, gpu_bytes, hbm = np.repeat(
            [(c.weight_bytes, c.act_bytes, c.layer_s, c.fwd_s, c.bwd_s, c.gpu.memory_gb * 1e9, c.gpu.hbm_bytes_per_s)
             for c, _ in segs], [n for _, n in segs], axis=0).T
        fl = np.array([in_flight(s, pp, m, w.schedule, w.virtual_stages) for s in range(pp)])
        fixed = np.full(pp, WORKSPACE_GB * 1e9)
        fixed[0] = lc[0].fixed_bytes(True, last == 0)
        fixed[last] = lc[last].fixed_bytes(last == 0, True)
        per_layer = weight + act * fl
        room = np.where(gpu_bytes > fixed, np.floor_divide(gpu_bytes - fixed, per_layer), 0).astype(int).tolist()
        head = [0.0] * pp
        head[last] = lc[last].head_fwd_s + lc[last].head_bwd_s
        layers, fits = choose_layers(model.layers, layer_s.tolist(), head, room, w.layer_split)
        n = np.array(layers, dtype=float)
        mem = (fixed + n * per_layer) / 1e9
        problem = check_interleaving(pp, m, w.virtual_stages)
        if not problem and w.virtual_stages > 1 and (bad := empty_chunk(chunk_layers(layers, w.virtual_stages))):
            problem = f"stage {bad[0]}'s {layers[bad[0]]} layers leave chunk {bad[1]} of {w.virtual_stages} empty"
        if not fits:
            s = int(np.argmax(mem - gpu_bytes / 1e9))
            problem = (f"stage {s} needs {mem[s]:.0f} GB per {lc[s].gpu.name} GPU (it has "
                       f"{lc[s].gpu.memory_gb:.0f} GB)")
        emb = model.embedding_params()
        params = n * model.layer_params()
        params[0] += emb
        params[last] += emb
        f = n * fwd
        b = n * bwd
        f[last] += lc[last].head_fwd_s
        b[last] += lc[last].head_bwd_s
        shard = tp * (dp if w.distributed_optimizer else 1)
        got = _Stages(layers=layers, problem=problem, mem_gb=float(mem.max()), f=f, b=b,
                      free_gb=gpu_bytes / 1e9 - mem, act_gb=n * act / 1e9,
                      grad_bytes=params * BF16, opt_s=params / shard * ADAMW_BYTES_PER_PARAM / hbm)
        self._stages[key] = got
        return got

    def turn_order(self, fb: np.ndarray, wan_s: float) -> str:
        """As build.turn_policy: under `auto`, replica order when the WAN bounds the iteration (Plan.wan_load:
        the busiest WAN direction's bytes per microbatch at capacity, over the slowest stage's fwd + bwd)."""
        order = self.exp.network.turn_order
        if order == "auto":
            return "replica" if wan_s >= fb.max() else "microbatch"
        return order

    def starved(self, f: np.ndarray, b: np.ndarray, burst_f: np.ndarray, burst_b: np.ndarray, busy_f: np.ndarray,
                busy_b: np.ndarray, own_f: np.ndarray, own_b: np.ndarray, wan_s: float) -> float:
        """How late the replica last in a fixed turn order finishes. A stage sends bursts: the warm-up's
        forwards (burst_f[k] from stage k) and the cool-down's backwards (burst_b[k] from stage k + 1); GPipe
        sends all m each way. When the link needs more time for every replica's transfer (busy) than the
        stage takes to make one, the last replica's burst crosses only after the others', back to back, and
        its next stage then computes the whole burst without overlap: per burst transfer it loses the next
        stage's compute less its own transfer time. Other turn orders share the link in rounds instead."""
        if not self.mech.temporal:
            return 0.0
        if self.turn_order(f + b, wan_s) != "replica":
            return 0.0
        f_next = np.concatenate((f[1:], [0.0]))
        lag_f = np.where(busy_f > f, burst_f * np.maximum(0.0, f_next - own_f), 0.0)
        b_next = np.concatenate((b[1:], [0.0]))
        lag_b = np.where(busy_b > b_next, burst_b * np.maximum(0.0, b - own_b), 0.0)
        return float(lag_f.sum() + lag_b.sum())

    def wrap_s(self, lay: Layout, act_bytes: float, links: dict[tuple[str, str], LinkPlan]) -> float | None:
        """Interleaved 1F1B's wrap-around (last stage to first and back, one activation and one gradient):
        inside the DC when both ends are in it, else over the link between the two DCs (None: none)."""
        first, last = lay.order[0], lay.order[-1]
        if first == last:
            d = self.dc[first]
            return 2 * (act_bytes / gbps_to_bytes_s(lay.tp * d.intra_gbps) + d.intra_latency_us / 1e6)
        pair = [links.get(k) for k in ((last, first), (first, last))]
        if None in pair:
            return None
        return sum(lp.latency_s + act_bytes / min(lp.capacity_bytes_s / lay.dp, lp.transfer_cap_bytes_s)
                   for lp in pair)
    def gpu_segments(self, lay: Layout) -> tuple[tuple[str, int], ...]:
        """The pipeline's chain as (GPU type, stages) runs: consecutive DCs with one GPU type make one."""
        segs: list[tuple[str, int]] = []
        for d, n in zip(lay.order, lay.counts, strict=True):
            if segs and segs[-1][0] == self.dc[d].gpu:
                segs[-1] = (self.dc[d].gpu, segs[-1][1] + n)
            else:
                segs.append((self.dc[d].gpu, n))
        return tuple(segs)

    def __call__(self, lay: Layout) -> Estimate:
        w, mech, model, dc = self.exp.workload, self.mech, self.model, self.dc
        pp, tp, dp = lay.pp, lay.tp, lay.dp
        m = w.global_batch // (lay.microbatch * dp)
        st = self.stages(self.gpu_segments(lay), tp, dp, lay.microbatch)
        if st.problem:
            return Estimate(float("inf"), st.layers, st.mem_gb, st.problem)
        f, b = st.f, st.b
        fb = f + b
        A = model.seq_len * lay.microbatch * model.hidden * BF16
        # per stage boundary k -> k+1: delay of the activation (fd) and of the gradient (bd). A boundary's
        # transfers queue on one pipe per replica and direction (n connections, one n W/RTT cap), and a WAN
        # link direction carries every replica's pipe: both bound the time per microbatch (service)
        links = self.links(tp)
        fd, bd = np.empty(pp), np.empty(pp)  # the last entries stay 0: no boundary after the last stage
        intra_bytes_s = np.empty(pp)  # a stage's DP all-reduce bandwidth (one NIC per GPU of its TP group)
        intra_lat = np.empty(pp)
        round_trips = np.zeros(pp)  # WAN round trip at each boundary, for the latency warm-up
        busy_f, busy_b = np.zeros(pp), np.zeros(pp)  # link time per microbatch (all replicas) at WAN boundaries
        own_f, own_b = np.zeros(pp), np.zeros(pp)  # one transfer alone at its full rate there
        service, wan_s, wan_caps, turn, group, s0 = 0.0, 0.0, [], 0.0, dp, 0
        for i, (name, n) in enumerate(zip(lay.order, lay.counts, strict=True)):
            d = dc[name]
            bw, lat = gbps_to_bytes_s(tp * d.intra_gbps), d.intra_latency_us / 1e6
            fd[s0:s0 + n] = bd[s0:s0 + n] = A / bw + lat
            intra_bytes_s[s0:s0 + n], intra_lat[s0:s0 + n] = bw, lat
            s0 += n
            if i + 1 < len(lay.order):
                k, nxt = s0 - 1, lay.order[i + 1]
                for src, dst, out in ((name, nxt, fd), (nxt, name, bd)):
                    lp = links[(src, dst)]
                    alone = lp.transfer_rate_bytes_s
                    busy = dp * A / min(lp.capacity_bytes_s, dp * lp.transfer_cap_bytes_s)
                    wan_s = max(wan_s, dp * A / lp.capacity_bytes_s)
                    service = max(service, busy, A / alone)
                    (busy_f if out is fd else busy_b)[k] = busy
                    (own_f if out is fd else own_b)[k] = A / alone
                    # turns: a replica's transfer goes alone at its full rate; fair sharing: all finish together
                    out[k] = lp.latency_s + (A / alone if mech.temporal else busy)
                    round_trips[k] += lp.latency_s + A / min(lp.capacity_bytes_s / dp, lp.transfer_cap_bytes_s)
                    wan_caps.append(lp.capacity_bytes_s)
                    if out is fd and A / alone > turn:  # as build.stagger_offsets
                        turn, group = A / alone, max(1, math.floor(lp.capacity_bytes_s / alone * (1 + 1e-12)))
        fd[pp - 1] = bd[pp - 1] = 0.0
        if w.virtual_stages > 1:
            wrap = self.wrap_s(lay, A, links)
            if wrap is None:
                return Estimate(float("inf"), st.layers, st.mem_gb, f"no link from {lay.order[-1]} back to "
                                f"{lay.order[0]} for the interleaved schedule's wrap-around")
            pipe = interleaved_pipe_s(fb, fd + bd, wrap, service, m, w.virtual_stages)
        elif w.schedule == "1f1b":
            extra = (warmup_extra(round_trips, fb, max(float(busy_f.max()), float(busy_b.max())),
                                  np.floor(st.free_gb / st.act_gb), m) if mech.warmup and wan_caps else np.zeros(pp))
            # steady state with period T: stage s runs F(i + w_s) then B(i), w_s = in-flight - 1. A microbatch
            # entering stages s..t and coming back must fit in the slack the in-flight counts leave:
            # T (w_s - w_t + 1) >= sum of fb over s..t + the boundary delays between them, for every s <= t
            # (t = last stage: the round trip; t = s + 1 across a WAN hop: only two microbatches of slack)
            d = fd + bd
            w = np.minimum(pp - 1 - np.arange(pp) + extra, m - 1)
            F = np.cumsum(fb)
            D = np.concatenate(([0.0], np.cumsum(d)))
            s_, t_ = _pairs(pp)
            ratio = (F[t_] - F[s_] + fb[s_] + D[t_] - D[s_]) / (w[s_] - w[t_] + 1.0)
            period = max(float(ratio.max()), service)
            burst = self.starved(f, b, w + 1, np.concatenate((w[1:] + 1, [0.0])), busy_f, busy_b, own_f, own_b, wan_s)
            pipe = float(fb.sum() + d.sum()) + (m - 1) * period + burst
        else:
            pipe = (float(f.sum() + fd.sum()) + (m - 1) * max(float(f.max()), service)
                    + float(b.sum() + bd.sum()) + (m - 1) * max(float(b.max()), service))
            pipe += self.starved(f, b, np.full(pp, m), np.full(pp, m), busy_f, busy_b, own_f, own_b, wan_s)
        # after its last backward a stage all-reduces its gradients inside its DC, then steps AdamW
        back = np.concatenate(([0.0], np.cumsum(b + bd)[:-1]))  # how much earlier stage s finishes
        ar = (2 * (dp - 1) / dp * st.grad_bytes / intra_bytes_s + 2 * (dp - 1) * intra_lat) if dp > 1 else 0.0
        end = pipe + float((ar + st.opt_s - back).max())
        if mech.stagger and wan_caps:
            end += (dp - 1) // group * turn  # the last replica starts this much later
        return Estimate(end, st.layers, st.mem_gb)

"""The Plan: everything an engine (simulator or emulated workers) needs to run one iteration.

Plain data. `sim` and `emu` both only turn a Plan into a timeline.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from testbed.net.links import NetPlan
from testbed.net.wire import FRAME_BYTES
from testbed.plan.period import DiLoCoPlan
from testbed.plan.schedules import Action
from testbed.spec.mechanisms import Mechanisms

# (stage, microbatch) pairs in one replica's program: the simulator runs at least one replica's whole program
# (testbed/sim/aggregate.py stands one replica for many, not one microbatch for many), and past this many replicas
# x stages x microbatches it simulates replicas taking turns in blocks; 250,000 holds a 110,592-GPU job
# (dp 864, pp 16, 16 microbatches) simulated replica by replica in seconds (docs/simulator-speed.md)
MAX_STAGE_MICROBATCHES = 250_000


@dataclass(frozen=True)
class LinkPlan:
    """One direction of a WAN link as the plan uses it."""

    src: str
    dst: str
    capacity_bytes_s: float  # bytes/s
    latency_s: float  # one way
    window_bytes: float
    connections: int  # TCP connections per transfer
    temporal: bool  # take turns (True) or share max-min fairly (False)
    turn_bytes: float = FRAME_BYTES  # fair sharing: bytes a replica's flow sends per round-robin turn

    @property
    def rtt_s(self) -> float:
        return 2 * self.latency_s

    @property
    def transfer_cap_bytes_s(self) -> float:
        """What one stage boundary's connections carry at most: n * W / RTT (before the link's capacity)."""
        return float("inf") if self.rtt_s <= 0 else self.connections * self.window_bytes / self.rtt_s

    @property
    def transfer_rate_bytes_s(self) -> float:
        """The rate a transfer gets alone on the link: min(C, n W / RTT)."""
        return min(self.capacity_bytes_s, self.transfer_cap_bytes_s)


@dataclass(frozen=True)
class IntraDC:
    bandwidth_bytes_s: float  # bytes/s per GPU group
    latency_s: float


@dataclass
class Plan:
    run_id: str
    scheduler: str
    mech: Mechanisms
    model: str
    gpu_types: dict[str, str]  # dc -> GPU type
    tp: int
    pp: int
    dp: int
    microbatches: int
    microbatch_size: int
    seq_len: int
    global_batch: int
    stage_dc: list[list[str]]  # [replica][stage]
    fwd_s: list[list[float]]  # [replica][stage], one microbatch
    bwd_s: list[list[float]]
    act_bytes: list[float]  # [stage] -> bytes to stage+1 per microbatch
    grad_bytes: list[float]  # [stage] -> bytes all-reduced across DP
    mem_gb: list[float]  # [stage] peak per GPU
    actions: list[list[Action]]  # [stage]
    links: dict[tuple[str, str], LinkPlan]
    intra: dict[str, IntraDC]
    replica_offset_s: list[float]
    turn_order: list[int]  # replicas in the order they take turns on a WAN link
    turn_policy: str = "replica"  # which transfer goes first on a link under temporal sharing (turn_key)
    sidecar: str = "predictive"  # how turns hand over: from the plan ("predictive") or from notices ("reactive")
    nccl_sockets: int = 1  # TCP connections per NCCL channel (dp-wan's all-reduce rings)
    hosts: dict[str, int] = field(default_factory=dict)  # dc -> emulated hosts (groups go to host r % hosts)
    ideal_wan: bool = False  # lower-bound run: WAN transfers cost what intra-DC ones do
    meta: dict[str, object] = field(default_factory=dict)
    layers: list[int] = field(default_factory=list)  # [stage] -> transformer layers it holds
    optimizer_s: list[list[float]] = field(default_factory=list)  # [replica][stage] AdamW step after the all-reduce
    model_flops_per_seq: float = 0.0  # model FLOPs of training one sequence (no recomputation): MFU's numerator
    # virtual pipeline stages (Megatron's interleaved 1F1B): model chunks per stage, their layers and per
    # microbatch times ([stage][chunk], [replica][stage][chunk]); empty with one chunk per stage
    virtual_stages: int = 1
    chunk_layers: list[list[int]] = field(default_factory=list)
    chunk_fwd_s: list[list[list[float]]] = field(default_factory=list)
    chunk_bwd_s: list[list[list[float]]] = field(default_factory=list)
    # zero-bubble schedule: [replica][stage] the weight-gradient part of bwd_s, run apart as W (empty otherwise)
    wgrad_s: list[list[float]] = field(default_factory=list)
    # [stage] -> (input embedding, output head) gradient bytes it holds: the backward produces the head's first and
    # the embedding's last, with little compute (plan/buckets.py)
    edge_grad_bytes: list[tuple[float, float]] = field(default_factory=list)
    bucket_bytes: float = 0.0  # gradient bytes per group in one overlapped reduce-scatter's bucket (plan/buckets.py)
    diloco: DiLoCoPlan | None = None  # low-communication training: a program is one sync period
    token_efficiency: float = 1.0  # tokens synchronous training needs / tokens this plan needs, for one loss
    net: NetPlan | None = None  # the lowered network `links` were planned on (testbed/plan/network.py)
    # the batch split by speed (testbed/plan/batch_split.py): [replica] -> its microbatches (`microbatches` is their
    # most) and {microbatches: [stage] schedule} for each share; empty: every replica runs `microbatches`, `actions`
    replica_microbatches: list[int] = field(default_factory=list)
    split_actions: dict[int, list[list[Action]]] = field(default_factory=dict)

    @property
    def steps_per_program(self) -> int:
        """Training iterations (optimizer steps) one program runs: H for low-communication training, else 1."""
        return self.diloco.inner_steps if self.diloco is not None else 1

    def microbatches_of(self, r: int) -> int:
        """Replica r's microbatches per iteration (its share of the batch)."""
        return self.replica_microbatches[r] if self.replica_microbatches else self.microbatches

    def actions_of(self, r: int) -> list[list[Action]]:
        """Replica r's [stage] schedule, for its share of the batch."""
        return self.split_actions[self.replica_microbatches[r]] if self.replica_microbatches else self.actions

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def groups(self) -> list[tuple[int, int]]:
        return [(r, s) for r in range(self.dp) for s in range(self.pp)]

    def dcs_used(self) -> list[str]:
        seen: list[str] = []
        for row in self.stage_dc:
            for d in row:
                if d not in seen:
                    seen.append(d)
        return seen

    def dc_ring(self) -> list[str]:
        """The DCs in use, in topology order: dp-wan's all-reduce ring."""
        used = self.dcs_used()
        return [d for d in self.gpu_types if d in used]

    def link(self, src: str, dst: str) -> LinkPlan:
        return self.links[(src, dst)]

    def wan_busiest_s(self) -> float:
        """Time the busiest WAN link direction needs just to carry one iteration's bytes at capacity
        (pipeline neighbours' activations and gradients, or dp-wan's ring all-reduce)."""
        load: dict[tuple[str, str], float] = {}
        if self.mech.placement == "dp-wan":
            ring = self.dc_ring()
            D = len(ring)
            if D > 1:
                for h in zip(ring, ring[1:] + ring[:1], strict=True):
                    load[h] = sum(2 * (D - 1) / D * g for g in self.grad_bytes)
                    if self.diloco is not None:  # the whole model's quantised outer gradient once per H steps
                        load[h] *= self.diloco.outer_bits / 16 / self.diloco.inner_steps
        else:
            for r in range(self.dp):
                row = self.stage_dc[r]
                for s in range(self.pp - 1):
                    if row[s] != row[s + 1]:
                        for h in ((row[s], row[s + 1]), (row[s + 1], row[s])):
                            load[h] = load.get(h, 0.0) + self.act_bytes[s] * self.microbatches
        return max((b / self.links[h].capacity_bytes_s for h, b in load.items()), default=0.0)

    def wan_load(self) -> float:
        """The busiest WAN direction's transfer time over the busiest stage's compute time: above 1 the
        WAN, not the GPUs, bounds the iteration."""
        compute = self.microbatches * max(f + b for row_f, row_b in zip(self.fwd_s, self.bwd_s, strict=True)
                                          for f, b in zip(row_f, row_b, strict=True))
        return self.wan_busiest_s() / compute if compute > 0 else float("inf")

"""A scale model of a data-parallel job across datacenters: DistributedDataParallel (gloo) whose gradient
stands for `--real-mib` MiB of a real model's, divided by the WAN's scale k. Plain torch: runs under
`testbed launch` or torchrun alike.

    sudo .venv/bin/testbed launch experiments/emu-3dc-topology.yaml --out results/ddp-scale \\
        -- python examples/ddp_scale.py --real-mib 64

Scale model: `testbed launch` divides every WAN link's rate and window by k and tells each rank k in
TESTBED_SCALE (1 when unset, as under torchrun). This script divides its gradient by k (the model's
width is chosen so that its parameters hold real-mib / k MiB), so each all-reduce takes the time the real
one would take on the spec's WAN: its measured times are real-world times, with nothing to multiply.

The gradient is all-reduced by a DDP communication hook, hierarchically: reduce to the first rank of
each DC, the DCs' first ranks exchange their sums directly (each WAN direction carries one transfer of
the whole gradient, concurrently), broadcast inside the DC. Ranks come in contiguous blocks per DC (as
testbed launch lays them out). Between steps every rank sleeps --compute-s (standing for compute) and
meets at a barrier, so each all-reduce starts together and the WAN is quiet between them.

When TESTBED_LINKS names the launch's link table and the testbed is importable, rank 0 prints the
simulator's network model of the same all-reduce in real-world bytes (testbed.launch.model) next to the
measured one. Rank 0 writes OUT/ddp_scale.csv (step, allreduce_s, exchange_s, wait_s, real_bytes, scale,
model_allreduce_s), OUT being --out or $TESTBED_OUT. allreduce_s leaves out wait_s, the wait at a
barrier of the DCs' first ranks just before the exchange (a rank that one shared machine ran late is not
the network's time).
"""


import argparse
import csv
import json
import math
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def scale_k() -> float:
    """The emulated WAN's scale k (TESTBED_SCALE; 1 outside testbed launch)."""
    return float(os.environ.get("TESTBED_SCALE", "1"))


class Hierarchical:
    """DDP communication hook: reduce in the DC, direct exchange between DCs, broadcast in the DC."""

    def __init__(self, dcs: list[str], world: int) -> None:
        rank = dist.get_rank()
        names = list(dict.fromkeys(dcs))  # DC order as the ranks come
        self.members = {d: [r for r in range(world) if dcs[r] == d] for d in names}
        self.groups = {d: dist.new_group(m) for d, m in self.members.items()}  # every rank creates every group
        self.dc, self.world = dcs[rank], world
        self.leader = self.members[self.dc][0]
        self.leaders = [m[0] for m in self.members.values()]
        self.leader_group = dist.new_group(self.leaders)
        self.allreduce_s: list[float] = []  # the all-reduce, less the wait at the DCs' barrier
        self.exchange_s: list[float] = []
        self.wait_s: list[float] = []

    def allreduce(self, t: torch.Tensor) -> torch.Tensor:
        """Average `t` over every rank, in place. The DCs' first ranks meet at a barrier before the exchange, so it
        starts together: a rank the machine runs late (one machine runs every rank) is waited for there, and that
        wait is not counted as the all-reduce's."""
        t0, waited = time.perf_counter(), 0.0
        group = self.groups[self.dc]
        if len(self.members[self.dc]) > 1:
            dist.reduce(t, dst=self.leader, group=group)
        if dist.get_rank() == self.leader and len(self.leaders) > 1:
            tb = time.perf_counter()
            dist.barrier(group=self.leader_group)
            t1 = time.perf_counter()
            waited = t1 - tb
            mine = t.clone()
            peers = [r for r in self.leaders if r != self.leader]
            bufs = [torch.empty_like(t) for _ in peers]
            works = [dist.isend(mine, r) for r in peers] + [dist.irecv(b, r) for b, r in zip(bufs, peers, strict=True)]
            for w in works:
                w.wait()
            for b in bufs:
                t += b
            self.exchange_s.append(time.perf_counter() - t1)
        if len(self.members[self.dc]) > 1:
            dist.broadcast(t, src=self.leader, group=group)
        t /= self.world
        self.allreduce_s.append(time.perf_counter() - t0 - waited)
        self.wait_s.append(waited)
        return t


def hierarchical_hook(state: Hierarchical, bucket) -> torch.futures.Future[torch.Tensor]:
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(state.allreduce(bucket.buffer()))
    return fut


def model_allreduce_s(real_bytes: float, dcs: list[str]) -> float:
    """The simulator's network model of the same all-reduce in real-world bytes (NaN without a link table)."""
    path = os.environ.get("TESTBED_LINKS")
    if not path:
        return math.nan
    try:
        from testbed.launch.model import exchange_s
    except ImportError:
        return math.nan
    with open(path) as f:
        table = json.load(f)
    names = list(dict.fromkeys(dcs))
    lan = table["lans"].get(names[0], {})
    lan_s = real_bytes * 8 / (lan["spec_gbps"] * 1e9) if lan and dcs.count(names[0]) > 1 else 0.0
    return 2 * lan_s + exchange_s(table["links"], names, real_bytes)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--real-mib", type=float, default=64.0, help="the real model's gradient, MiB (fp32)")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--compute-s", type=float, default=0.3, help="sleep between steps, standing for compute")
    p.add_argument("--out", default=os.environ.get("TESTBED_OUT", "results/ddp-scale"))
    a = p.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    k = scale_k()
    dcs: list[str] = [""] * world
    dist.all_gather_object(dcs, os.environ.get("TESTBED_DC", "dc0"))
    width = max(1, round(math.sqrt(a.real_mib * 2**20 / k / 4)))  # the scale model: real-mib / k MiB of fp32
    torch.manual_seed(0)
    net = DDP(nn.Linear(width, width, bias=False), bucket_cap_mb=1e6)  # one bucket: one all-reduce per step
    hook = Hierarchical(dcs, world)
    net.register_comm_hook(hook, hierarchical_hook)
    real_bytes = width * width * 4 * k
    if rank == 0:
        print(f"k={k:g} (TESTBED_SCALE): a {width}x{width} layer, {width * width * 4 / 2**20:.3f} MiB of gradient "
              f"standing for {real_bytes / 2**20:.1f} MiB", flush=True)
    x = torch.randn(4, width)
    for _ in range(a.steps):
        time.sleep(a.compute_s)
        dist.barrier()
        net(x).sum().backward()
    dist.barrier()
    if rank == 0:
        model = model_allreduce_s(real_bytes, dcs)
        ex = hook.exchange_s + [math.nan] * (len(hook.allreduce_s) - len(hook.exchange_s))
        rows = [(i, round(s, 6), round(e, 6) if math.isfinite(e) else "", round(w, 6), round(real_bytes), k,
                 round(model, 6) if math.isfinite(model) else "")
                for i, (s, e, w) in enumerate(zip(hook.allreduce_s, ex, hook.wait_s, strict=True))]
        med = statistics.median(hook.allreduce_s[1:] or hook.allreduce_s)  # the first warms the connections
        line = f"all-reduce of {real_bytes / 2**20:.1f} MiB (real-world): median {med:.3f} s over {a.steps - 1} steps"
        if math.isfinite(model):
            line += f"; the simulator's network model: {model:.3f} s ({med / model - 1:+.1%})"
        print(line, flush=True)
        os.makedirs(a.out, exist_ok=True)
        path = os.path.join(a.out, "ddp_scale.csv")
        with open(path + ".tmp", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["step", "allreduce_s", "exchange_s", "wait_s", "real_bytes", "scale", "model_allreduce_s"])
            w.writerows(rows)
        os.replace(path + ".tmp", path)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""A GPT-style model pipelined across datacenters with torch.distributed.pipelining, data parallel
inside each datacenter. Plain torch: runs under `testbed launch` or torchrun alike.

    sudo .venv/bin/testbed launch experiments/emu-3dc-topology.yaml -- python examples/pipeline_gpt.py --steps 20

Layout: ranks come in contiguous blocks per DC (testbed launch and torchrun's node ranks both do
this), so with pp stages and dp = world / pp replicas, rank r holds stage r // dp of replica
r % dp. Stage s of every replica sits in DC s, and replica j's stages are on host j of each DC: the
activations and their gradients cross the WAN, the gradient all-reduce of a stage stays in its DC.

The data is synthetic but learnable (sequences that step through the vocabulary with a per-sequence
stride), so the loss falls within a few steps. The last stage writes OUT/pipeline.csv (step, loss,
iteration_s, scale) where OUT is --out or $TESTBED_OUT; scale is the WAN's k (TESTBED_SCALE, see wan_scale).
"""

from __future__ import annotations

import argparse
import csv
import os
import time

import torch
import torch.distributed as dist
from tiny_gpt import Block, say_scale, wan_scale
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe


class Stage(nn.Module):
    """One pipeline stage: the embedding on the first, its share of blocks, the head on the last."""

    def __init__(self, a, index: int, stages: int) -> None:
        super().__init__()
        torch.manual_seed(1234 + index)  # every replica of a stage starts from the same weights
        self.first, self.last = index == 0, index == stages - 1
        self.embed = nn.Embedding(a.vocab, a.hidden) if self.first else None
        self.pos = nn.Parameter(torch.zeros(a.seq, a.hidden)) if self.first else None
        per, extra = divmod(a.layers, stages)
        self.blocks = nn.ModuleList(Block(a.hidden, a.heads) for _ in range(per + (index < extra)))
        self.norm = nn.LayerNorm(a.hidden) if self.last else None
        self.head = nn.Linear(a.hidden, a.vocab) if self.last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            x = self.embed(x) + self.pos
        for b in self.blocks:
            x = b(x)
        return self.head(self.norm(x)) if self.last else x


def batch(a, replica: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens and next-token targets: each sequence steps through the vocabulary with its own stride."""
    g = torch.Generator().manual_seed(7919 * replica + step)
    n = a.microbatches * a.microbatch_size
    start = torch.randint(0, a.vocab, (n, 1), generator=g)
    stride = torch.randint(1, 4, (n, 1), generator=g)
    toks = (start + stride * torch.arange(a.seq + 1)) % a.vocab
    return toks[:, :-1], toks[:, 1:]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--pp", type=int, default=0, help="pipeline stages (default: one per DC, or 1)")
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=64)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--microbatch-size", type=int, default=4)
    p.add_argument("--schedule", choices=["1f1b", "gpipe"], default="1f1b")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--out", default=os.environ.get("TESTBED_OUT", "results/pipeline"))
    a = p.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dcs = [d for d in os.environ.get("TESTBED_DCS", "").split(",") if d]
    pp = a.pp or len(dcs) or 1
    if world % pp:
        raise SystemExit(f"{world} ranks cannot hold {pp} stages with equal data parallelism")
    dp = world // pp
    stage, replica = rank // dp, rank % dp
    # every rank creates every group, in the same order
    pp_groups = [dist.new_group([s * dp + j for s in range(pp)]) for j in range(dp)]
    dp_groups = [dist.new_group([s * dp + j for j in range(dp)]) for s in range(pp)]

    model = Stage(a, stage, pp)
    pipe = PipelineStage(model, stage, pp, torch.device("cpu"), group=pp_groups[replica])
    loss_fn = nn.CrossEntropyLoss()
    Sched = Schedule1F1B if a.schedule == "1f1b" else ScheduleGPipe
    schedule = Sched(pipe, n_microbatches=a.microbatches,
                     loss_fn=lambda out, y: loss_fn(out.reshape(-1, a.vocab), y.reshape(-1)))
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
    params = list(model.parameters())
    rows: list[tuple[int, float, float]] = []
    k = wan_scale()
    if model.last and replica == 0:
        say_scale(k)
    t_prev = time.perf_counter()
    for step in range(a.steps):
        x, y = batch(a, replica, step)
        opt.zero_grad()
        losses: list[torch.Tensor] = []
        if pp == 1:
            schedule.step(x, target=y, losses=losses)
        elif model.first:
            schedule.step(x)
        elif model.last:
            schedule.step(target=y, losses=losses)
        else:
            schedule.step()
        if dp > 1:  # data parallel inside the DC: one flat all-reduce of the stage's gradients
            grads = [q.grad if q.grad is not None else torch.zeros_like(q) for q in params]
            flat = torch._utils._flatten_dense_tensors(grads)
            dist.all_reduce(flat, group=dp_groups[stage])
            for g, v in zip(grads, torch._utils._unflatten_dense_tensors(flat / dp, grads), strict=True):
                g.copy_(v)
            for q, g in zip(params, grads, strict=True):
                q.grad = g
        opt.step()
        if model.last:
            loss = torch.stack(losses).mean().detach()
            if dp > 1:
                dist.all_reduce(loss, group=dp_groups[stage])
                loss /= dp
            now = time.perf_counter()
            rows.append((step, loss.item(), now - t_prev))
            t_prev = now
            if replica == 0:
                print(f"step {step} loss {loss.item():.4f} iteration {rows[-1][2]:.3f} s", flush=True)
    if model.last and replica == 0:
        os.makedirs(a.out, exist_ok=True)
        path = os.path.join(a.out, "pipeline.csv")
        with open(path + ".tmp", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["step", "loss", "iteration_s", "scale"])
            w.writerows((s, round(v, 6), round(t, 6), k) for s, v, t in rows)
        os.replace(path + ".tmp", path)
        print(f"loss {rows[0][1]:.3f} -> {rows[-1][1]:.3f} over {len(rows)} steps; wrote {path}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
